"""Progress on a terminal (a rich bar and a status line) or in a log (a timestamped line every 10 seconds)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from rich.console import Group as RenderGroup
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

from ..client import ClientCounters
from ..record.stats import RunStats
from ..run.progress import Progress as ProgressHook
from ..run.progress import Rates, count_parts, counts, done_line, duration, rates_line, worked
from .console import err, log, packed


class RichBar(ProgressHook):
    """On a terminal: a bar of groups settled (written, filtered, failed, invalid or already done) out of the rows
    to read, with the ETA and the time elapsed, and under it the rates, the calls in flight, the running reward
    and the failures, broken between phrases to the terminal's width (never inside one)."""

    interval_s = 0.5

    def __init__(self) -> None:
        self.bar = Progress(
            TextColumn("groups"),
            BarColumn(bar_width=None),
            MofNCompleteColumn(),
            TextColumn("{task.fields[times]}", markup=False),
            console=err,
            expand=True,
        )
        self.task = self.bar.add_task("gen", total=None, times="")
        self.status = Text("")
        self.live = Live(RenderGroup(self.bar, self.status), console=err, transient=True, refresh_per_second=2)
        self.rates = Rates()
        self.total: int | None = None

    def start(self, total: int | None, requests: int = 0) -> None:
        self.total = total
        self.rates = Rates(requests=requests)
        self.bar.update(self.task, total=total)
        self.live.start()

    def advance(self, stats: RunStats, requests: ClientCounters) -> None:
        self.rates.add(worked(stats), requests.requests)
        eta = duration(self.rates.eta_s(self.total, stats.groups_settled))
        self.bar.update(
            self.task, completed=stats.groups_settled, times=f"ETA {eta}, elapsed {duration(self.rates.elapsed_s())}"
        )
        self.status.plain = packed([rates_line(self.rates), *count_parts(stats, requests)], err.width)

    def stop(self) -> None:
        self.live.stop()


class LogLines(ProgressHook):
    """No terminal (cron, CI): a timestamped line at the start, at least every `every_s` seconds, and at the end,
    each with done/total, rates and ETA. The next line is due `every_s` after the last; the runner's ticker is
    asked to wake `EARLY_S` before that (`interval_s`), so a tick that comes a little late still keeps the gap
    within `every_s`."""

    EARLY_S = 0.25

    def __init__(self, every_s: float = 10.0, clock: Callable[[], float] | None = None) -> None:
        self.every_s, self.clock = every_s, clock or time.monotonic
        self.due = -math.inf  # when the next line is due
        self.rates = Rates(started=self.clock())
        self.total: int | None = None
        self.seen: tuple[RunStats, ClientCounters] | None = None
        self.said: str | None = None  # the last line said

    @property
    def interval_s(self) -> float:
        return max(0.01, min(1.0, self.due - self.EARLY_S - self.clock()))

    def start(self, total: int | None, requests: int = 0) -> None:
        """The first line comes with the first `advance` (the runner's, at once: with the groups a resume
        found on disk already)."""
        self.total = total
        self.rates = Rates(started=self.clock(), requests=requests)

    def advance(self, stats: RunStats, requests: ClientCounters) -> None:
        self.seen = (stats, requests)
        now = self.clock()
        self.rates.add(worked(stats), requests.requests, now)
        if now >= self.due - self.EARLY_S:
            self._say()

    def _line(self) -> str:
        assert self.seen is not None
        stats, requests = self.seen
        return f"{done_line(stats, requests, self.total, self.rates, self.clock())}; {counts(stats, requests)}"

    def _say(self, line: str | None = None) -> None:
        self.due = self.clock() + self.every_s
        self.said = line or self._line()
        log.info("progress: %s", self.said)

    def stop(self) -> None:
        if self.seen is not None:
            self._say()

    def finish(self, stats: RunStats, requests: ClientCounters) -> None:
        """The last line, with the end's figures; not twice when the line just said has them (a resume with
        every group done says its first line and ends)."""
        self.seen = (stats, requests)
        self.rates.add(worked(stats), requests.requests, self.clock())
        line = self._line()
        if line != self.said:
            self._say(line)
