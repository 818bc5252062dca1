"""--concurrency auto against the simulator's capacity model: the client is not told the server's capacity and
must find it from /metrics, keeping the batch full and the queue short."""

from __future__ import annotations

import json

from agentroll.client.adaptive import Controller, Load, parse_metrics
from agentroll.sim.faults import Faults
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, run_cli, settings, write_problems


def test_vllms_metrics_text_is_read_summed_over_label_sets():
    text = (
        '# HELP vllm:num_requests_running x\nvllm:num_requests_running{engine="0",model_name="m}"} 7.0\n'
        'vllm:num_requests_running{engine="1",model_name="m"} 5.0\nvllm:num_requests_waiting{engine="0"} 3.0\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.5\nvllm:num_preemptions_total{engine="0"} 2.0\n'
        'vllm:num_requests_waiting_by_reason{reason="capacity"} 99.0\n'
    )
    assert parse_metrics(text) == Load(running=12.0, waiting=3.0, kv_usage=0.5, preemptions=2.0)
    assert parse_metrics("# nothing here\nother_metric 1\n") is None


def test_the_controller_grows_with_room_and_backs_off_on_a_queue_or_preemptions():
    c = Controller(16, minimum=4, maximum=512)
    assert c.update(Load(running=16), in_flight=16) == 32  # slow start: doubles while there is room
    assert c.update(Load(running=32), in_flight=10) == 32  # not using the limit: no reason to grow
    assert c.update(Load(running=40, waiting=24), in_flight=64) == 28  # queue: at most 90 %, or what runs
    assert c.update(Load(running=28), in_flight=28) == 31  # then additive: an eighth
    assert c.update(Load(running=31, preemptions=1), in_flight=31) == 27  # preemptions rose
    assert c.update(Load(running=27, preemptions=1, kv_usage=0.95), in_flight=27) == 27  # KV cache full: hold
    assert Controller(600, maximum=512).update(Load(), 600) == 512


def test_auto_finds_an_unknown_capacity_from_metrics(tmp_path):
    capacity = 24
    problems = write_problems(tmp_path / "p.jsonl", 120)
    server = SimServer(
        script=Script.from_jsonl(problems), max_running=capacity, record=False, faults=Faults(latency_s=0.25)
    )
    server.start()
    try:
        out = tmp_path / "out"
        proc = run_cli(
            "generate",
            str(problems),
            "-o",
            str(out),
            "--base-url",
            server.url,
            "--tokenizer",
            TOKENIZER,
            "--reward",
            "exact",
            "--num-parallel",
            "4",
            "--samples-per-prompt",
            "2",
            "--concurrency",
            "auto",
            "--max-concurrency",
            "200",
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr.decode()
        settled = json.loads((out / "manifest.json").read_text())["last_run"]["requests"]["concurrency"]
        assert list(settled) == [server.url]
        assert 0.9 * capacity <= settled[server.url] <= 1.25 * capacity, settled
        assert b"concurrency (auto, settled)" in proc.stderr
        assert server.peak_in_flight <= 1.25 * capacity + 8  # never far above what the server can run
    finally:
        server.stop()


def test_a_server_without_metrics_keeps_a_fixed_concurrency_with_a_warning(sim, problems, tmp_path):
    from agentroll.sim import app

    del app.ROUTES["/metrics"]
    try:
        proc = run_cli(
            "generate",
            str(problems),
            "-o",
            str(tmp_path / "out"),
            "--base-url",
            sim.url,
            "--tokenizer",
            TOKENIZER,
            "--reward",
            "exact",
            "--concurrency",
            "auto",
        )
    finally:
        app.ROUTES["/metrics"] = {"GET": app.prometheus}
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"no readable vLLM /metrics (HTTP 404): its concurrency stays at 64" in proc.stderr


def test_a_render_never_waits_for_a_completion_slot_under_auto(problems):
    """Server-side renders (/tokenize) take no completion slot: at the limit they go through at once, and they
    take no wake-up meant for a waiting completion."""
    import asyncio

    from agentroll.client import CompletionClient

    server = SimServer(script=Script.from_jsonl(problems), faults=Faults(latency_s=30))
    server.start()

    async def go():
        client = CompletionClient([server.url], settings(concurrency=None, max_retries=0))
        client.endpoints[0].limit = 1
        try:
            held = asyncio.create_task(client.complete([5, 6, 7], {"max_tokens": 4}, server.model))
            await asyncio.to_thread(server.wait_until, lambda: server.in_flight == 1, 20)
            waiting = asyncio.create_task(client.complete([5, 6, 8], {"max_tokens": 4}, server.model))
            tokens = await asyncio.wait_for(client.post_with_retries("/tokenize", {"prompt": "hello"}), 20)
            queued = client.counters.queued
            for task in (held, waiting):
                task.cancel()
            await asyncio.gather(held, waiting, return_exceptions=True)
            return tokens, queued
        finally:
            await client.aclose()

    try:
        tokens, queued = asyncio.run(go())
    finally:
        server.stop()
    assert tokens["tokens"] and queued == 1  # the second completion waits; the render did not
