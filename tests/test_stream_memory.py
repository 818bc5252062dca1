"""Memory stays flat: a stream holds only the groups in flight, never those it has handed over."""

from __future__ import annotations

import asyncio
import gc

import agentroll
from agentroll.record.group import Group

from .conftest import TOKENIZER


def test_a_stream_keeps_no_group_it_has_handed_over(sim):
    rows = [{"id": f"r{i}", "prompt": f"What is {i} plus 1?", "label": str(i + 1)} for i in range(40)]

    async def go() -> list[int]:
        alive = []
        async with agentroll.Generator(base_url=sim.url, tokenizer=TOKENIZER, num_parallel=2, reward="exact") as gen:
            async for seen, _ in enumerate_async(gen.stream(rows, max_ahead=2)):
                if seen % 10 == 9:
                    gc.collect()
                    alive.append(sum(type(o) is Group for o in gc.get_objects()))
        return alive

    alive = asyncio.run(go())
    assert len(alive) == 4 and max(alive) <= 4, alive  # the one held here and the two in flight, not 10, 20...


async def enumerate_async(source):
    i = 0
    async for item in source:
        yield i, item
        i += 1
