"""agentroll against a real vLLM (CPU build, tiny random Llama), through its normal code path: the CLI.

The server runs with --enable-scale-out, so it serves both token APIs; every exactness check runs through both.
A recording proxy on loopback sits between agentroll and vLLM and keeps vLLM's raw answers, so every record
can be compared with what the server itself sent.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentroll.render.chat import ChatEncoder, load_tokenizer
from agentroll.render.templates import Templates

from ..conftest import read_records, run_cli
from .conftest import SUMMARY
from .helpers import (
    SAMPLING_KEYS,
    TOKENIZER,
    RecordingProxy,
    answers,
    generate,
    key,
    manifest,
    match,
    problems,
    same_ranking,
)

APIS = ("completions", "generate")
K = 3  # --logprobs


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Iterator[Path]:
    yield problems(tmp_path_factory.mktemp("in") / "p.jsonl", 6)


@pytest.fixture(scope="module")
def few(tmp_path_factory) -> Path:
    return problems(tmp_path_factory.mktemp("few") / "p.jsonl", 3)


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TOKENIZER)


@pytest.fixture(scope="module")
def runs(real_vllm, tmp_path_factory):
    """`run(api, input, *flags)`: one generate run through a recording proxy, made once per module and shared
    (the same-seed comparison reads the runs the exactness tests checked). Returns (records, proxy log, folder)."""
    done: dict[tuple, tuple[list[dict], list[dict], Path]] = {}

    def run(api: str, input_path: Path, *flags: str, seed: int = 3, max_tokens: int = 24):
        call = (api, input_path, flags, seed, max_tokens)
        if call not in done:
            out = tmp_path_factory.mktemp(f"run-{api}")
            with RecordingProxy(real_vllm) as proxy:
                proc = generate(proxy.url, input_path, out, "--api", api, *flags, seed=seed, max_tokens=max_tokens)
            assert proc.returncode == 0, proc.stderr.decode()
            assert manifest(out)["servers"][-1]["api"] == api
            done[call] = read_records(out), proxy.log, out
        return done[call]

    return run


def local_text(tokenizer, record: dict) -> str:
    """docs/schema.md, `response` from the generate API: the ids decoded with special tokens skipped, the stop
    token that ended the response (EOS or a stop token id, not a stop string) left out, and the tokens of a
    trailing incomplete character held back."""
    ids = record["response_token_ids"]
    if ids and record["finish_reason"] == "stop" and not isinstance(record["stop_reason"], str):
        ids = ids[:-1]
    while ids and tokenizer.decode(ids, skip_special_tokens=True).endswith("\ufffd"):
        ids = ids[:-1]
    return tokenizer.decode(ids, skip_special_tokens=True)


def check_exact(records: list[dict], log: list[dict], api: str, tokenizer) -> int:
    """Every record is one answered call of `api`, ids, logprobs and sampling as vLLM had and sent them; returns
    how many were checked."""
    pairs = match(records, answers(log))
    for r, a in pairs:
        assert a.api == api
        assert r["sampling"] == {k: a.params[k] for k in SAMPLING_KEYS}  # what this call sent
        assert r["response_token_ids"] == a.token_ids, key(r)
        assert r["response_logprobs"] == a.logprobs, key(r)
        assert r["loss_mask"] == [1] * len(a.token_ids)
        assert (r["finish_reason"], r["stop_reason"]) == (a.finish_reason, a.stop_reason)
        if api == "completions":
            assert r["prompt_token_ids"] == a.choice["prompt_token_ids"]  # what vLLM says it was given
            assert [f"token_id:{t}" for t in r["response_token_ids"]] == a.choice["logprobs"]["tokens"]
            assert r["response"] == a.choice["text"]
            assert r["response_ranks"] is None and r["weight_versions"] is None
        else:
            assert a.ranks is not None and None not in a.ranks and r["response_ranks"] == a.ranks
            assert r["weight_versions"] == a.choice["weight_versions"] and a.choice["weight_versions"]
            spans = r["weight_versions"]  # they cover the response, whole and in order
            assert spans[0]["start"] == 0 and spans[-1]["end"] == len(r["response_token_ids"])
            assert all(s["end"] == t["start"] for s, t in pairwise(spans))
            assert r["response"] == local_text(tokenizer, r)
    return len(pairs)


@pytest.mark.parametrize("api", APIS)
def test_records_are_token_exact_against_real_vllm(api, runs, inputs, tokenizer):
    records, log, _ = runs(api, inputs, seed=7)
    assert {r["stage"] for r in records} == {"solver", "rewriter", "selector"}  # all three stages ran on vLLM
    checked = check_exact(records, log, api, tokenizer)
    SUMMARY.append(
        f"real vLLM, --api {api}: {len({r['rollout_id'] for r in records})} rollouts, {checked} samples "
        "checked token by token against vLLM's own answers"
    )


def test_ids_read_from_token_id_strings_equal_vllms_token_ids(real_vllm, inputs, tmp_path, tokenizer):
    with RecordingProxy(real_vllm, strip_token_ids=True) as proxy:
        proc = generate(proxy.url, inputs, tmp_path / "out", "--limit", "3", "--api", "completions")
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(tmp_path / "out")
    assert records and check_exact(records, proxy.log, "completions", tokenizer) == len(records)  # log: vLLM's ids


def test_same_seed_gives_the_same_tokens_through_both_apis(runs, inputs):
    (a, _, _), (b, _, _) = (runs(api, inputs, seed=7) for api in APIS)  # the runs checked token by token above
    by_key = {key(r): r for r in b}
    assert len(by_key) == len(b) == len(a) and set(by_key) == {key(r) for r in a}
    compared = 0
    for r in a:
        g = by_key[key(r)]
        assert r["sampling"] == g["sampling"]
        # the text decoded here is the server's: later stages' prompts, built from it, are the same too
        assert r["response"] == g["response"], (key(r), r["response"], g["response"])
        assert r["prompt_token_ids"] == g["prompt_token_ids"], key(r)
        assert r["response_token_ids"] == g["response_token_ids"], key(r)
        assert r["response_logprobs"] == g["response_logprobs"], key(r)
        assert (r["finish_reason"], r["stop_reason"]) == (g["finish_reason"], g["stop_reason"])
        compared += 1
    assert compared == len(a) > 0
    SUMMARY.append(
        f"real vLLM, --seed 7 through both APIs: all {compared} samples identical (prompts, ids, logprobs, texts)"
    )


def check_top(records: list[dict], log: list[dict], api: str) -> int:
    """--logprobs K: each position's K most likely tokens as vLLM ranked them; returns positions checked."""
    positions = 0
    for r, a in match(records, answers(log, alternatives=K)):
        assert (a.top is not None and a.ranks is not None) == (api == "generate")
        ids, lps, ranks = r["top_token_ids"], r["top_logprobs"], r["response_ranks"]
        assert len(ids) == len(lps) == len(ranks) == len(r["response_token_ids"])
        for j, (sampled, logprob) in enumerate(zip(r["response_token_ids"], r["response_logprobs"], strict=True)):
            if a.top is not None and a.ranks is not None:
                assert list(zip(ids[j], lps[j], strict=True)) == a.top[j]
                assert ranks[j] == a.ranks[j]
            else:
                served = a.choice["logprobs"]["top_logprobs"][j]  # {"token_id:N": logprob}: sampled + top K
                outside = len(served) == K + 1
                assert len(served) == K or outside
                entries = {int(t.removeprefix("token_id:")): v for t, v in served.items()}
                top = sorted(entries.items(), key=lambda e: -e[1])[:K]
                assert same_ranking(ids[j], lps[j], [t for t, _ in top], [v for _, v in top])
                assert entries[sampled] == logprob
                assert ranks[j] == (None if outside else ids[j].index(sampled) + 1)
            # what must hold exactly: the rows are in rank order, the sampled token is no likelier than rank 1,
            # and a sampled token of rank r <= K is row entry r
            assert lps[j] == sorted(lps[j], reverse=True) and lps[j][0] >= logprob
            if ranks[j] is not None and ranks[j] <= K:
                assert (ids[j][ranks[j] - 1], lps[j][ranks[j] - 1]) == (sampled, logprob)
            positions += 1
    return positions


