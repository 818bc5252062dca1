"""The simulated server's capacity model and connection handling: running and waiting requests as vLLM's
/metrics reports them, FIFO admission, KV-cache limits, client disconnects, idle keep-alive, shutdown."""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.request

import aiohttp
import pytest

from agentroll.sim.scheduler import Scheduler
from agentroll.sim.script import Scripted
from agentroll.sim.server import Faults, SimServer


class Fixed:
    """Every answer runs to max_tokens: each request's size (prompt + output) is known in advance."""

    def answer(self, prompt, rng, request=None):
        return Scripted("<think>x", truncate=True)


def metrics(url: str) -> dict[str, float]:
    """Samples by their full name with labels, as a Prometheus scraper keys them."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def labels(model: str, **extra: str) -> str:
    """vLLM's label set, names in alphabetical order as prometheus_client writes them."""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted({"engine": "0", "model_name": model, **extra}.items())) + "}"


async def complete(session: aiohttp.ClientSession, url: str, mark: int) -> dict:
    body = {"prompt": [mark] * 10, "max_tokens": 6, "return_token_ids": True}
    async with session.post(f"{url}/v1/completions", json=body) as answer:
        assert answer.status == 200
        return await answer.json()


def test_requests_past_max_running_wait_in_order_and_metrics_show_running_waiting_and_kv_usage():
    # 10 prompt tokens + 6 output tokens = one 16-token KV block per request; 16 blocks in all.
    server = SimServer(
        script=Fixed(),
        max_model_len=256,
        kv_cache_tokens=256,
        max_running=2,  # type: ignore[arg-type]
        faults=Faults(latency_s=1.0),
    )
    server.start()

    async def go():
        async with aiohttp.ClientSession() as session:
            tasks = []
            for mark in range(10, 15):  # sent one at a time, so the arrival order is known
                tasks.append(asyncio.create_task(complete(session, server.url, mark)))
                parked = len(tasks)
                assert await asyncio.to_thread(server.wait_until, lambda n=parked: server.in_flight == n, 10)
            seen = metrics(server.url)
            return seen, await asyncio.gather(*tasks)

    try:
        seen, answers = asyncio.run(go())
        m = server.model
        assert seen[f"vllm:num_requests_running{labels(m)}"] == 2.0
        assert seen[f"vllm:num_requests_waiting{labels(m)}"] == 3.0
        assert seen["vllm:num_requests_waiting_by_reason" + labels(m, reason="capacity")] == 3.0
        assert seen[f"vllm:kv_cache_usage_perc{labels(m)}"] == 2 / 16
        assert server.peak_in_flight == 5
        assert all(a["choices"][0]["finish_reason"] == "length" for a in answers)
        # admitted first come, first served: the log is in completion order, and only 2 run at once
        order = [e["request"]["prompt"][0] for e in server.log]
        assert sorted(order[:2]) == [10, 11] and sorted(order[2:4]) == [12, 13] and order[4] == 14
        after = metrics(server.url)
        assert after[f"vllm:num_requests_running{labels(m)}"] == 0.0
        assert after[f"vllm:num_requests_waiting{labels(m)}"] == 0.0
        assert after[f"vllm:kv_cache_usage_perc{labels(m)}"] == 0.0
        assert after["vllm:request_success_total" + labels(m, finished_reason="length")] == 5.0
        assert after[f"vllm:generation_tokens_total{labels(m)}"] == 5 * 6
        assert after[f"vllm:prompt_tokens_total{labels(m)}"] == 5 * 10
    finally:
        server.stop()


