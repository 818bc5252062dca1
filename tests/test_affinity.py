"""Prefix affinity: a problem's executions go to one endpoint (vLLM's prefix cache serves their shared prompt),
chosen by rendezvous hashing with a bounded load, so that no endpoint is overfilled while another idles."""

from __future__ import annotations

import asyncio
from collections import defaultdict

from agentroll.client import CompletionClient
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer

from .conftest import TOKENIZER, read_records, run_cli, settings, write_problems


def client(urls: list[str], slack: int = 0) -> CompletionClient:
    async def make() -> CompletionClient:
        return CompletionClient(urls, settings(affinity_slack=slack))

    return asyncio.run(make())


def test_rendezvous_keeps_keys_in_place_when_an_endpoint_goes_and_bounds_the_load():
    urls = [f"http://127.0.0.1:{9000 + i}" for i in range(4)]
    c = client(urls)
    keys = [f"problem-{i}" for i in range(400)]
    placed = {k: c.affine(k, c.endpoints).url for k in keys}
    assert len(set(placed.values())) == 4  # spread over every endpoint
    gone = c.endpoints[1]
    moved = {k: c.affine(k, [e for e in c.endpoints if e is not gone]).url for k in keys}
    assert all(moved[k] == placed[k] for k in keys if placed[k] != gone.url)  # only the lost endpoint's keys move
    key = keys[0]
    first = c.affine(key, c.endpoints)
    first.in_flight = 50  # far above a fair share of the 50 in flight
    assert c.affine(key, c.endpoints) is not first
    first.in_flight = 0
    assert c.affine(key, c.endpoints) is first
    asyncio.run(c.aclose())


def test_every_execution_of_a_problem_goes_to_one_of_two_servers(tmp_path):
    problems = write_problems(tmp_path / "p.jsonl", 12)
    servers = [SimServer(script=Script.from_jsonl(problems), seed=i) for i in range(2)]
    for server in servers:
        server.start()
    try:
        out = tmp_path / "out"
        proc = run_cli(
            "generate",
            str(problems),
            "-o",
            str(out),
            "--base-url",
            ",".join(s.url for s in servers),
            "--tokenizer",
            TOKENIZER,
            "--reward",
            "exact",
            "--num-parallel",
            "2",
            "--samples-per-prompt",
            "4",
            "--concurrency",
            "16",
        )
        assert proc.returncode == 0, proc.stderr.decode()
        endpoints = defaultdict(set)
        for record in read_records(out):
            endpoints[record["problem_id"]].add(record["endpoint"])
        assert len(endpoints) == 12
        single = [p for p, where in endpoints.items() if len(where) == 1]
        assert len(single) >= 11, dict(endpoints)
        used = {next(iter(where)) for where in endpoints.values()}
        assert used == {s.url for s in servers}  # both servers work
    finally:
        for server in servers:
            server.stop()