def test_top_logprobs_are_token_exact_through_both_apis(runs, few):
    checked = {}
    for api in APIS:
        records, log, out = runs(api, few, "--logprobs", str(K), seed=7, max_tokens=16)
        assert manifest(out)["settings"]["logprobs"] == K
        checked[api] = records, check_top(records, log, api)
    (a, positions), (b, _) = checked["completions"], checked["generate"]
    by_key = {key(r): r for r in b}
    agreed = 0
    for r in a:
        g = by_key[key(r)]
        if r["prompt_token_ids"] != g["prompt_token_ids"]:
            continue  # a later stage shown a text that differs (test_same_seed...)
        assert r["response_token_ids"] == g["response_token_ids"]
        for j in range(len(r["response_token_ids"])):
            assert same_ranking(
                r["top_token_ids"][j], r["top_logprobs"][j], g["top_token_ids"][j], g["top_logprobs"][j]
            ), (key(r), j)
            rank = g["response_ranks"][j]
            assert r["response_ranks"][j] == (rank if rank <= K else None)
            agreed += 1
    assert agreed >= positions // 2
    SUMMARY.append(
        f"real vLLM, --logprobs {K}: {positions} positions per API checked against vLLM's top "
        f"logprobs, {agreed} identical across the two APIs"
    )


