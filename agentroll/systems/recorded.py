"""One recorded execution as its system's `rescore` sees it (`agentroll rescore`, `agentroll.tools.rescoring`).

The value a `System.rescore` is given lives with the systems: the command that builds it imports them, and they
need only its shape, never the command.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..inputs import Problem
from ..record.schema import Sample
from ..record.stats import RunStats
from ..rewards import RewardSet


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

    async def reward(self, samples: list[Sample]) -> None:
        """Score samples with the new reward through `RewardSet.score`, the request generate's `Context.reward` gave."""
        if not samples:
            return
        await self.rewards.score(samples, self.problem, self.stats)

    def shape(self, samples: list[Sample], won: bool) -> None:
        weight = self.weights[0] if won else self.weights[1]
        for sample in samples:
            sample.reward = sample.raw_reward * weight
