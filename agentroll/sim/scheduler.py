"""The capacity model: a bounded batch of running requests and a FIFO queue in front of it, as vLLM schedules.

vLLM never answers 429: a request it cannot run yet waits, and `/metrics` shows it as waiting. A client's
concurrency limit is only realistic if the server makes it wait the same way, so the simulator admits at most
`max_running` requests at once, and only while their KV blocks (prompt and answer, in 16-token blocks) fit.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

BLOCK_TOKENS = 16  # vLLM's default KV-cache block size


class Scheduler:
    def __init__(self, max_running: int, kv_blocks: int, on_change: Callable[[], None] = lambda: None) -> None:
        if max_running < 1 or kv_blocks < 1:
            raise ValueError(f"max_running and kv_blocks must be at least 1, got {max_running} and {kv_blocks}")
        self.max_running, self.kv_blocks, self.on_change = max_running, kv_blocks, on_change
        self.running = 0
        self.used_blocks = 0
        self._waiting: collections.deque[tuple[asyncio.Future[None], int]] = collections.deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def kv_usage(self) -> float:
        return self.used_blocks / self.kv_blocks if self.kv_blocks else 0.0

    def _fits(self, blocks: int) -> bool:
        return self.running < self.max_running and self.used_blocks + blocks <= self.kv_blocks

    @asynccontextmanager
    async def slot(self, tokens: int) -> AsyncIterator[None]:
        """Hold a running slot (and the request's KV blocks) for the duration of the block; wait FIFO before."""
        blocks = min(-(-tokens // BLOCK_TOKENS), self.kv_blocks)  # one request alone always fits
        if self._waiting or not self._fits(blocks):
            ticket: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiting.append((ticket, blocks))
            self.on_change()
            try:
                await ticket
            except asyncio.CancelledError:  # the client left while queued (or the server is closing)
                if ticket.done() and not ticket.cancelled():
                    self._release(blocks)  # admitted in the same turn it was cancelled: give the slot back
                else:
                    with contextlib.suppress(ValueError):  # already skipped by _admit
                        self._waiting.remove((ticket, blocks))
                    self._admit()  # a large request at the head may have been holding smaller ones back
                    self.on_change()
                raise
        else:
            self._take(blocks)
        try:
            yield
        finally:
            self._release(blocks)

    def _take(self, blocks: int) -> None:
        self.running += 1
        self.used_blocks += blocks
        self.on_change()

    def _release(self, blocks: int) -> None:
        self.running -= 1
        self.used_blocks -= blocks
        self._admit()
        self.on_change()

    def _admit(self) -> None:
        """Admit from the head of the queue, in order, while the head fits (no overtaking: strict FIFO)."""
        while self._waiting:
            ticket, blocks = self._waiting[0]
            if not ticket.cancelled() and not self._fits(blocks):
                break
            self._waiting.popleft()
            if not ticket.cancelled():  # a cancelled one is its client gone: skip it
                self._take(blocks)
                ticket.set_result(None)
