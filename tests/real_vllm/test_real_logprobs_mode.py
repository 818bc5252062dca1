"""What the recorded logprobs mean, against real vLLM: the default server (raw_logprobs) and a second one started
with --logprobs-mode processed_logprobs, same model, sampled alike (temperature 0.5, top-k 3, one seed)."""

from __future__ import annotations

import re

import pytest

from agentroll.context.provenance import PROCESSED, RAW, mode_warning

from ..conftest import read_records, run_cli
from .conftest import SUMMARY
from .helpers import TOKENIZER, generate, key, logsumexp, manifest, problems

TEMPERATURE, TOP_K, K = 0.5, 3, 4  # K = --logprobs: one rank past what top-k keeps
FLAGS = ("--temperature", str(TEMPERATURE), "--top-k", str(TOP_K), "--logprobs", str(K))
CLAMPED = -9999.0  # vLLM's logprob of a token top-k cut, in processed mode


@pytest.fixture(scope="module")
def shaped(processed_vllm, real_vllm, tmp_path_factory) -> dict[str, tuple]:
    """One run per server, same input, flags and seed: {mode: (stderr, records, manifest)}."""
    path = problems(tmp_path_factory.mktemp("in") / "p.jsonl", 2)
    runs = {}
    for mode, url in ((RAW, real_vllm), (PROCESSED, processed_vllm)):
        out = tmp_path_factory.mktemp(mode)
        proc = generate(url, path, out, *FLAGS, seed=7, max_tokens=12)
        assert proc.returncode == 0, proc.stderr.decode()
        runs[mode] = proc.stderr.decode(), read_records(out), manifest(out)
    return runs


def test_generate_finds_the_servers_logprobs_mode_and_warns_on_raw(shaped):
    warning = mode_warning(RAW, {"temperature": TEMPERATURE, "top_k": TOP_K})
    assert warning and "temperature 0.5, top_k 3" in warning
    for mode, (stderr, records, written) in shaped.items():
        server = written["servers"][-1]
        assert server["logprobs_mode"] == mode and server["api"] == "generate"
        assert records and all(
            r["sampling"]["temperature"] == TEMPERATURE and r["sampling"]["top_k"] == TOP_K for r in records
        )
        # the raw server's logprobs are not those of the distribution sampled from: said, once; not for processed
        assert stderr.count(warning) == (mode == RAW), stderr
        assert ("the recorded logprobs are not those" in stderr) == (mode == RAW)


def doctor_line(url: str, *flags: str) -> str:
    doctor = run_cli("doctor", "--base-url", url, "--tokenizer", TOKENIZER, *flags, timeout=300)
    assert doctor.returncode == 0, doctor.stderr.decode() + doctor.stdout.decode()
    lines = [line for line in doctor.stdout.decode().splitlines() if re.match(r"(ok|warn|fail) +logprobs mode:", line)]
    assert len(lines) == 1, doctor.stdout.decode()
    return lines[0]


def test_doctor_reports_the_servers_logprobs_mode(real_vllm, processed_vllm):
    assert re.match(rf"ok +logprobs mode: {RAW}\b", doctor_line(real_vllm))
    assert re.match(rf"ok +logprobs mode: {PROCESSED}\b", doctor_line(processed_vllm))
    # told the sampling to come, doctor warns about raw logprobs as generate does
    assert re.match(
        rf"warn +logprobs mode: the server returns {RAW} \(values before temperature 0.5\)",
        doctor_line(real_vllm, "--temperature", "0.5"),
    )


def test_processed_logprobs_are_the_sampled_distributions_and_raw_ones_the_models(shaped):
    """Same seed and sampling on both servers: the same tokens. At each position the raw values are the model's
    log_softmax(logits), the processed ones log_softmax(logits / 0.5) over the top 3 (the rest clamped): so
    processed gaps are twice the raw ones, the top 3 hold all the mass, and rank 4 reads -9999."""
    _, raw, _ = shaped[RAW]
    _, processed, _ = shaped[PROCESSED]
    by_key = {key(r): r for r in processed}
    assert set(by_key) == {key(r) for r in raw} and len(raw) == len(processed)
    positions, widest = 0, 0.0
    for r in raw:
        p = by_key[key(r)]
        assert r["prompt_token_ids"] == p["prompt_token_ids"], key(r)
        assert r["response_token_ids"] == p["response_token_ids"], key(r)
        for j in range(len(r["response_token_ids"])):
            (raw_ids, raw_lps), (ids, lps) = ((x["top_token_ids"][j], x["top_logprobs"][j]) for x in (r, p))
            assert len(raw_ids) == len(ids) == K
            assert raw_ids[:TOP_K] == ids[:TOP_K]  # temperature keeps the order
            # top-k 3 sampled: the token is among the 3 most likely, in both distributions, at the same rank
            assert r["response_ranks"][j] == p["response_ranks"][j] <= TOP_K
            assert r["response_logprobs"][j] == raw_lps[r["response_ranks"][j] - 1]
            assert p["response_logprobs"][j] == lps[p["response_ranks"][j] - 1]
            assert lps[TOP_K:] == [CLAMPED] * (K - TOP_K) and raw_lps[TOP_K] > CLAMPED
            assert abs(logsumexp(lps[:TOP_K])) < 1e-4  # renormalized over the top 3
            assert logsumexp(raw_lps) < -1e-3  # raw: the whole vocabulary's distribution, untruncated
            for i in range(1, TOP_K):
                raw_gap = raw_lps[0] - raw_lps[i]
                assert lps[0] - lps[i] == pytest.approx(raw_gap / TEMPERATURE, abs=1e-4), (key(r), j, i)
                widest = max(widest, raw_gap)
            positions += 1
    assert positions and widest > 0.01  # gaps wide enough that a raw value would fail the doubling
    SUMMARY.append(
        f"real vLLM logprobs modes: {RAW} and {PROCESSED} found by generate and doctor; {positions} "
        f"positions at temperature {TEMPERATURE}, top-k {TOP_K}: processed = the sampled distribution"
    )
