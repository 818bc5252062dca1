"""Depth-first admission: which problem starts next, so that groups finish about in the order they started.

A new group starts only when the groups in flight cannot fill the free completion slots (and the last one started
has placed its first call); the calls of older groups take slots first (`client.Budget`), so a run commits
groups steadily instead of all at its end, and a stop loses little. The groups in flight or waiting to be taken
are at most what the servers can run now (the endpoints' current limits added up), and at most `max_ahead`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterable, Iterable
from typing import Any, Protocol

from agentroll.client import Budget
from agentroll.errors import UsageError
from agentroll.inputs import Problem
from agentroll.record.group import Group


class GroupRunner(Protocol):
    """What admission needs of a `Generator`."""

    @property
    def next_group(self) -> int:
        """The number the next group started gets (its calls' priority: older first)."""
        ...

    def problem(self, row: Any) -> Problem: ...

    async def run_group(self, row: Problem) -> Group: ...

    def settle(self, group: Group) -> None: ...


async def depth_first(
    source_of: GroupRunner,
    budget: Budget,
    rows: Iterable[Any] | AsyncIterable[Any],
    max_ahead: int | None = None,
    ordered: bool = False,
) -> AsyncGenerator[Group, None]:
    """`Generator.stream`: the groups of `rows` as they finish, or in input order with `ordered` (a reorder
    buffer inside the same bound), each settled when the next one is asked for. A slow consumer slows the
    producer. A row that fails validation raises after the groups already started are yielded; leaving the loop
    early cancels the groups still running."""
    if max_ahead is not None and max_ahead < 1:
        raise UsageError("max_ahead must be at least 1")
    pending: set[asyncio.Future[Any]] = set()
    finished: asyncio.Queue[asyncio.Future[Any] | None] = asyncio.Queue()  # None: the budget has room again
    source = _rows(rows)
    fetch: asyncio.Future[Any] | None = None  # the next row, awaited alongside the groups in flight
    row_error: BaseException | None = None
    exhausted = False
    order: dict[asyncio.Future[Any], int] = {}  # with `ordered`: each group's place in the input
    ready: dict[int, asyncio.Future[Any]] = {}  # finished, waiting for the groups before them
    started = handed = 0
    warming = -1  # the number of the last group started: admission waits until it has asked for a slot
    warming_task: asyncio.Future[Any] | None = None
    told = False

    def room() -> None:
        nonlocal told
        if not told:
            told = True
            finished.put_nowait(None)

    def admit() -> bool:
        if fetch is not None or exhausted or row_error is not None:
            return False
        bound = min(budget.capacity, max_ahead) if max_ahead is not None else budget.capacity
        if len(pending) >= max(1, bound):
            return False
        placed = budget.newest_group >= warming or warming_task is None or warming_task.done()
        return not pending or (placed and budget.spare())

    budget.listeners.append(room)
    try:
        while True:
            if admit():
                fetch = asyncio.ensure_future(anext(source))
                fetch.add_done_callback(finished.put_nowait)
            if not pending and fetch is None:
                break
            task = await finished.get()
            if task is None:
                told = False
                continue
            if task is fetch:
                fetch = None
                try:
                    problem = source_of.problem(task.result())
                except StopAsyncIteration:
                    exhausted = True
                except Exception as exc:  # a bad row: finish what was started, then raise it
                    row_error = exc
                else:
                    warming = source_of.next_group
                    group = warming_task = asyncio.create_task(source_of.run_group(problem))
                    group.add_done_callback(finished.put_nowait)
                    pending.add(group)
                    order[group], started = started, started + 1
            elif not ordered:  # while the consumer holds a group, nothing new starts
                pending.discard(task)
                del order[task]  # kept, it would hold every finished group: memory growing with the input
                done = task.result()
                yield done
                source_of.settle(done)  # the next one is asked for: this one is stored
            else:
                ready[order.pop(task)] = task
                while handed in ready:
                    head = ready.pop(handed)
                    pending.discard(head)
                    handed += 1
                    done = head.result()
                    yield done
                    source_of.settle(done)
        if row_error is not None:
            raise row_error
    finally:
        budget.listeners.remove(room)
        leftovers = [*pending, *([fetch] if fetch is not None else [])]
        for task in leftovers:
            task.remove_done_callback(finished.put_nowait)
            task.cancel()
        await asyncio.gather(*leftovers, return_exceptions=True)
        while not finished.empty():  # finished, never handed over: an error that ends the run is raised
            task = finished.get_nowait()  # once; the others are not worth a warning
            if task is not None and not task.cancelled():
                task.exception()
        await source.aclose()


async def _rows(rows: Iterable[Any] | AsyncIterable[Any]) -> AsyncGenerator[Any, None]:
    if isinstance(rows, AsyncIterable):
        async for row in rows:
            yield row
    else:
        for row in rows:
            yield row
