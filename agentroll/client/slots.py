"""Completion slots, granted best priority first, and the counters every client of a run shares.

A call asks for a slot with a priority: (its group's admission number, its stage's rank), lower first. When
slots are scarce the calls of older groups go first, so groups finish in about the order they started and are
committed steadily (depth first), instead of all together at the end. Within a group an earlier stage goes
first: the group is written when its last execution ends, and the one still at an earlier stage has the most
work left (critical path first). A grant picks the endpoint at once, in
the releasing call's own step, so the counts it compares are current and no slot is taken twice.

`Budget` is the run's: a fixed --concurrency caps every client of the run together (a stage on a server of its
own too), and its counters add them up. Under --concurrency auto each endpoint's own limit is the cap.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from .endpoints import Endpoint

Priority = tuple[int, int]
FIRST: Priority = (-1, 0)  # calls outside any group (start-up probes) go before every group's


@dataclass(slots=True)
class ClientCounters:
    requests: int = 0
    retries: int = 0
    failures: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    concurrency: dict[str, int] = field(default_factory=dict)  # --concurrency auto: each endpoint's limit now
    queued: int = 0  # calls waiting for a slot


@dataclass(slots=True)
class Waiter:
    future: asyncio.Future[Endpoint]
    prefer: Endpoint | None
    avoid: Endpoint | None
    key: str | None
    group: int = -1


class Queue:
    """One client's waiting calls; `choose` gives an endpoint of that client with room for one more, or None."""

    def __init__(self, choose: Callable[[Waiter | None], Endpoint | None]) -> None:
        self.choose = choose
        self.heap: list[tuple[Priority, int, Waiter]] = []

    def head(self) -> tuple[Priority, int, Waiter] | None:
        while self.heap and self.heap[0][2].future.done():  # cancelled while waiting
            heapq.heappop(self.heap)
        return self.heap[0] if self.heap else None


class Budget:
    """The run's slots: `fixed` requests in flight at most over all its clients (None: each endpoint's limit)."""

    def __init__(self, fixed: int | None = None) -> None:
        self.fixed = fixed
        self.counters = ClientCounters()
        self.queues: list[Queue] = []
        self.endpoints: list[Endpoint] = []  # every client's, for the capacity
        self.newest_group = -1  # the highest group number a call has asked with
        # per group in flight: its calls holding slots now, and the most it has held at once. A group holding
        # none (between two stages: rendering, scoring) will soon want about as many again: `spare` keeps that
        # room for it rather than let a new group take it
        self.active: dict[int, int] = {}
        self.width: dict[int, int] = {}
        self.resting: dict[int, int] = {}  # calls of the group waiting out a retry's backoff: it wants no room yet
        self.between = 0  # the widths of the groups between two stages now (no slot held, none resting), added up
        self.listeners: list[Callable[[], None]] = []  # told of a free slot nobody waits for, or a new group
        self._order = itertools.count()

    def join(self, queue: Queue, endpoints: list[Endpoint]) -> None:
        self.queues.append(queue)
        self.endpoints.extend(endpoints)

    @property
    def capacity(self) -> int:
        """Requests the servers can run now: --concurrency, or the live endpoints' current limits added up."""
        if self.fixed is not None:
            return self.fixed
        total = sum(e.limit for e in self.endpoints if not e.down)
        return int(min(total, 1 << 30)) if math.isfinite(total) else 1 << 30

    def full(self) -> bool:
        return self.fixed is not None and self.counters.in_flight >= self.fixed

    def waiting(self) -> int:
        return sum(len(q.heap) for q in self.queues)

    def spare(self) -> bool:
        """A slot is free and no call waits for one, beyond the room the groups between two stages will want
        back: the groups in flight do not fill the servers."""
        if self.full() or not all(q.head() is None for q in self.queues):
            return False
        return self.counters.in_flight + self.between < self.capacity

    def _between(self, group: int) -> bool:
        return group in self.width and not self.active.get(group) and not self.resting.get(group)

    def _change(self, group: int, active: int = 0, resting: int = 0) -> None:
        """Move a group's counts, keeping `between` the sum of the widths of the groups between two stages."""
        if self._between(group):
            self.between -= self.width[group]
        if active:
            self.active[group] = self.active.get(group, 0) + active
            self.width[group] = max(self.width.get(group, 0), self.active[group])
        if resting:
            self.resting[group] = self.resting.get(group, 0) + resting
        if self._between(group):
            self.between += self.width[group]

    def rest(self, group: int, resting: bool) -> None:
        """A call of `group` starts (or ends) waiting out its backoff: the room it would take waits too."""
        if group >= 0 and (resting or self.resting.get(group)):  # a settled group's end of rest: nothing to undo
            self._change(group, resting=1 if resting else -1)

    def finished(self, group: int) -> None:
        """The group is settled: it wants no more room."""
        if self._between(group):
            self.between -= self.width[group]
        for counts in (self.width, self.active, self.resting):
            counts.pop(group, None)

    def enqueue(self, queue: Queue, priority: Priority, waiter: Waiter) -> None:
        heapq.heappush(queue.heap, (priority, next(self._order), waiter))
        self.counters.queued = self.waiting()

    def started(self, group: int) -> None:
        if group > self.newest_group:
            self.newest_group = group
            self._tell()

    def dispatch(self) -> None:
        """Grant free slots to the best waiting calls, each with its endpoint chosen now."""
        while not self.full():
            best: tuple[tuple[Priority, int, Waiter], Queue, Endpoint] | None = None
            for queue in self.queues:
                head = queue.head()
                if head is None or (best is not None and head >= best[0]):
                    continue
                endpoint = queue.choose(head[2])
                if endpoint is not None:
                    best = (head, queue, endpoint)
            if best is None:
                break
            (_, _, waiter), queue, endpoint = best
            heapq.heappop(queue.heap)
            self.take(endpoint, waiter.group)
            waiter.future.set_result(endpoint)
        self.counters.queued = self.waiting()
        if self.spare():
            self._tell()

    def take(self, endpoint: Endpoint, group: int = -1) -> None:
        c = self.counters
        c.in_flight += 1
        c.peak_in_flight = max(c.peak_in_flight, c.in_flight)
        endpoint.in_flight += 1
        if group >= 0:
            self._change(group, active=1)

    def release(self, endpoint: Endpoint, group: int = -1) -> None:
        self.counters.in_flight -= 1
        endpoint.in_flight -= 1
        if group >= 0 and self.active.get(group):
            self._change(group, active=-1)
        self.dispatch()

    def _tell(self) -> None:
        for listener in self.listeners:
            listener()

    def fail_all(self, queue: Queue, error: BaseException) -> None:
        """Every call waiting in `queue` fails with `error` (its endpoints stayed down too long)."""
        for _, _, waiter in queue.heap:
            if not waiter.future.done():
                waiter.future.set_exception(error)
        queue.heap.clear()
        self.counters.queued = self.waiting()
