"""The capacity model: a bounded batch of running requests and a queue in front of it, as vLLM schedules.

vLLM never answers 429: a request it cannot run yet waits, and `/metrics` shows it as waiting. A client's
concurrency limit is only realistic if the server makes it wait the same way, so the simulator admits at most
`max_running` requests at once, and only while their KV blocks (prompt and answer, in 16-token blocks) fit.

The queue is first come, first served, or under `vllm serve --scheduling-policy priority` ordered by each
request's `priority` (lower first), then arrival.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

BLOCK_TOKENS = 16  # vLLM's default KV-cache block size


class Scheduler:
    def __init__(
        self, max_running: int, kv_blocks: int, on_change: Callable[[], None] = lambda: None, policy: str = "fcfs"
    ) -> None:
        if max_running < 1 or kv_blocks < 1:
            raise ValueError(f"max_running and kv_blocks must be at least 1, got {max_running} and {kv_blocks}")
        if policy not in ("fcfs", "priority"):
            raise ValueError(f"scheduling policy must be fcfs or priority, not {policy!r}")
        self.max_running, self.kv_blocks, self.on_change, self.policy = max_running, kv_blocks, on_change, policy
        self.running = 0
        self.used_blocks = 0
        self.admitted: list[int] = []  # the priorities of the requests admitted, in order (tests read it)
        self._waiting: list[tuple[int, int, asyncio.Future[None], int]] = []  # (priority, arrival, ticket, blocks)
        self._arrival = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.kv_blocks if self.kv_blocks else 0.0

    def _fits(self, blocks: int) -> bool:
        return self.running < self.max_running and self.used_blocks + blocks <= self.kv_blocks

    @asynccontextmanager
    async def slot(self, tokens: int, priority: int = 0) -> AsyncIterator[None]:
        """Hold a running slot (and the request's KV blocks) for the duration of the block; wait in turn before."""
        blocks = min(-(-tokens // BLOCK_TOKENS), self.kv_blocks)  # one request alone always fits
        order = priority if self.policy == "priority" else 0
        if self._waiting or not self._fits(blocks):
            ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            entry = (order, next(self._arrival), ticket, blocks)
            heapq.heappush(self._waiting, entry)
            self.on_change()
            try:
                await ticket
            except asyncio.CancelledError:  # the client left while queued (or the server is closing)
                if ticket.done() and not ticket.cancelled():
                    self._release(blocks)  # admitted in the same turn it was cancelled: give the slot back
                else:
                    with contextlib.suppress(ValueError):  # already skipped by _admit
                        self._waiting.remove(entry)
                        heapq.heapify(self._waiting)
                    self._admit()  # a large request at the head may have been holding smaller ones back
                    self.on_change()
                raise
        else:
            self._take(blocks, order)
        try:
            yield
        finally:
            self._release(blocks)

    def _take(self, blocks: int, order: int = 0) -> None:
        self.admitted.append(order)
        self.running += 1
        self.used_blocks += blocks
        self.on_change()

    def _release(self, blocks: int) -> None:
        self.running -= 1
        self.used_blocks -= blocks
        self._admit()
        self.on_change()

    def _admit(self) -> None:
        """Admit from the head of the queue, in order, while the head fits (no overtaking)."""
        while self._waiting:
            order, _, ticket, blocks = self._waiting[0]
            if not ticket.cancelled() and not self._fits(blocks):
                break
            heapq.heappop(self._waiting)
            if not ticket.cancelled():  # a cancelled one is its client gone: skip it
                self._take(blocks, order)
                ticket.set_result(None)
