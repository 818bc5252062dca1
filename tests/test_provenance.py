"""Every token's provenance against the simulator: both token APIs, sampling per record, top-k, ranks, weight
versions, the logprobs mode found by experiment, MoE routes, and Megatron's policy epochs."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from agentroll.convert.megatron import policy_epochs
from agentroll.folder import read_records as read_with_routes
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, generations, read_records, run_cli


def serve(problems: Path, **options) -> SimServer:
    server = SimServer(script=Script.from_jsonl(problems), **options)
    server.start()
    return server


@pytest.fixture
def native(problems: Path) -> Iterator[SimServer]:
    """A server started like `vllm serve --enable-scale-out`: both APIs."""
    server = serve(problems, enable_scale_out=True)
    yield server
    server.stop()


def run(server: SimServer, problems: Path, out: Path, *extra: str):
    return run_cli(
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        server.url,
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "2",
        "--reward",
        "exact",
        *extra,
    )


def by_call(records: list[dict]) -> dict[tuple, dict]:
    return {(r["problem_id"], r["sample_index"], r["stage"], r["worker"]): r for r in records}


def settings(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())["settings"]


def server_of(out: Path) -> dict:
    """The run's provenance: the last entry of the manifest's `servers`."""
    return json.loads((out / "manifest.json").read_text())["servers"][-1]


def test_auto_uses_the_native_generate_api_and_records_what_it_sent(native, problems, tmp_path):
    out = tmp_path / "out"
    proc = run(native, problems, out, "--seed", "3", "--top-p", "0.9")
    assert proc.returncode == 0, proc.stderr.decode()
    server = server_of(out)
    assert server["api"] == "generate" and server["vllm_version"] == "0.32.0"
    assert server["logprobs_mode"] == "raw_logprobs" and len(server["tokenizer_sha256"]) == 64
    records = read_records(out)
    exchanges = generations(native)
    assert len(exchanges) == len(records) and all("token_ids" in e["request"] for e in exchanges)
    answers = {(tuple(e["request"]["token_ids"]), e["request"]["sampling_params"]["seed"]): e for e in exchanges}
    for record in records:
        exchange = answers[(tuple(record["prompt_token_ids"]), record["sampling"]["seed"])]
        sent, choice = exchange["request"]["sampling_params"], exchange["response"]["choices"][0]
        content = choice["logprobs"]["content"]
        assert record["response_token_ids"] == choice["token_ids"]
        assert record["response_logprobs"] == [c["logprob"] for c in content]
        assert record["response_ranks"] == [c["rank"] for c in content]
        assert (
            record["weight_versions"]
            == choice["weight_versions"]
            == [{"version": "default", "start": 0, "end": len(choice["token_ids"])}]
        )
        assert record["sampling"] == {
            k: sent[k] for k in ("seed", "temperature", "top_p", "top_k", "min_p", "max_tokens")
        }
        assert sent["top_p"] == 0.9 and sent["repetition_penalty"] == 1.0  # every parameter is sent
    assert len({r["sampling"]["seed"] for r in records}) == len(records)  # each call its own seed


def test_both_apis_give_the_same_records_for_the_same_seed(native, problems, tmp_path):
    """The generate API sends no text: the text decoded here must be the one /v1/completions writes."""
    outs = {}
    for api in ("completions", "generate"):
        outs[api] = tmp_path / api
        proc = run(native, problems, outs[api], "--seed", "11", "--api", api, "--logprobs", "3")
        assert proc.returncode == 0, proc.stderr.decode()
        assert server_of(outs[api])["api"] == api
    completions, generate = (by_call(read_records(outs[a])) for a in ("completions", "generate"))
    assert completions.keys() == generate.keys() and len(completions) > 20
    stops = 0
    for key, a in completions.items():
        b = generate[key]
        for field in (
            "prompt_token_ids",
            "response_token_ids",
            "response_logprobs",
            "response",
            "content",
            "finish_reason",
            "stop_reason",
            "raw_reward",
            "top_token_ids",
            "top_logprobs",
        ):
            assert a[field] == b[field], (key, field)
        stops += a["finish_reason"] == "stop"
        assert a["weight_versions"] is None and b["weight_versions"] is not None
        # completions knows a sampled token's rank only when it is among the top K; generate always
        assert all(ra is None or ra == rb for ra, rb in zip(a["response_ranks"], b["response_ranks"], strict=True))
    assert stops > 0  # the stop token is in the ids and out of the text on both


def test_top_k_alternatives_are_the_k_most_likely_in_rank_order(native, problems, tmp_path):
    out = tmp_path / "out"
    assert run(native, problems, out, "--api", "completions", "--logprobs", "4", "--seed", "5").returncode == 0
    answers = {e["request"]["seed"]: e["response"]["choices"][0] for e in generations(native)}
    records = read_records(out)
    assert len(answers) == len(records)
    for record in records:
        choice = answers[record["sampling"]["seed"]]
        assert len(record["top_token_ids"]) == len(record["response_token_ids"]) == len(record["top_logprobs"])
        for j, entry in enumerate(choice["logprobs"]["top_logprobs"]):
            best = sorted(entry.items(), key=lambda kv: -kv[1])[:4]
            assert record["top_token_ids"][j] == [int(t.split(":")[1]) for t, _ in best]
            assert record["top_logprobs"][j] == [v for _, v in best]
            sampled = record["response_token_ids"][j]
            rank = record["response_ranks"][j]
            assert rank is None or record["top_token_ids"][j][rank - 1] == sampled
    assert any(r is None for rec in records for r in rec["response_ranks"])  # sampled outside the top 4


def test_generate_refused_by_a_server_without_scale_out_is_one_line(sim, problems, tmp_path):
    proc = run(sim, problems, tmp_path / "out", "--api", "generate")
    assert proc.returncode == 4 and b"--enable-scale-out" in proc.stderr and b"Traceback" not in proc.stderr
    assert generations(sim) == []


def test_the_logprobs_mode_is_found_by_experiment_and_warned_about(problems, tmp_path):
    raw, processed = serve(problems), serve(problems, logprobs_mode="processed_logprobs")
    try:
        for server, mode in ((raw, "raw_logprobs"), (processed, "processed_logprobs")):
            out = tmp_path / mode
            proc = run(server, problems, out, "--temperature", "0.7")
            assert proc.returncode == 0, proc.stderr.decode()
            assert server_of(out)["logprobs_mode"] == mode
            warned = b"not those of the distribution the tokens were sampled from" in proc.stderr
            assert warned == (mode == "raw_logprobs")
            doctor = run_cli("doctor", "--base-url", server.url, "--tokenizer", TOKENIZER, "--top-k", "5")
            line = next(x for x in doctor.stdout.decode().splitlines() if "logprobs mode" in x)
            assert mode in line and line.startswith("warn" if mode == "raw_logprobs" else "ok")
            plain = run_cli("doctor", "--base-url", server.url, "--tokenizer", TOKENIZER)
            assert plain.returncode == 0 and f"ok   logprobs mode: {mode}" in plain.stdout.decode()
    finally:
        raw.stop()
        processed.stop()


def test_routed_experts_round_trip_through_the_sidecar(problems, tmp_path):
    server = serve(problems, moe=(3, 8, 2), return_routed_experts=True, enable_scale_out=True)
    try:
        out = tmp_path / "out"
        proc = run(server, problems, out, "--return-routed-experts", "--samples-per-prompt", "2")
        assert proc.returncode == 0, proc.stderr.decode()
        sent = {
            tuple(e["request"]["token_ids"] + e["response"]["choices"][0]["token_ids"]): np.load(
                io.BytesIO(base64.b64decode(e["response"]["choices"][0]["routed_experts"]))
            )
            for e in generations(server)
        }
        records = list(read_with_routes(out, routes=True))
        assert len(records) == len(generations(server))
        for record in records:
            routes = record["routed_experts"]
            tokens = record["prompt_token_ids"] + record["response_token_ids"]
            assert routes.shape == (len(tokens) - 1, 3, 2)
            assert np.array_equal(routes, sent[tuple(tokens)])
        sidecars = list(out.glob("*.routes"))
        naive = sum(a.nbytes for a in sent.values())
        assert sidecars and sum(p.stat().st_size for p in sidecars) < naive  # a shared prompt is stored once
        assert run_cli("validate", str(out)).returncode == 0
        stdout = run(server, problems, "-", "--return-routed-experts")
        assert stdout.returncode == 2 and b"needs an output folder" in stdout.stderr
    finally:
        server.stop()


def test_asking_for_routes_from_a_server_that_sends_none_is_refused_at_start(sim, problems, tmp_path):
    proc = run(sim, problems, tmp_path / "out", "--return-routed-experts")
    assert proc.returncode == 4 and b"--enable-return-routed-experts" in proc.stderr
    assert generations(sim) == []


def test_weight_versions_become_megatron_policy_epochs():
    record = {
        "problem_id": "p",
        "prompt_token_ids": [1] * 10,
        "weight_versions": [{"version": "3", "start": 0, "end": 5}, {"version": "4", "start": 5, "end": 9}],
    }
    assert policy_epochs(record) == [(0, 3), (15, 4)]
    assert policy_epochs({**record, "weight_versions": [{"version": "default", "start": 0, "end": 9}]}) == [(0, 0)]
    assert policy_epochs({**record, "weight_versions": None}) == [(0, 0)]
    same = [{"version": "2", "start": 0, "end": 4}, {"version": "2", "start": 4, "end": 9}]
    assert policy_epochs({**record, "weight_versions": same}) == [(0, 2)]


def test_a_trailing_incomplete_character_is_held_back_as_vllms_detokenizer_does():
    """Found against real vLLM: these ids end inside a UTF-8 character; vLLM's text leaves it out."""
    from agentroll.render.chat import ChatEncoder, load_tokenizer

    encoder = ChatEncoder(load_tokenizer(TOKENIZER))
    ids = [492, 167, 48, 156, 864, 128, 883, 148, 408, 37, 1065, 749, 831, 145, 424, 251]
    assert encoder.tokenizer.decode(ids, skip_special_tokens=True).endswith("\ufffd")
    prompt = [1, 2, 3]
    text = encoder.decode_response(ids, "length", None, prompt)
    assert text == " 43\ufffdN\ufffdSimpli\ufffdHow\ufffd canC common them again\ufffd48"  # vLLM's own text
    assert encoder.decode_response([*ids, encoder.tokenizer.eos_token_id], "stop", None, prompt) == text
    assert encoder.decode_response(ids, "length", None) == text  # without the prompt: decoded whole, held back