def test_the_scheduler_admits_strictly_in_order_within_both_limits_and_forgets_a_cancelled_waiter():
    async def go():
        scheduler = Scheduler(max_running=3, kv_blocks=4)
        admitted: list[str] = []
        release = {name: asyncio.Event() for name in "abcde"}

        async def request(name: str, tokens: int) -> None:
            async with scheduler.slot(tokens):
                admitted.append(name)
                await release[name].wait()

        async def settle() -> None:
            for _ in range(5):
                await asyncio.sleep(0)

        tasks = {"a": asyncio.create_task(request("a", 48))}  # 3 blocks of 4
        await settle()
        for name, tokens in (("b", 32), ("c", 1), ("d", 1)):  # b needs 2 blocks: does not fit; c may not overtake
            tasks[name] = asyncio.create_task(request(name, tokens))
            await settle()
        assert admitted == ["a"] and (scheduler.running, scheduler.waiting, scheduler.used_blocks) == (1, 3, 3)
        tasks["c"].cancel()  # c's client leaves while queued
        await settle()
        assert scheduler.waiting == 2 and admitted == ["a"]
        release["a"].set()
        await settle()
        assert admitted == ["a", "b", "d"] and (scheduler.running, scheduler.used_blocks) == (2, 3)
        tasks["e"] = asyncio.create_task(request("e", 1))
        await settle()
        assert admitted == ["a", "b", "d", "e"] and scheduler.running == 3
        for name in "bde":
            release[name].set()
        await asyncio.gather(*(tasks[n] for n in "abde"))
        assert (scheduler.running, scheduler.waiting, scheduler.used_blocks) == (0, 0, 0)
        with pytest.raises(asyncio.CancelledError):
            await tasks["c"]

    asyncio.run(go())


def raw_request(url: str, path: str = "/health", body: bytes | None = None) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    if body is None:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    else:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )
    return sock


def test_an_idle_keep_alive_connection_is_closed_after_the_timeout_but_a_slow_answer_is_not():
    assert SimServer.keepalive_timeout_s == 5.0  # uvicorn's (and so vLLM's) default
    server = SimServer(keepalive_timeout_s=0.5, faults=Faults(latency_s=1.0))
    server.start()
    try:
        sock = raw_request(server.url, "/v1/completions", b'{"prompt": [5, 6], "max_tokens": 3}')
        started = time.monotonic()
        head = sock.recv(65536)  # the answer takes 1 s, longer than the idle timeout: it still arrives
        assert head.startswith(b"HTTP/1.1 200 OK")
        answered = time.monotonic()
        while (more := sock.recv(65536)) != b"":  # then the connection idles, and the server closes it
            head += more
        closed = time.monotonic()
        assert answered - started >= 1.0 and 0.4 <= closed - answered < 4.0
        sock.close()
    finally:
        server.stop()


def test_a_client_that_disconnects_aborts_its_request_running_or_waiting_and_frees_the_slot():
    server = SimServer(max_running=1, faults=Faults(latency_s=30))
    server.start()
    try:
        running = raw_request(server.url, "/v1/completions", b'{"prompt": [5, 6], "max_tokens": 3}')
        assert server.wait_until(lambda: server.scheduler.running == 1, 10)
        waiting = raw_request(server.url, "/v1/completions", b'{"prompt": [7, 8], "max_tokens": 3}')
        assert server.wait_until(lambda: server.scheduler.waiting == 1, 10)
        waiting.close()
        assert server.wait_until(lambda: server.aborted == 1 and server.scheduler.waiting == 0, 10)
        assert server.scheduler.running == 1
        running.close()
        assert server.wait_until(lambda: server.aborted == 2 and server.scheduler.running == 0, 10)
        assert server.in_flight == 0 and server.completions == 0 and server.peak_in_flight == 2
        assert metrics(server.url)["vllm:request_success_total" + labels(server.model, finished_reason="abort")] == 0
    finally:
        server.stop()


def test_stop_closes_every_connection_at_once_as_a_killed_server_would():
    server = SimServer(faults=Faults(latency_s=30))
    server.start()
    busy = raw_request(server.url, "/v1/completions", b'{"prompt": [5, 6], "max_tokens": 3}')
    idle = raw_request(server.url)
    assert idle.recv(65536).startswith(b"HTTP/1.1 200 OK")
    assert server.wait_until(lambda: server.scheduler.running == 1, 10)
    started = time.monotonic()
    server.stop()
    assert busy.recv(65536) == b"" and idle.recv(65536) == b""  # both closed, no answer on the busy one
    assert time.monotonic() - started < 5
    busy.close()
    idle.close()
    assert server.aborted == 0  # the server went away: no client aborted anything
    with pytest.raises(OSError):
        raw_request(server.url).recv(1)
