"""Endpoints leave the rotation on evidence that they are down, the last one too when no retry can succeed."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from agentroll.client import CompletionClient, FunctionTransport
from agentroll.errors import ServerError
from agentroll.folder import Manifest
from agentroll.sim.script import Script
from agentroll.sim.server import Faults, SimServer

from .conftest import TOKENIZER, run_cli, settings, write_problems

ANSWER = orjson.dumps(
    {"choices": [{"text": "x", "token_ids": [1], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "stop"}]}
)
BOOM = b'{"error": {"message": "boom"}}'


def failing_server(healed: asyncio.Event | None = None):
    """/health says 200 throughout; every completion fails with a 500 until `healed` is set."""
    asked: list[str] = []

    def handler(method: str, url: str, body: bytes | None) -> tuple[int, bytes]:
        if url.endswith("/health"):
            return 200, b""
        asked.append(url)
        if healed is not None and healed.is_set():
            return 200, ANSWER
        return 500, BOOM

    return handler, asked


def test_the_last_endpoint_failing_every_call_is_benched_and_the_calls_wait_then_end_with_a_server_error(caplog):
    async def go() -> tuple[list[BaseException | object], int, bool]:
        handler, asked = failing_server()
        client = CompletionClient(
            ["http://127.0.0.1:1"],
            settings(concurrency=8, backoff_base_s=0.001, probe_interval_s=0.05, down_timeout_s=0.5),
            transport=FunctionTransport(handler),
        )
        try:
            results = await asyncio.gather(
                *(client.complete([i, 2, 3], {"max_tokens": 4}, "m") for i in range(60)), return_exceptions=True
            )
            return results, len(asked), client.endpoints[0].down
        finally:
            await client.aclose()

    with caplog.at_level(logging.WARNING, logger="agentroll"):
        results, asked, down = asyncio.run(go())
    said = [r.getMessage() for r in caplog.records]
    assert down
    assert all(isinstance(r, ServerError) and "every endpoint has been down" in str(r) for r in results), results
    assert asked < 60 * 6 / 2  # nowhere near every call's every retry: the calls waited instead
    assert sum("every endpoint is down" in s for s in said) == 1, said
    assert sum("out of rotation" in s for s in said) == 1, said


def test_a_benched_endpoint_comes_back_when_a_one_token_call_answers_not_on_its_health_alone(caplog):
    async def go() -> tuple[int, int, list[bytes]]:
        healed = asyncio.Event()
        handler, _ = failing_server(healed)
        probes: list[bytes] = []

        def watched(method: str, url: str, body: bytes | None) -> tuple[int, bytes]:
            if client.endpoints[0].down and url.endswith("/v1/completions"):
                probes.append(body or b"")  # only the probe asks while it is out
            return handler(method, url, body)

        client = CompletionClient(
            ["http://127.0.0.1:1"],
            settings(concurrency=8, backoff_base_s=0.001, probe_interval_s=0.02, max_retries=50),
            transport=FunctionTransport(watched),
        )
        try:
            calls = [asyncio.ensure_future(client.complete([i, 2, 3], {"max_tokens": 4}, "m")) for i in range(30)]
            while len(probes) < 3:  # its /health says 200 all along: still out, the one-token probe fails
                await asyncio.sleep(0.01)
            assert client.endpoints[0].down
            healed.set()
            done = await asyncio.gather(*calls)
            return len(done), client.counters.failures, probes
        finally:
            await client.aclose()

    with caplog.at_level(logging.WARNING, logger="agentroll"):
        done, failures, probes = asyncio.run(go())
    assert done == 30 and failures == 0
    assert all(orjson.loads(p)["max_tokens"] == 1 for p in probes)
    said = [r.getMessage() for r in caplog.records]
    assert sum("is back after" in s for s in said) == 1, said


def generate(problems, out, url, *extra: str):
    return run_cli(
        "generate", str(problems), "-o", str(out), "--base-url", url, "--tokenizer", TOKENIZER, "--reward", "exact",
        *extra,
    )  # fmt: skip


def test_a_server_failing_every_call_pauses_the_run_then_exits_4_with_no_group_marked_failed(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 40)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(error_rate=1.0), record=False)
    server.start()
    out = tmp_path / "out"
    try:  # the defaults (--concurrency auto), with a short outage limit
        proc = generate(problems, out, server.url, "--down-timeout", "1", "--probe-interval", "0.2")
    finally:
        server.stop()
    stderr = proc.stderr.decode()
    assert proc.returncode == 4, stderr
    assert "every endpoint has been down for 1s" in stderr
    assert stderr.count("every endpoint is down") == 1 and stderr.count("WARNING") <= 3, stderr
    manifest = Manifest.load(out)
    assert manifest.last_run["stats"]["groups_failed"] == 0 and not manifest.complete
    assert manifest.last_run["requests"]["requests"] < 40 * 6  # it paused rather than spend every retry


@pytest.mark.parametrize("concurrency", ["auto", "64"])
def test_under_transient_faults_the_only_endpoint_stays_in_rotation(tmp_path, concurrency):
    problems = write_problems(tmp_path / "p.jsonl", 40)
    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(error_rate=0.05, drop_rate=0.02), record=False)
    server.start()
    try:
        proc = generate(problems, tmp_path / "out", server.url, "--concurrency", concurrency)
    finally:
        server.stop()
    stderr = proc.stderr.decode()
    assert proc.returncode == 0, stderr
    assert "out of rotation" not in stderr and "every endpoint is down" not in stderr
    manifest = Manifest.load(tmp_path / "out")
    assert manifest.groups == 40 and manifest.last_run["requests"]["retries"] > 0
    assert manifest.last_run["requests"]["failures"] == 0
