"""A teacher's scores from a real vLLM: the tiny model as its own teacher. Its prompt_logprobs over prompt +
response are the logprobs it sampled with (raw, temperature 1), at the float noise `audit` reports; `audit
--against teacher` recomputes them in transformers; `distill` on another server of the model (one started with
--logprobs-mode processed_logprobs: prompt logprobs stay raw) gives the run's scores again; and the vocabulary
check, the scoring of the top k and the one token of room a scoring call needs hold on the real server."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agentroll.client.wire import score_body

from ..conftest import read_records, run_cli
from .conftest import SUMMARY
from .helpers import TOKENIZER, generate, key, manifest, problems
from .test_real_audit import audit


@pytest.fixture(scope="module")
def taught(real_vllm, tmp_path_factory) -> Path:
    """Three-stage at temperature 1 on the main (raw) server, scored by that same server as its own teacher."""
    inputs = problems(tmp_path_factory.mktemp("in") / "p.jsonl", 4)
    out = tmp_path_factory.mktemp("taught") / "out"
    made = generate(
        real_vllm, inputs, out, "--samples-per-prompt", "2", "--teacher", real_vllm, "--teacher-logprobs", "3"
    )
    assert made.returncode == 0, made.stderr.decode()[-2000:]
    return out


def test_the_model_as_its_own_teacher_scores_what_it_sampled(taught):
    records = read_records(taught)
    gaps = [s - t for r in records for s, t in zip(r["response_logprobs"], r["teacher_logprobs"], strict=True)]
    assert len(gaps) > 100 and max(abs(g) for g in gaps) < 1e-3
    settings = manifest(taught)["settings"]
    assert settings["max_context_len"] == 2047  # the teacher's 2048, less the token a scoring call generates
    figures = manifest(taught)["last_run"]["stats"]["teacher"]
    for record in records:
        ranks, top = record["teacher_ranks"], record["teacher_top_ids"]
        for j, (token, rank) in enumerate(zip(record["response_token_ids"], ranks, strict=True)):
            assert len(top[j]) == 3 and record["teacher_top_logprobs"][j] == sorted(
                record["teacher_top_logprobs"][j], reverse=True
            )
            if rank <= 3:
                assert top[j][rank - 1] == token
                assert record["teacher_top_logprobs"][j][rank - 1] == record["teacher_logprobs"][j]
    solver = figures["solver"]
    SUMMARY.append(
        f"teacher = student (tiny, vLLM CPU float32, prompt_logprobs vs sampled logprobs): {len(gaps)} tokens, mean "
        f"|Δ| {sum(map(abs, gaps)) / len(gaps):.3g}, max |Δ| {max(map(abs, gaps)):.3g}; solver: mean gap "
        f"{solver['mean_gap']:.3g}, KL k3 {solver['kl_k3']:.3g}"
    )
    assert abs(solver["kl_k3"]) < 1e-6


def test_audit_against_the_teacher_passes_at_float_noise(taught, tiny_model):
    code, report = audit(taught, tiny_model, "--against", "teacher")
    assert code == 0, report["failed"]
    overall = report["overall"]
    assert overall["records"] == manifest(taught)["records"] and overall["max_abs"] < 1e-3
    SUMMARY.append(
        f"audit --against teacher (vLLM prompt_logprobs vs transformers float32): {overall['tokens']} tokens, mean "
        f"|Δ| {overall['mean_abs']:.3g}, max |Δ| {overall['max_abs']:.3g}, KL k3 {overall['kl_k3']:.3g}"
    )


def test_distill_on_another_server_gives_the_runs_scores(taught, processed_vllm, tmp_path):
    out = tmp_path / "distilled"
    proc = run_cli(
        "distill", str(taught), "-o", str(out), "--teacher", processed_vllm, "--teacher-logprobs", "3",
        "--tokenizer", TOKENIZER, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    run = {key(r): r for r in read_records(taught)}
    new = {key(r): r for r in read_records(out)}
    assert set(new) == set(run)
    worst = 0.0
    for k, record in new.items():
        assert record["response_token_ids"] == run[k]["response_token_ids"]
        worst = max(
            [worst, *(abs(a - b) for a, b in zip(record["teacher_logprobs"], run[k]["teacher_logprobs"], strict=True))]
        )
    assert worst < 1e-4
    SUMMARY.append(f"distill on the processed-logprobs server vs the run's own teacher scores: max |Δ| {worst:.3g}")


def test_a_scoring_call_needs_one_token_of_room(real_vllm):
    """vLLM 0.32 refuses a prompt of max_model_len tokens with max_tokens 1 (nothing left to generate): the reason
    a teacher's context must exceed the student's by one."""

    def post(ids: list[int]) -> int:
        body = json.dumps(score_body("tiny", [ids], 0)).encode()
        request = urllib.request.Request(f"{real_vllm}/v1/completions", body, {"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    assert post([5] * 2047) == 200
    assert post([5] * 2048) == 400
