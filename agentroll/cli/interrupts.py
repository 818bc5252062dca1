"""What SIGINT and SIGTERM mean to `generate`, from the start of the command to its exit code."""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("agentroll")

DOUBLE_S = 1.0  # two interrupts this close are one said twice (a terminal's, `timeout -s INT`'s)
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    """What a SIGINT or SIGTERM means, from the start of a command to its exit code: the first stops the run
    cleanly (`stop`; the folder stays resumable), the same one said again within DOUBLE_S is ignored, a later one
    stops at once (`kill`, then exit). Once `settled()` (the folder is closed `complete: true`) none changes the
    exit. Installed with `signal.signal` for the whole command rather than as the event loop's handlers, so no
    moment between the loop's end and the exit code (the summary, the loop's own shutdown) falls back to the
    default action."""

    def __init__(self, settled: Callable[[], bool] = lambda: False, clock: Callable[[], float] = time.monotonic):
        self.settled, self.clock = settled, clock
        self.first: int | None = None
        self.at = -math.inf
        self.late: int | None = None  # a signal once the folder was complete: it changes nothing
        self.stop: Callable[[int], None] | None = None  # how to stop the run cleanly; None: raise KeyboardInterrupt
        self.kill: Callable[[], None] = lambda: None  # what a second interrupt does before exiting
        self._previous: dict[int, Any] = {}

    def take(self, signum: int) -> str:
        """`first`, `echo` (the first said again within DOUBLE_S) or `again`."""
        now = self.clock()
        if self.first is None:
            self.first, self.at = signum, now
            return "first"
        return "echo" if now - self.at < DOUBLE_S else "again"

    def __call__(self, signum: int, _frame: object = None) -> None:
        if self.settled():
            self.late = signum
            return
        kind = self.take(signum)
        if kind == "echo":
            log.debug("%s again within %.0fs: taken as the same interrupt", signal.Signals(signum).name, DOUBLE_S)
            return
        if kind == "again":
            log.error("second interrupt: stopping at once")
            self.kill()
            os._exit(128 + signum)
        if self.stop is None:
            raise KeyboardInterrupt
        self.stop(signum)

    @property
    def code(self) -> int | None:
        """The exit code the signal gives (None: none came, or only once the folder was complete)."""
        return 128 + self.first if self.first is not None else None

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():  # an embedding caller's thread: not ours to do
            self._previous = {signum: signal.signal(signum, self) for signum in SIGNALS}

    def restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
