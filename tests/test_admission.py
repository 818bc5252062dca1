"""Depth-first admission: the groups in flight are bounded by the servers' current limits, and a new group starts
only when the groups in flight cannot fill the free slots."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from agentroll.client import CompletionClient, FunctionTransport
from agentroll.engine.admission import depth_first

from .conftest import settings

ANSWER = orjson.dumps(
    {"choices": [{"text": "x", "token_ids": [1], "logprobs": {"token_logprobs": [-0.5]}, "finish_reason": "stop"}]}
)


class Groups:
    """A stand-in for the Generator: each group makes `stages` stages of `width` calls at once, with a pause
    between two stages (rendering, scoring) in which it holds no slot."""

    def __init__(self, client: CompletionClient, width: int, stages: int = 2) -> None:
        self.client, self.width, self.stages = client, width, stages
        self.started = self.running = self.peak = 0
        self.starts: list[tuple[int, float]] = []  # (groups running with it, the first endpoint's limit then)

    @property
    def next_group(self) -> int:
        return self.started

    def problem(self, row: Any) -> Any:
        return row

    async def run_group(self, row: Any) -> Any:
        group = self.started
        self.started += 1
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.starts.append((self.running, self.client.endpoints[0].limit))
        try:
            for stage in range(self.stages):
                await asyncio.gather(
                    *(
                        self.client.complete([group, stage, k], {"max_tokens": 1}, "m", priority=(group, stage))
                        for k in range(self.width)
                    )
                )
                for _ in range(3):  # between two stages: no slot held for a moment
                    await asyncio.sleep(0)
            return row
        finally:
            self.client.budget.finished(group)
            self.running -= 1

    def settle(self, group: Any) -> None: ...


async def answer(method: str, url: str, body: bytes | None) -> tuple[int, bytes]:
    for _ in range(40):  # a call takes a few turns of the loop: long enough for admission to fill the slots
        await asyncio.sleep(0)
    return 200, ANSWER


def run(width: int, limits: list[int], rows: int = 60, shrink_at: int | None = None) -> Groups:
    """`rows` groups through `depth_first` on endpoints with `limits` (--concurrency auto's per-endpoint caps);
    at group `shrink_at`, every endpoint's limit is halved, as its /metrics would move it."""

    async def go() -> Groups:
        nonlocal shrink_at
        urls = [f"http://127.0.0.1:{i + 1}" for i in range(len(limits))]
        client = CompletionClient(urls, settings(concurrency=None), transport=FunctionTransport(answer))
        for endpoint, limit in zip(client.endpoints, limits, strict=True):
            endpoint.limit = limit
        groups = Groups(client, width)
        try:
            async for _ in depth_first(groups, client.budget, range(rows)):
                if shrink_at is not None and groups.started >= shrink_at:
                    for endpoint in client.endpoints:
                        endpoint.limit //= 2
                    shrink_at = None
        finally:
            await client.aclose()
        return groups

    return asyncio.run(go())


def test_groups_in_flight_are_bounded_by_the_endpoints_current_limits():
    groups = run(width=1, limits=[3, 3])
    assert groups.started == 60 and groups.peak == 6  # one call each: as many groups as the servers run at once


def test_a_new_group_starts_only_when_the_groups_in_flight_cannot_fill_the_free_slots():
    groups = run(width=4, limits=[8, 8])
    # four calls each on 16 slots: four groups fill them; a group between two stages keeps its room
    assert groups.started == 60 and groups.peak == 4


def test_the_bound_follows_the_limits_as_they_move():
    groups = run(width=2, limits=[8, 8], rows=120, shrink_at=30)
    before = [running for running, limit in groups.starts if limit == 8]
    after = [running for running, limit in groups.starts[32:]]  # the one asked for before the limits moved aside
    assert groups.started == 120 and max(before) == 8 and max(after) == 4