def test_auto_uses_generate_only_when_every_endpoint_offers_it(native, sim, problems, tmp_path):
    out = tmp_path / "out"
    proc = run_cli(
        "generate",
        str(problems),
        "-o",
        str(out),
        "--base-url",
        f"{native.url},{sim.url}",
        "--tokenizer",
        TOKENIZER,
        "--num-parallel",
        "2",
        "--reward",
        "exact",
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert server_of(out)["api"] == "completions" and b"only some endpoints serve" in proc.stderr
    assert all("prompt" in e["request"] for server in (native, sim) for e in generations(server))


def test_a_rerun_against_another_server_set_up_resumes_and_lists_both(problems, tmp_path):
    """Server provenance is not a setting: a resume is not refused (say after a vLLM restart in another
    logprobs mode), but the manifest lists both set-ups and the run warns."""
    raw, processed = serve(problems), serve(problems, logprobs_mode="processed_logprobs")
    try:
        out = tmp_path / "out"
        assert run(raw, problems, out, "--limit", "3").returncode == 0
        again = run(processed, problems, out)
        assert again.returncode == 0, again.stderr.decode()
        assert b"differs from the last one's (logprobs_mode: 'raw_logprobs' -> 'processed_logprobs')" in again.stderr
        servers = json.loads((out / "manifest.json").read_text())["servers"]
        assert [s["logprobs_mode"] for s in servers] == ["raw_logprobs", "processed_logprobs"]
        assert len({r["problem_id"] for r in read_records(out)}) == 8 and generations(processed)
    finally:
        raw.stop()
        processed.stop()
