"""What a run tells a person while it works: the figures, the rates, the ETA, in words both renderers share.

The runner calls `Progress.advance` on every settled group and, from its start, every `interval_s` seconds on a
ticker, so a bar moves (and a log line comes) even while no group has finished yet. The CLI renders a rich bar
on a terminal and timestamped lines elsewhere (cron, CI); a `--ray` partition sends JSON lines to its driver.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from agentroll.client import ClientCounters
from agentroll.record.stats import RunStats


class Progress:
    """A run's progress hook (the default says nothing)."""

    @property
    def interval_s(self) -> float:
        """How long the runner's ticker waits before it next calls `advance` between groups."""
        return 1.0

    def start(self, total: int | None, requests: int = 0) -> None:
        """The run starts its work on `total` rows (None: unknown), `requests` made already (the start-up's
        probes, which no rate counts)."""

    def advance(self, stats: RunStats, requests: ClientCounters) -> None: ...
    def stop(self) -> None: ...

    def finish(self, stats: RunStats, requests: ClientCounters) -> None:
        """The run's last figures, then `stop`: what is shown last is the end, also of a run that ended before
        its first tick (a resume with everything done)."""
        self.advance(stats, requests)
        self.stop()


def worked(stats: RunStats) -> int:
    """Groups settled by this run's own work: the rates leave out those a resume found on disk already and the
    rows refused (read and passed over at once), which the ETA still counts as done."""
    return stats.groups_settled - stats.problems_skipped_done - stats.rows_refused


@dataclass
class Rates:
    """Groups and requests per second over the last `window_s` (since the start until then), and an ETA. `add`
    takes the groups this run made (`worked`); `eta_s` the groups done in all."""

    window_s: float = 60.0
    started: float = field(default_factory=lambda: time.monotonic())
    requests: int = 0  # made before the start (the start-up's probes): no rate counts them
    _samples: deque[tuple[float, int, int]] = field(default_factory=deque)

    def add(self, groups: int, requests: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        samples = self._samples
        if not samples:
            samples.append((self.started, 0, self.requests))
        samples.append((now, groups, requests))
        while len(samples) > 2 and samples[1][0] < now - self.window_s:
            samples.popleft()

    def _span(self) -> tuple[float, int, int]:
        if len(self._samples) < 2:
            return 0.0, 0, 0
        (t0, g0, r0), (t1, g1, r1) = self._samples[0], self._samples[-1]
        return t1 - t0, g1 - g0, r1 - r0

    @property
    def groups_per_s(self) -> float:
        span, groups, _ = self._span()
        return groups / span if span > 0 else 0.0

    @property
    def requests_per_s(self) -> float:
        span, _, requests = self._span()
        return requests / span if span > 0 else 0.0

    def elapsed_s(self, now: float | None = None) -> float:
        return (time.monotonic() if now is None else now) - self.started

    def eta_s(self, total: int | None, done: int) -> float | None:
        rate = self.groups_per_s
        if total is None or rate <= 0:
            return None
        return max(0.0, total - done) / rate


def duration(seconds: float | None) -> str:
    """`1h02m`, `4m05s`, `12s`; `-` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def counts(stats: RunStats, requests: ClientCounters) -> str:
    """Calls in flight and waiting, the running reward and accuracy, and each kind of failure by its name."""
    return "; ".join(count_parts(stats, requests))


def count_parts(stats: RunStats, requests: ClientCounters) -> list[str]:
    """`counts` as its phrases, for a renderer that breaks lines between them."""
    parts = [
        f"in flight {requests.in_flight}, queued {requests.queued}",
        outcome_phrase(stats),
        f"groups failed {stats.groups_failed}, calls failed {requests.failures}, retries {requests.retries}",
    ]
    said = stats.vocabulary.progress(stats.counters) if stats.vocabulary is not None else None
    if said:  # the system's own (agents running), by the calls in flight it explains
        parts.insert(1, said)
    if stats.invalid_rows:
        parts.append(f"invalid rows {stats.invalid_rows}")
    if stats.calls_replayed:
        parts.append(f"calls replayed {stats.calls_replayed}")
    if stats.reward_timeouts or stats.reward_errors:
        parts.append(f"reward timeouts {stats.reward_timeouts}, errors {stats.reward_errors}")
    return parts


def outcome_phrase(stats: RunStats) -> str:
    """`mean reward 0.500, system accuracy 0.375`; a head-to-head run's per policy (`mean reward a 0.500, b
    0.250, system accuracy a 0.375, b 0.250`), never the two models pooled."""
    if not stats.policies:
        accuracy = stats.report().get("system_accuracy")
        return f"mean reward {_ratio(stats.mean_final_reward)}, system accuracy {_ratio(accuracy)}"
    each = stats.policies.items()
    means = ", ".join(f"{name} {_ratio(s.mean_final_reward)}" for name, s in each)
    accuracies = ", ".join(f"{name} {_ratio(s.report().get('system_accuracy'))}" for name, s in each)
    return f"mean reward {means}, system accuracy {accuracies}"


def rates_line(rates: Rates) -> str:
    """`1.90 groups/s, 52.1 requests/s`."""
    return f"{rates.groups_per_s:.2f} groups/s, {rates.requests_per_s:.1f} requests/s"


def done_line(
    stats: RunStats, requests: ClientCounters, total: int | None, rates: Rates, now: float | None = None
) -> str:
    """`groups 120/315 (38%), 1.90 groups/s, 52.1 requests/s, ETA 1m43s, elapsed 1m03s`."""
    done = stats.groups_settled
    share = f" ({100 * done / total:.0f}%)" if total else ""
    return (
        f"groups {done}/{total if total is not None else '?'}{share}, {rates_line(rates)}, "
        f"ETA {duration(rates.eta_s(total, done))}, elapsed {duration(rates.elapsed_s(now))}"
    )
