"""`critique-revise`: solve -> critique -> revise, one multi-turn conversation per execution.

Each turn continues the one before by token ids (`ctx.complete(after=...)`), so the critic sees exactly the
tokens the solver sampled, think block included, and a trainer sees exactly what the model saw. The solver and
the reviser are scored by the reward; the critic earns the reviser's raw reward (did its critique lead to a
correct answer?). The execution's outcome is the reviser's raw reward, and every reward is shaped by it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..record.schema import Sample
from . import System
from .vocabulary import Finding, Vocabulary, outcome_is

if TYPE_CHECKING:
    from ..context import Context
    from .recorded import Rescoring


class CritiqueReviseWords(Vocabulary):
    """Each stage's accuracy and the system's (one solver per execution: no majority vote nor best of N); the
    outcome is the reviser's raw reward (the solver's when no room was left to revise)."""

    def check(self, samples: list[Sample]) -> Iterable[Finding]:
        last = next((s for s in samples if s.stage == "reviser"), samples[0])
        yield from outcome_is(samples, last, f"the execution's {last.stage}")


class CritiqueRevise(System):
    name = "critique-revise"
    stages = ("solver", "critic", "reviser")
    templates = ("solver", "critic", "reviser")
    vocabulary = CritiqueReviseWords()

    async def run(self, ctx: Context) -> list[Sample]:
        solver = await ctx.complete("solver", await ctx.problem_prompt("solver"), worker=0)
        if solver is None:  # cannot happen: problem_prompt refuses a prompt that leaves no room
            raise AssertionError("no room after a checked prompt")
        await ctx.reward([solver])
        samples = [solver]
        critic = await ctx.complete("critic", ctx.user_turn("critic"), after=solver)
        if critic is not None:
            samples.append(critic)
            reviser = await ctx.complete("reviser", ctx.user_turn("reviser"), after=critic)
            if reviser is not None:
                samples.append(reviser)
                await ctx.reward([reviser])
                critic.raw_reward = reviser.raw_reward
                critic.reward_info = f"the revision it led to scored {reviser.raw_reward:g}"
            else:
                critic.reward_info = "no room left to revise"
        # with no room left for a later turn, the solver's answer stands
        ctx.final_reward = samples[2].raw_reward if len(samples) == 3 else solver.raw_reward
        ctx.shape(samples, won=ctx.final_reward == 1)
        return samples

    async def rescore(self, execution: Rescoring) -> None:
        """The solver and the reviser scored; the critic earns the reviser's raw reward; the outcome is the
        reviser's (the solver's when no revision was made)."""
        samples = execution.samples
        by_stage = {s.stage: s for s in samples}
        await execution.reward([by_stage["solver"]])  # as `run` asks: the solver, then the reviser
        reviser, critic = by_stage.get("reviser"), by_stage.get("critic")
        if reviser is not None:
            await execution.reward([reviser])
        if reviser is not None and critic is not None:
            critic.raw_reward = reviser.raw_reward
            critic.reward_info = f"the revision it led to scored {reviser.raw_reward:g}"
        execution.final_reward = (reviser or by_stage["solver"]).raw_reward
        execution.shape(samples, won=execution.final_reward == 1)