def test_local_chat_template_matches_vllms_tokenize_for_every_stage(real_vllm):
    encoder, templates = ChatEncoder(load_tokenizer(TOKENIZER)), Templates()
    for problem in ("What is 2 times 4?", "Ein Dreieck hat Winkel 30° und 60°: der dritte?", "x^2 = 9, x > 0"):
        for messages in (
            templates.messages("solver", problem),
            templates.messages("rewriter", problem, ["\\boxed{8}", "It is \\boxed{9}."]),
            templates.messages("selector", problem, ["\\boxed{8}"]),
        ):
            request = urllib.request.Request(
                f"{real_vllm}/tokenize",
                method="POST",
                headers={"content-type": "application/json"},
                data=json.dumps({"model": "tiny", "messages": messages, "add_generation_prompt": True}).encode(),
            )
            theirs = json.loads(urllib.request.urlopen(request, timeout=30).read())["tokens"]
            assert encoder.encode(messages)[1] == theirs
    doctor = run_cli("doctor", "--base-url", real_vllm + "/v1", "--tokenizer", TOKENIZER, timeout=300)
    assert doctor.returncode == 0, doctor.stderr.decode() + doctor.stdout.decode()
    assert b"ok   chat template" in doctor.stdout and b"ok   return_token_ids" in doctor.stdout  # the verdicts
    assert b"ok   token API: /inference/v1/generate" in doctor.stdout  # served with --enable-scale-out


def test_a_prompt_leaving_no_room_is_a_bad_row(real_vllm, tmp_path):
    path = long_input(tmp_path)
    # a solver prompt that leaves no room in the server's context is a bad row, named, and nothing is sent
    refused = generate(real_vllm, path, tmp_path / "a", "--num-parallel", "1")
    assert refused.returncode == 3, refused.stderr.decode()
    assert f"{path}:1: field 'prompt': the rendered prompt has".encode() in refused.stderr


