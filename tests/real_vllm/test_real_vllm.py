"""agentroll against a real vLLM (CPU build, tiny random Llama), through its normal code path: the CLI.

A recording proxy on loopback sits between agentroll and vLLM and keeps vLLM's raw answers, so every record
can be compared with what the server itself sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agentroll.chat import ChatEncoder, load_tokenizer
from agentroll.resources import sim_tokenizer_dir
from agentroll.templates import Templates

from ..conftest import read_records, run_cli
from .conftest import SUMMARY

TOKENIZER = str(sim_tokenizer_dir())  # the tiny model ships this very tokenizer


class RecordingProxy:
    """Forwards to vLLM and logs each completion's raw answer; `strip_token_ids` hides `token_ids` from the
    client (as a server without return_token_ids would), after logging them."""

    def __init__(self, upstream: str, strip_token_ids: bool = False) -> None:
        self.upstream, self.strip = upstream, strip_token_ids
        self.log: list[dict] = []
        self.url = ""
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        async with aiohttp.ClientSession() as session, session.request(
                request.method, self.upstream + request.path_qs, data=body or None,
                headers={"content-type": "application/json"}) as answer:
            raw, status = await answer.read(), answer.status
        if request.path == "/v1/completions" and status == 200:
            self.log.append({"request": json.loads(body), "response": json.loads(raw)})
            payload = json.loads(raw)  # a copy to alter: the log keeps what vLLM sent
            if self.strip:
                for choice in payload["choices"]:
                    choice["token_ids"] = None
                raw = json.dumps(payload).encode()
        return web.Response(body=raw, status=status, content_type="application/json")

    def __enter__(self) -> RecordingProxy:
        def main() -> None:
            self._loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self.handle)
            runner = web.AppRunner(app)
            self._loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
            self._ready.set()
            self._loop.run_forever()
            self._loop.run_until_complete(runner.cleanup())
            self._loop.close()

        self._thread = threading.Thread(target=main, daemon=True)
        self._thread.start()
        self._ready.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)


def problems(path: Path, count: int) -> Path:
    with path.open("w") as f:
        for i in range(count):
            f.write(json.dumps({"id": f"r{i}", "prompt": f"What is {i} times {i + 2}?", "label": str(i * (i + 2))})
                    + "\n")
    return path


def generate(url: str, input_path: Path, out: Path, *extra: str):
    return run_cli("generate", str(input_path), "-o", str(out), "--base-url", url, "--tokenizer", TOKENIZER,
                   "--num-parallel", "2", "--no-think", "--max-tokens", "24", "--reward", "exact", "--seed", "3",
                   *extra, timeout=900)


def check_exact(records: list[dict], log: list[dict]) -> int:
    """Every record is one logged exchange, ids and logprobs as vLLM sent them; returns how many were checked."""
    served = {}
    for exchange in log:
        choice = exchange["response"]["choices"][0]
        served.setdefault(tuple(exchange["request"]["prompt"]), []).append(choice)
    for r in records:
        candidates = served[tuple(r["prompt_token_ids"])]
        match = [c for c in candidates if c["token_ids"] == r["response_token_ids"]]
        assert match, f"record {r['stage']} {r['worker']} matches no response vLLM sent"
        choice = match[0]
        assert r["response_logprobs"] == choice["logprobs"]["token_logprobs"]
        assert r["prompt_token_ids"] == choice["prompt_token_ids"]  # what vLLM says it was given
        assert [f"token_id:{t}" for t in r["response_token_ids"]] == choice["logprobs"]["tokens"]
        assert r["finish_reason"] == choice["finish_reason"]
    return len(records)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Iterator[Path]:
    yield problems(tmp_path_factory.mktemp("in") / "p.jsonl", 6)


def test_records_are_token_exact_against_real_vllm(real_vllm, inputs, tmp_path):
    with RecordingProxy(real_vllm) as proxy:
        proc = generate(proxy.url, inputs, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(tmp_path / "out")
    assert {r["stage"] for r in records} == {"solver", "rewriter", "selector"}  # all three stages ran on vLLM
    assert len(records) == len(proxy.log)
    checked = check_exact(records, proxy.log)
    SUMMARY.append(f"real vLLM: {len({r['rollout_id'] for r in records})} rollouts, {checked} samples checked "
                   "token by token against vLLM's own answers")


def test_ids_read_from_token_id_strings_equal_vllms_token_ids(real_vllm, inputs, tmp_path):
    with RecordingProxy(real_vllm, strip_token_ids=True) as proxy:
        proc = generate(proxy.url, inputs, tmp_path / "out", "--limit", "3")
    assert proc.returncode == 0, proc.stderr.decode()
    records = read_records(tmp_path / "out")
    assert records and check_exact(records, proxy.log) == len(records)  # log holds the ids vLLM sent


def test_local_chat_template_matches_vllms_tokenize_for_every_stage(real_vllm):
    encoder, templates = ChatEncoder(load_tokenizer(TOKENIZER)), Templates()
    for problem in ("What is 2 times 4?", "Ein Dreieck hat Winkel 30° und 60°: der dritte?", "x^2 = 9, x > 0"):
        for messages in (templates.messages("solver", problem),
                         templates.messages("rewriter", problem, ["\\boxed{8}", "It is \\boxed{9}."]),
                         templates.messages("selector", problem, ["\\boxed{8}"])):
            request = urllib.request.Request(
                f"{real_vllm}/tokenize", method="POST", headers={"content-type": "application/json"},
                data=json.dumps({"model": "tiny", "messages": messages, "add_generation_prompt": True}).encode())
            theirs = json.loads(urllib.request.urlopen(request, timeout=30).read())["tokens"]
            assert encoder.encode(messages)[1] == theirs
    doctor = run_cli("doctor", "--base-url", real_vllm + "/v1", "--tokenizer", TOKENIZER, timeout=300)
    assert doctor.returncode == 0, doctor.stderr.decode()
    assert b"ok   chat template" in doctor.stderr and b"ok   return_token_ids" in doctor.stderr


def test_context_limits_against_real_vllm(real_vllm, tmp_path):
    long_problem = "Add these numbers: " + " ".join(str(i) for i in range(1500))
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"id": "long", "prompt": long_problem, "label": "0"}) + "\n")
    # a solver prompt that leaves no room in the server's context is a bad row, named, and nothing is sent
    refused = generate(real_vllm, path, tmp_path / "a", "--num-parallel", "1")
    assert refused.returncode == 3, refused.stderr.decode()
    assert f"{path}:1: line 1, field 'prompt': the rendered prompt has".encode() in refused.stderr
    # told the context is larger than it is, vLLM's own 400 fails the call: the group is missing, exit 8
    sent = generate(real_vllm, path, tmp_path / "b", "--num-parallel", "1", "--max-context-len", "100000")
    assert sent.returncode == 8 and b"This model's maximum context length is 2048 tokens" in sent.stderr
    stats = json.loads((tmp_path / "b" / "manifest.json").read_text())["last_run"]["stats"]
    assert stats["stages"]["solver"]["failed_calls"] == 1 and stats["groups_failed"] == 1
    assert read_records(tmp_path / "b") == []


def gauge(url: str, name: str) -> float:
    """A vLLM metric from /metrics, summed over its labels."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def served(url: str) -> float:
    return gauge(url, "vllm:request_success_total")


