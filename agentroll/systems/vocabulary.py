"""What a system's records mean to the tools: its report figures, its folder checks, its inspect labels.

A system names its stages and runs them; only it knows that a selector is judged by its picks, that a reviser's
raw reward is the outcome, or how to name a rewrite in a tree. So the run summary, `stats`, `report`,
`validate` and `inspect` ask the folder's system (`settings.system` in the manifest) for its `Vocabulary`,
and hold no stage name of their own. Every method has a default: a system that declares none still gets each
stage's accuracy, the system's, the generic checks and a stage-by-stage tree.

    class Debate(System):
        stages = ("proposer", "judge")
        vocabulary = DebateWords()      # a Vocabulary subclass, in the same file

The vocabulary is read from the class (the tools never build the system, so its options do not matter).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

from ..record.schema import Sample
from ..record.stats import SYSTEM_ACCURACY, Figure, accuracy

__all__ = ["SYSTEM_ACCURACY", "Chart", "Figure", "Finding", "Label", "Vocabulary", "accuracy"]


@dataclass(frozen=True, slots=True)
class Chart:
    """A section of `agentroll report`'s page: `bars`, figures side by side, and the counters behind them as a
    table (`counts`: label, counter). `needs`: a counter that must be non-zero for the chart to mean anything;
    while it is 0 the page says `missing` instead. `caption` is text, its `{counter}` fields filled in."""

    name: str
    title: str
    bars: tuple[Figure, ...]
    caption: str = ""
    counts: tuple[tuple[str, str], ...] = ()
    needs: str | None = None
    missing: str = ""


@dataclass(frozen=True, slots=True)
class Finding:
    """What a system's check found wrong in one execution: `at` is the record's position in it (0 first);
    `validate` names its shard and line."""

    at: int
    message: str
    kind: str = "execution"


@dataclass(frozen=True, slots=True)
class Label:
    """How `inspect` names one sample: `text` begins its line, before the status and rewards; `mark` ends it."""

    text: str
    mark: str = ""


class Vocabulary:
    """A system's words, each with a default. Subclass it and set `vocabulary = MyWords()` on the system.

    `figures`: report figures (`agentroll.record.stats.Figure`: a counter over a counter), in report order; each stage
    no figure stands for reports its mean raw reward after them, and the system's accuracy comes last.
    `charts`: sections of the report page. `counters`: the names the system counts while it runs
    (`ctx.engine.stats.count`), so a run that never counted one still reports it as 0. `tally`: the counters one
    execution adds (what the figures divide).
    `check`: what is wrong with one execution, for `validate` (given only records of the right schema).
    `heading` and `label`: `inspect`'s words for a stage's branch and for one sample.
    `whole_stage`: a stage's records of one execution are one conversation for its baseline (the agent's
    branches do not continue each other, yet are one attempt), not each chain of `continues` (`agentroll.record.group`).
    `pass_fail`: the outcome (`final_reward`) is 1 when solved, so `group_pass_at_k` and `stats`' pass@k apply;
    False: they are null."""

    whole_stage: ClassVar[bool] = False
    pass_fail: ClassVar[bool] = True
    figures: ClassVar[tuple[Figure, ...]] = ()
    charts: ClassVar[tuple[Chart, ...]] = ()
    counters: ClassVar[tuple[str, ...]] = ()  # what the system counts as it runs (`RunStats.count`): shown at 0 too

    def tally(self, samples: list[Sample]) -> Mapping[str, float]:
        """The system's counters of one execution (booleans count as 0 or 1); every call the same names."""
        return {}

    def check(self, samples: list[Sample]) -> Iterable[Finding]:
        """Faults of one execution as the system writes it (its outcome, its stages' roles); none by default."""
        return ()

    def progress(self, counters: Mapping[str, float]) -> str | None:
        """A phrase of the progress line from the system's counters as the run goes (none by default)."""
        return None

    def heading(self, stage: str, members: list[Sample], samples: list[Sample]) -> str:
        """A stage's branch in `inspect` (`members`: its samples in the execution, maybe none)."""
        return f"{stage} ({len(members)})" if members else f"{stage}: none (no call made)"

    def label(self, sample: Sample, samples: list[Sample]) -> Label:
        """A sample's name in `inspect`: its stage, worker and position (what a later turn's `continues` says)."""
        position = next(i for i, s in enumerate(samples) if s is sample)
        return Label(f"{sample.stage} {sample.worker} · record {position}")


def outcome_is(samples: list[Sample], last: Sample, what: str) -> Iterable[Finding]:
    """The execution's `final_reward` is `last`'s raw reward (a check several built-ins make)."""
    head = samples[0]
    if not math.isclose(head.final_reward, last.raw_reward, rel_tol=1e-9, abs_tol=1e-9):
        where = next(i for i, s in enumerate(samples) if s is last)
        yield Finding(
            0,
            f"final_reward {head.final_reward} is not the raw_reward of {what} ({last.raw_reward}, record {where}) "
            f"in execution {head.rollout_id[:12]}",
        )
