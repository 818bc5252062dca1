"""One recorded execution as its system's `rescore` sees it (`agentroll rescore`, `agentroll.tools.rescoring`).

The value a `System.rescore` is given lives with the systems: the command that builds it imports them, and they
need only its shape, never the command.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..folder.journal import Journal
from ..inputs import Problem
from ..record.schema import Sample
from ..record.stats import RunStats
from ..rewards import RewardSet
from ..rewards.held import unjudged


@dataclass
class Rescoring:
    """One recorded execution as its system's `rescore` sees it: the samples, and the reward and shaping
    calls a `Context` offers (`reward`, `shape`, `final_reward`)."""

    samples: list[Sample]
    rewards: RewardSet
    stats: RunStats
    problem: Problem  # the row as the run's rewards saw it (`asked`), as `Context.problem` is
    weights: tuple[float, float] = (1.0, 1.0)  # --correct-reward-weight, --incorrect-reward-weight of the run
    final_reward: float | None = None
    journal: Journal | None = None  # the new folder's: a judge's verdicts, kept for a rerun of a failed group
    together: int = 0  # the group's executions (--judge-mode group judges their answers together)
    failed_only: bool = False  # only the samples a judge gave no verdict are scored (the others keep theirs)
    reward_calls: int = 0  # made so far

    async def reward(self, samples: list[Sample]) -> None:
        """Score samples with the new reward through `RewardSet.score`, the request generate's `Context.reward` gave."""
        self.reward_calls += 1
        judge = self.rewards.settings.judge
        if self.failed_only and not (judge is not None and judge.mode == "group"):  # a group verdict: all again
            samples = [s for s in samples if unjudged(s)]
        await self.rewards.score(
            samples, self.problem, self.stats, journal=self.journal, meet=(0, self.reward_calls), together=self.together
        )

    def shape(self, samples: list[Sample], won: bool) -> None:
        weight = self.weights[0] if won else self.weights[1]
        for sample in samples:
            sample.reward = sample.raw_reward * weight