def test_two_real_servers_one_stopped_mid_run_loses_nothing(real_vllm, vllm_python, tiny_model, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from .conftest import start_server, stop

    second, url = start_server(vllm_python, tiny_model, tmp_path / "second.log")
    try:
        path = problems(tmp_path / "p.jsonl", 100)  # enough work left after the stop to need rerouting
        out = tmp_path / "out"
        args = ["generate", str(path), "-o", str(out), "--base-url", f"{real_vllm},{url}", "--tokenizer", TOKENIZER,
                "--num-parallel", "2", "--no-think", "--max-tokens", "160", "--reward", "exact", "--concurrency", "8",
                "--probe-interval", "1"]
        proc = subprocess.Popen([sys.executable, "-m", "agentroll", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        deadline = time.monotonic() + 300
        # Stop it while it holds work: those requests must be rerouted. (Waiting for a count served alone let
        # a freshly started, slow server finish its share after the fast one had taken the rest.)
        while (served(url) < 3 or gauge(url, "vllm:num_requests_running") < 1) and time.monotonic() < deadline:
            time.sleep(0.2)  # an external server's own counters
        assert time.monotonic() < deadline, "the second server never had requests in flight"
        # The node goes away (SIGKILL to the server's whole group). A SIGTERM would not do: vLLM 0.32 drains on
        # SIGTERM and went on answering new requests until this run had finished, so nothing was rerouted.
        os.killpg(second.pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr.decode()
        records = read_records(out)
        executions = {(r["problem_id"], r["sample_index"]) for r in records}
        assert len(executions) == 100 and len({r["rollout_id"] for r in records}) == 100
        assert {r["endpoint"] for r in records} == {real_vllm, url} and b"out of rotation" in stderr
        assert json.loads((out / "manifest.json").read_text())["last_run"]["requests"]["retries"] > 0
        assert json.loads((out / "manifest.json").read_text())["complete"] is True
    finally:
        stop(second)