@pytest.mark.parametrize(
    ("api", "message"),
    [
        ("completions", b"This model's maximum context length is 2048 tokens"),
        ("generate", b"is longer than the maximum model length of 2048"),
    ],
)
def test_vllms_own_context_error_fails_the_group(real_vllm, tmp_path, api, message):
    # told the context is larger than it is, vLLM's own 400 fails the call: the group is missing, exit 8
    sent = generate(
        real_vllm,
        long_input(tmp_path),
        tmp_path / "b",
        "--num-parallel",
        "1",
        "--max-context-len",
        "100000",
        "--api",
        api,
    )
    assert sent.returncode == 8 and message in sent.stderr, sent.stderr.decode()
    stats = manifest(tmp_path / "b")["last_run"]["stats"]
    assert stats["stages"]["solver"]["failed_calls"] == 1 and stats["groups_failed"] == 1
    assert read_records(tmp_path / "b") == []


def long_input(tmp_path: Path) -> Path:
    long_problem = "Add these numbers: " + " ".join(str(i) for i in range(1500))
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"id": "long", "prompt": long_problem, "label": "0"}) + "\n")
    return path


def gauge(url: str, name: str) -> float:
    """A vLLM metric from /metrics, summed over its labels (a loaded CPU server can take seconds to answer)."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=60).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def served(url: str) -> float:
    return gauge(url, "vllm:request_success_total")


@pytest.mark.stops_tools_vllm
def test_two_real_servers_one_stopped_mid_run_loses_nothing(real_vllm, tools_vllm, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    second, url = tools_vllm  # the session's third server (no --enable-scale-out), killed here: it runs last
    running: list[subprocess.Popen[bytes]] = []
    try:
        # without --enable-scale-out vLLM refuses /inference/v1/generate: --api auto settles on completions
        one = problems(tmp_path / "one.jsonl", 1)
        auto = generate(url, one, tmp_path / "auto", "--num-parallel", "1", "--max-tokens", "4")
        assert auto.returncode == 0, auto.stderr.decode()
        assert manifest(tmp_path / "auto")["servers"][-1]["api"] == "completions"
        path = problems(tmp_path / "p.jsonl", 40)  # enough work left after the stop to need rerouting
        out = tmp_path / "out"
        args = [
            "generate",
            str(path),
            "-o",
            str(out),
            "--base-url",
            f"{real_vllm},{url}",
            "--tokenizer",
            TOKENIZER,
            "--num-parallel",
            "2",
            "--no-think",
            "--max-tokens",
            "160",
            "--reward",
            "exact",
            "--concurrency",
            "8",
            "--probe-interval",
            "1",
            "--api",
            "completions",
            "--chat-render",
            "local",
        ]  # the API both servers offer; their chat templates differ (Qwen3's on the second), ours renders
        before = served(url)
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentroll", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        running.append(proc)  # killed and reaped in `finally` if the test fails before it ends
        deadline = time.monotonic() + 300
        # Stop it while it holds work: those requests must be rerouted. (Waiting for a count served alone let
        # a freshly started, slow server finish its share after the fast one had taken the rest.)
        while (served(url) < before + 3 or gauge(url, "vllm:num_requests_running") < 1) and time.monotonic() < deadline:
            time.sleep(0.2)  # an external server's own counters
        assert time.monotonic() < deadline, "the second server never had requests in flight"
        # The node goes away (SIGKILL to the server's whole group). A SIGTERM would not do: vLLM 0.32 drains on
        # SIGTERM and went on answering new requests until this run had finished, so nothing was rerouted.
        os.killpg(second.pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr.decode()
        records = read_records(out)
        executions = {(r["problem_id"], r["sample_index"]) for r in records}
        assert len(executions) == 40 and len({r["rollout_id"] for r in records}) == 40
        assert {r["endpoint"] for r in records} == {real_vllm, url} and b"out of rotation" in stderr
        assert manifest(out)["last_run"]["requests"]["retries"] > 0
        assert manifest(out)["complete"] is True
    finally:
        for leftover in running:
            if leftover.poll() is None:
                leftover.kill()
            leftover.communicate()
