"""The sampling mask (`--return-sampling-mask`): the simulator's vLLM 0.32 wire shape and refusals, the per-token
kept sets stored CSR-style in the shard's sidecar and read back, checked by `validate`, shown by `inspect` and
the viewer, and the warning for a truncated run that keeps none."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from agentroll.folder import ShardWriter, read_groups, read_records
from agentroll.folder.masks import pack, unpack, with_counts
from agentroll.inputs import Problem
from agentroll.record.group import Group, annotate
from agentroll.record.schema import Sample
from agentroll.sim.masks import NEEDS_TEMPERATURE, NEEDS_TOP_K
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer
from agentroll.tools.inspect import inspect
from agentroll.tools.validate import validate
from agentroll.tools.view.detail import _tokens
from agentroll.tools.view.tokens import Decoder

from .conftest import TOKENIZER, generations, run_cli
from .teacher_support import teacher_server

TRUNCATED = ("--top-k", "8", "--top-p", "0.9", "--temperature", "0.8")


def serve(problems: Path, **options: Any) -> SimServer:
    server = SimServer(script=Script.from_jsonl(problems), enable_scale_out=True, **options)
    server.start()
    return server


@pytest.fixture
def masking(problems: Path):
    server = serve(problems, return_sampling_mask=True)
    yield server
    server.stop()


def run(server: SimServer, problems: Path, out: Path, *extra: str):
    return run_cli(
        *("generate", str(problems), "-o", str(out), "--base-url", server.url, "--tokenizer", TOKENIZER),
        *("--num-parallel", "2", "--reward", "exact", *extra),
    )


def post(server: SimServer, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        f"{server.url}{path}", data=orjson.dumps(body), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, orjson.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())


def test_the_simulator_sends_masks_on_generate_only_and_refuses_what_vllm_refuses(masking):
    prompt = [1, 2, 3, 4]
    for params, message in (({"temperature": 0.0, "top_k": 5}, NEEDS_TEMPERATURE), ({"temperature": 0.7}, NEEDS_TOP_K)):
        for path, body in (
            ("/inference/v1/generate", {"token_ids": prompt, "sampling_params": {"max_tokens": 4, **params}}),
            ("/v1/completions", {"prompt": prompt, "max_tokens": 4, **params}),
        ):
            status, answer = post(masking, path, body)
            assert status == 400, (path, params)
            assert answer == {"error": {"message": message, "type": "BadRequestError", "param": None, "code": 400}}
    sampling = {"max_tokens": 24, "temperature": 0.7, "top_k": 6, "top_p": 0.8, "logprobs": 6, "seed": 5}
    status, answer = post(masking, "/inference/v1/generate", {"token_ids": prompt, "sampling_params": sampling})
    assert status == 200
    choice = answer["choices"][0]
    mask, ids = choice["sampling_mask"], choice["token_ids"]
    assert len(mask) == len(ids) > 0
    for step, token, entry in zip(mask, ids, choice["logprobs"]["content"], strict=True):
        assert token in step and step == sorted(set(step)) and 1 <= len(step) <= 6
        # the kept set is the best ranked: every listed alternative ranked within it is in it (the simulator's
        # answers are scripted: a token its scorer ranks below the cut takes the set's last place)
        cut = len(step) if entry["rank"] <= len(step) else len(step) - 1
        assert {t["token_id"] for t in entry["top_logprobs"] if t["rank"] <= cut} <= set(step)
    status, answer = post(masking, "/v1/completions", {"prompt": prompt, "max_tokens": 4, "top_k": 6})
    assert status == 200 and "sampling_mask" not in answer["choices"][0]


def test_a_server_without_the_option_sends_null(problems):
    server = serve(problems)
    try:
        body = {"token_ids": [1, 2], "sampling_params": {"max_tokens": 3, "top_k": 4}}
        status, answer = post(server, "/inference/v1/generate", body)
        assert status == 200 and answer["choices"][0]["sampling_mask"] is None
    finally:
        server.stop()


def test_a_top_k_run_keeps_a_mask_per_response_token_holding_the_sampled_one(masking, problems, tmp_path):
    out = tmp_path / "out"
    proc = run(masking, problems, out, *TRUNCATED, "--return-sampling-mask", "--samples-per-prompt", "2", "--seed", "3")
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"--return-sampling-mask" not in proc.stderr  # no warning: the masks are kept
    sent = {
        (tuple(e["request"]["token_ids"]), e["request"]["sampling_params"]["seed"]): e["response"]["choices"][0]
        for e in generations(masking)
    }
    on_disk = [orjson.loads(line) for line in (out / "rollouts-00000.jsonl").read_bytes().splitlines()]
    assert all(set(r["sampling_mask"]) == {"counts", "ids"} for r in on_disk)  # references, not lists
    records = list(read_records(out, routes=True))
    assert len(records) == len(sent)
    steps = 0
    for record in records:
        mask, ids = record["sampling_mask"], record["response_token_ids"]
        assert mask == sent[(tuple(record["prompt_token_ids"]), record["sampling"]["seed"])]["sampling_mask"]
        assert len(mask) == len(ids) and all(t in step for t, step in zip(ids, mask, strict=True))
        steps += len(ids)
    assert steps > 100
    groups = list(read_groups(out, routes=True))
    assert all(isinstance(s.sampling_mask, list) for g in groups for e in g.executions for s in e)
    assert validate(out).ok
    assert orjson.loads((out / "manifest.json").read_bytes())["settings"]["return_sampling_mask"] is True
    # a rescored copy carries the masks into a sidecar of its own
    proc = run_cli("rescore", str(out), "-o", str(tmp_path / "again"), "--reward", "math")
    assert proc.returncode == 0, proc.stderr.decode()
    again = {(r["problem_id"], r["rollout_id"], r["stage"], r["worker"]): r["sampling_mask"] for r in records}
    copied = list(read_records(tmp_path / "again", routes=True))
    assert {(r["problem_id"], r["rollout_id"], r["stage"], r["worker"]): r["sampling_mask"] for r in copied} == again
    assert validate(tmp_path / "again").ok
    # so does a distilled copy, scored by a teacher
    teacher = teacher_server(problems, max_model_len=8192)
    try:
        proc = run_cli("distill", str(out), "-o", str(tmp_path / "taught"), "--teacher", teacher.url)
    finally:
        teacher.stop()
    assert proc.returncode == 0, proc.stderr.decode()
    taught = list(read_records(tmp_path / "taught", routes=True))
    assert all(r["teacher_logprobs"] is not None for r in taught)
    assert {(r["problem_id"], r["rollout_id"], r["stage"], r["worker"]): r["sampling_mask"] for r in taught} == again
    assert validate(tmp_path / "taught").ok


def test_asking_for_masks_needs_top_k_a_server_that_sends_them_and_a_folder(problems, tmp_path):
    plain = serve(problems)
    try:
        proc = run(plain, problems, tmp_path / "a", "--return-sampling-mask")
        assert proc.returncode == 2 and b"--top-k > 0" in proc.stderr
        proc = run(plain, problems, tmp_path / "b", *TRUNCATED, "--return-sampling-mask")
        assert proc.returncode == 4 and b"vLLM with --return-sampling-mask" in proc.stderr
        proc = run(plain, problems, tmp_path / "c", *TRUNCATED, "--return-sampling-mask", "--api", "completions")
        assert proc.returncode == 2 and b"/v1/completions sends no mask" in proc.stderr
        proc = run(plain, problems, "-", *TRUNCATED, "--return-sampling-mask")
        assert proc.returncode == 2 and b"needs an output folder" in proc.stderr
    finally:
        plain.stop()


def test_a_truncated_run_without_masks_warns_once(problems, tmp_path):
    server = serve(problems, return_sampling_mask=True)  # a server that could send them: the run does not ask
    try:
        proc = run(server, problems, tmp_path / "out", *TRUNCATED)
        assert proc.returncode == 0, proc.stderr.decode()
        assert proc.stderr.count(b"without --return-sampling-mask") == 1
        assert b"top_p 0.9 and top_k 8" in proc.stderr
        quiet = run(
            server, problems, tmp_path / "quiet", "--top-k", "8", "--temperature", "1", "--return-sampling-mask"
        )
        assert quiet.returncode == 0 and b"without --return-sampling-mask" not in quiet.stderr
    finally:
        server.stop()


def sample(problem: Problem, worker: int, response: list[int], mask: list[list[int]] | None) -> Sample:
    n = len(response)
    return Sample(
        *(problem.id, problem.content_hash, f"{problem.id}-0", 0, 1, "solver", worker, "p", [1, 2, 3], "r"),
        response_token_ids=response,
        response_logprobs=[-0.5] * n,
        loss_mask=[1] * n,
        status="completed",
        finish_reason="stop",
        stop_reason=None,
        content="c",
        raw_reward=1.0,
        reward=1.0,
        label="1",
        model="m",
        endpoint="e",
        latency_s=0.1,
        attempts=1,
        sampling_mask=mask,
    )


def group(pid: str, masks: list[list[list[int]] | None]) -> Group:
    problem = Problem(id=pid, prompt=f"problem {pid}", label="1", metadata={}, line=1)
    samples = []
    for worker, mask in enumerate(masks):
        response = [step[len(step) // 2] for step in mask] if mask else [5, 6]
        samples.append(sample(problem, worker, response, mask))
    for s in samples:
        s.rollout_size = len(samples)
    annotate([samples], [0.0])
    return Group(problem, [samples])


WIDE = [[3, 9, 70000], [4], list(range(100, 400))]  # an id past 65535, a single survivor, a wide step


def write(folder: Path, groups: list[Group]) -> ShardWriter:
    writer = ShardWriter(folder, {"model": "m", "samples_per_prompt": 1})
    writer.open()
    for g in groups:
        writer.commit(g)
    return writer


def test_masks_round_trip_csr_in_the_sidecar_beside_records_without_one(tmp_path):
    counts, ids = pack(WIDE)
    assert counts.dtype.name == "uint16" and ids.dtype.name == "uint32" and counts.tolist() == [3, 1, 300]
    assert unpack(counts, ids) == WIDE
    write(tmp_path, [group("a", [WIDE, None, [[7]]]), group("b", [None])]).close(complete=True)
    by = {(r["problem_id"], r["worker"]): r["sampling_mask"] for r in read_records(tmp_path, routes=True)}
    assert by == {("a", 0): WIDE, ("a", 1): None, ("a", 2): [[7]], ("b", 0): None}
    manifest = orjson.loads((tmp_path / "manifest.json").read_bytes())
    assert manifest["shards"][0]["routes"]["file"] == "rollouts-00000.routes"
    assert validate(tmp_path).ok


def test_validate_says_a_sampled_token_outside_its_mask_and_a_mask_of_another_length(tmp_path):
    write(tmp_path, [group("a", [WIDE, [[1, 2], [3]]])]).close(complete=True)
    shard = tmp_path / "rollouts-00000.jsonl"
    lines = shard.read_bytes().splitlines()
    first, second = orjson.loads(lines[0]), orjson.loads(lines[1])
    first["response_token_ids"][1] = 5  # step 1 kept only id 4
    second["response_token_ids"].append(9)
    second["response_logprobs"].append(-1.0)
    second["loss_mask"].append(1)
    shard.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in (first, second)))
    faults = [(f.line, f.message) for f in validate(tmp_path).faults if f.kind == "mask"]
    assert [line for line, _ in faults] == [1, 2]
    assert "response token 1 (id 5) is not in its step's sampling mask (1 ids kept)" in faults[0][1]
    assert "2 steps for 3 response tokens" in faults[1][1]


def test_a_crash_drops_a_group_whose_mask_did_not_reach_the_disk(tmp_path):
    writer = write(tmp_path, [group("a", [WIDE]), group("b", [[[1, 2]] * 4])])
    for f in (writer._file, writer._routes_file):
        f.close()
    assert writer._lock_fd is not None
    os.close(writer._lock_fd)
    side = tmp_path / "rollouts-00000.routes.partial"
    side.write_bytes(side.read_bytes()[:-10])  # b's ids blob cut short
    again = ShardWriter(tmp_path, {"model": "m", "samples_per_prompt": 1})
    assert set(again.open()) == {"a"}
    again.close(complete=True)
    assert [r["sampling_mask"] for r in read_records(tmp_path, routes=True)] == [WIDE]
    assert validate(tmp_path).ok


def test_inspect_and_the_viewer_show_the_tokens_kept_per_step(tmp_path):
    write(tmp_path, [group("a", [WIDE])]).close(complete=True)
    console = Console(record=True, width=200, file=io.StringIO())
    console.print(inspect(tmp_path))
    assert "sampling mask 101.3 kept per step (1-300)" in console.export_text()
    shard = tmp_path / "rollouts-00000.jsonl"
    records = [orjson.loads(line) for line in shard.read_bytes().splitlines()]
    counted = with_counts(shard, records)
    assert counted[0]["sampling_mask"] == [3, 1, 300] and isinstance(records[0]["sampling_mask"], dict)
    tokens = _tokens(counted[0], Decoder(None), set())
    assert tokens["kept"] == [3, 1, 300]


def test_doctor_says_whether_the_server_returns_masks_and_why_not(problems):
    masking, plain, legacy = (
        serve(problems, return_sampling_mask=True),
        serve(problems),
        SimServer(script=Script.from_jsonl(problems)),
    )
    legacy.start()
    try:
        out = {
            name: run_cli("doctor", "--base-url", s.url, "--tokenizer", TOKENIZER, *extra).stdout.decode()
            for name, s, extra in (
                ("masking", masking, ()),
                ("plain", plain, ("--top-p", "0.9")),
                ("plain untruncated", plain, ()),
                ("legacy", legacy, ("--top-k", "5")),
            )
        }
    finally:
        for s in (masking, plain, legacy):
            s.stop()
    assert "ok   sampling mask: returned:" in out["masking"] and "refuses calls without top_k" in out["masking"]
    assert "ok   return_token_ids:" in out["masking"]  # its own call samples with top_k: not refused
    assert "warn sampling mask: not returned: start vLLM with --return-sampling-mask" in out["plain"]
    assert "Model Runner V2" in out["plain"]
    assert "ok   sampling mask: not returned" in out["plain untruncated"]
    assert "warn sampling mask: not available: vLLM sends it on /inference/v1/generate only" in out["legacy"]
