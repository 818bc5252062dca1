"""`--judge-mode group`: the executions of a problem's group meet at each reward call, so that the judge sees
their answers together.

Each execution's n-th reward call (per component) is a meeting of the group's executions; the judge is asked
once all that will come have come: every execution of the group but those that ended having made fewer than n
reward calls (a system may stop an execution early, e.g. three-stage with no solver content: it leaves, and
the meetings it will not reach stop waiting for it). A failed execution cancels its group's others, so none
waits for it either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .base import RewardRequest, RewardResult

Ask = Callable[[list[RewardRequest]], Awaitable[list[RewardResult]]]


class _Meeting:
    def __init__(self, key: tuple[Any, ...], count: int, ask: Ask) -> None:
        self.key, self.count, self.ask = key, count, ask  # key: (problem id, content hash, attempt, n, ...)
        self.arrived, self.started = 0, False
        self.shares: list[tuple[int, int, list[RewardRequest]]] = []  # (execution, arrival, its requests)
        self.done: asyncio.Future[list[list[RewardResult]]] = asyncio.get_running_loop().create_future()


class Meetings:
    def __init__(self) -> None:
        self._open: dict[tuple[Any, ...], _Meeting] = {}
        self._left: dict[tuple[Any, ...], list[int]] = {}  # (problem, hash, attempt) -> reward calls of each gone
        self._tasks: set[asyncio.Task[None]] = set()

    async def join(
        self,
        group: tuple[str, str],
        meet: tuple[Any, ...],
        count: int,
        requests: list[RewardRequest],
        ask: Ask,
        execution: int = 0,
    ) -> list[RewardResult]:
        """This execution's share of its meeting's verdict. `meet`: (attempt, n, ...); `count`: the group's
        executions; `ask`: the judge's group request, made once by whoever completes the meeting; `execution`:
        this one's index in the group, the order the judge is shown the answers in (not the order they came)."""
        key = (*group, *meet)
        meeting = self._open.get(key)
        if meeting is None:
            meeting = self._open[key] = _Meeting(key, count, ask)
        arrival = len(meeting.shares)
        meeting.shares.append((execution, arrival, requests))
        meeting.arrived += 1
        if self._due(meeting):
            await self._fire(meeting)
        try:
            results = await asyncio.shield(meeting.done)
        finally:
            if not meeting.started and self._open.get(key) is meeting:
                del self._open[key]  # cancelled before all came (its group failed): a rerun meets afresh
        return results[arrival]

    def leave(self, group: tuple[str, str], attempt: int, made: int, count: int) -> None:
        """An execution of the group ended after `made` reward calls: the later meetings do not wait for it."""
        key = (*group, attempt)
        gone = self._left.setdefault(key, [])
        gone.append(made)
        for meeting in [m for m in self._open.values() if m.key[:3] == key]:
            if self._due(meeting):
                task = asyncio.ensure_future(self._fire(meeting))
                self._tasks.add(task)
                task.add_done_callback(self._settled)
        if len(gone) >= count:
            del self._left[key]

    def _settled(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # the waiters have it, through the meeting's future

    def _due(self, meeting: _Meeting) -> bool:
        gone = sum(1 for made in self._left.get(meeting.key[:3], ()) if made < meeting.key[3])
        return not meeting.started and meeting.arrived >= meeting.count - gone

    async def _fire(self, meeting: _Meeting) -> None:
        meeting.started = True
        self._open.pop(meeting.key, None)
        try:
            shares = sorted(meeting.shares, key=lambda share: share[:2])  # by execution: a rerun asks the same
            verdicts = await meeting.ask([r for _, _, requests in shares for r in requests])
            split: list[list[RewardResult]] = [[] for _ in shares]
            at = 0
            for _, arrival, requests in shares:
                split[arrival], at = verdicts[at : at + len(requests)], at + len(requests)
            meeting.done.set_result(split)
        except BaseException as exc:
            meeting.done.set_exception(exc)
            raise
