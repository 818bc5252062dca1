"""Warnings that come once per item (a group not written) folded: a few said in full, then counts per reason.

A record logged with `extra={"fold": (kind, reason)}` is one of a kind (`kind` in the plural: "groups not
written"). The first `first` of each kind are said as they are; later ones are counted by reason and said as one
line every `every_s` seconds (when the next one of the kind comes, or on the CLI's timer: `due`) and at the end
(`said`), so a run where many groups fail keeps a screen a person can read and still accounts for every one of
them. Other records pass untouched (`console.Repeats` folds exact repeats).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable

MOST_REASONS = 4  # reasons named on one line; the rest are counted together


class Folds(logging.Filter):
    def __init__(self, first: int = 3, every_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.first, self.every_s, self.clock = first, every_s, clock
        self.seen: Counter[str] = Counter()
        self.pending: dict[str, Counter[str]] = {}
        self.last: dict[str, float] = {}  # when each kind was last said

    def filter(self, record: logging.LogRecord) -> bool:
        fold = getattr(record, "fold", None)
        if fold is None:
            return True
        kind, reason = fold
        self.seen[kind] += 1
        now = self.clock()
        if self.seen[kind] <= self.first:
            self.last[kind] = now
            if self.seen[kind] == self.first:
                record.msg = f"{record.msg} (more of these are counted, then said together)"
            return True
        self.pending.setdefault(kind, Counter())[reason] += 1
        if now - self.last.get(kind, now) < self.every_s:
            return False
        self.last[kind] = now
        record.msg, record.args = self._line(kind), ()
        return True

    def _line(self, kind: str) -> str:
        reasons = self.pending.pop(kind)
        named = reasons.most_common(MOST_REASONS)
        parts = [f"{n}x {reason}" for reason, n in named]
        rest = sum(reasons.values()) - sum(n for _, n in named)
        if rest:
            parts.append(f"{rest}x for other reasons")
        return f"{kind}: {sum(reasons.values())} more ({'; '.join(parts)}), {self.seen[kind]} in all so far"

    def due(self) -> list[str]:
        """The counts of the kinds last said `every_s` ago or more, for a timer: a burst of failures followed by
        quiet is still said within the period, not only at the end."""
        now = self.clock()
        lines = []
        for kind in [k for k, reasons in self.pending.items() if reasons]:
            if now - self.last.get(kind, now) >= self.every_s:
                self.last[kind] = now
                lines.append(self._line(kind))
        return lines

    def said(self) -> list[str]:
        """The counts not said yet, one line per kind, for the end of the run."""
        return [self._line(kind) for kind in list(self.pending) if self.pending[kind]]


__all__ = ["Folds"]
