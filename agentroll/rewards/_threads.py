"""The threads that run a user's sync tools: at most `size`, started on demand. (A sync reward function runs in
worker processes instead, which can be killed: `function.py`.)

Not the event loop's default executor: a few calls that hang would hold its threads, and everything else that
runs there (reading the input, loading the tokenizer) would wait behind them. Not a `ThreadPoolExecutor`
either: it joins its threads at interpreter exit, so one call that never returns would keep agentroll from
exiting. A hung call keeps its thread for good (Python cannot kill a thread), so it starves this pool alone;
once every thread is held by a call past its timeout, the calls still waiting fail with `PoolExhausted` instead
of waiting for good: the run ends (exit 5) with one line naming the stuck calls (`toolcalls/tools.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("agentroll")


class _Call:
    __slots__ = ("argument", "function", "future", "loop", "returned", "started")

    def __init__(self, function: Callable[[Any], Any], argument: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.function, self.argument, self.loop = function, argument, loop
        self.future: asyncio.Future[Any] = loop.create_future()
        self.started: float | None = None  # time.monotonic() when a thread took it
        self.returned = False


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.done():  # the caller timed out or gave up
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


def _work(jobs: queue.SimpleQueue[_Call | None], idle: threading.Semaphore, pool: CallThreads) -> None:
    while (call := jobs.get()) is not None:
        if not call.future.cancelled():  # read from another thread: at worst a dropped call runs anyway
            call.started = time.monotonic()
            result: Any = None
            error: BaseException | None = None
            try:
                result = call.function(call.argument)
            except Exception as exc:
                error = exc
            except BaseException as exc:  # SystemExit and the like must not end the thread silently
                error = RuntimeError(f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for this any more
                call.loop.call_soon_threadsafe(_settle, call.future, result, error)
            pool.finished(call)
            del call, result, error
        idle.release()


class PoolExhausted(Exception):
    """Every thread is held by a call past its timeout: nothing queued will ever run."""

    def __init__(self, size: int, stuck: list[Any]) -> None:
        super().__init__(f"all {size} threads are held by calls past the timeout")
        self.size, self.stuck = size, stuck


class CallThreads:
    def __init__(self, size: int, name: str = "agentroll-reward") -> None:
        self.size = max(1, size)
        self.name = name
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads = 0
        self._overdue: set[_Call] = set()  # timed out, still running

    async def run(self, function: Callable[[Any], Any], argument: Any, timeout_s: float) -> Any:
        """`function(argument)` in one of the threads. The timeout counts from when a thread starts the call, not
        while it waits for a thread. Raises asyncio.TimeoutError past it (the call's later result is thrown away),
        and `PoolExhausted` while it waits for a thread that every hung call keeps."""
        call = _Call(function, argument, asyncio.get_running_loop())
        self._jobs.put(call)
        self._add_thread()
        try:
            while True:
                started = call.started
                if started is None and self._exhausted():
                    raise PoolExhausted(self.size, self._stuck())
                left = timeout_s if started is None else started + timeout_s - time.monotonic()
                if left > 0:
                    if (await asyncio.wait((call.future,), timeout=left))[0]:
                        return call.future.result()
                    continue  # it overran, or it is still waiting for a thread
                self._overran(call)
                raise asyncio.TimeoutError  # not the builtin: they differ before Python 3.11
        finally:
            call.future.cancel()  # no-op when done; a queued call is skipped, a running one's result ignored

    def _add_thread(self) -> None:
        if self._idle.acquire(blocking=False):
            return
        with self._lock:
            if self._threads < self.size:
                self._threads += 1
                threading.Thread(
                    target=_work, args=(self._jobs, self._idle, self), daemon=True, name=f"{self.name}-{self._threads}"
                ).start()

    def _overran(self, call: _Call) -> None:
        """A call past its timeout; the calls still waiting for a thread see it when they next wake (within a
        timeout), and give up once every thread is held so."""
        with self._lock:
            if not call.returned:
                self._overdue.add(call)

    def _exhausted(self) -> bool:
        with self._lock:
            return len(self._overdue) >= self.size

    def _stuck(self) -> list[Any]:
        with self._lock:
            return [c.argument for c in self._overdue]

    def finished(self, call: _Call) -> None:
        with self._lock:
            call.returned = True
            self._overdue.discard(call)

    def close(self) -> None:
        """Let the threads end once their calls return; later calls start new ones."""
        with self._lock:
            jobs, threads = self._jobs, self._threads
            self._jobs, self._idle, self._threads = queue.SimpleQueue(), threading.Semaphore(0), 0
            self._overdue = set()
        for _ in range(threads):
            jobs.put(None)
