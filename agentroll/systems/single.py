"""`single`: one call per execution, K independent samples per prompt: the plain GRPO data most runs need."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..record.schema import Sample
from . import System
from .vocabulary import Finding, Vocabulary, outcome_is

if TYPE_CHECKING:
    from ..context import Context


class SingleWords(Vocabulary):
    """The solver's accuracy and the system's (no majority vote nor best of N: with one solver per execution they
    would only repeat the solver's accuracy, and read as best of the K samples, which `stats`' pass@k is); an
    execution is one record, its outcome that record's raw reward."""

    def check(self, samples: list[Sample]) -> Iterable[Finding]:
        if len(samples) != 1:
            rid = samples[0].rollout_id[:12]
            yield Finding(1, f"execution {rid} has {len(samples)} records: the single system writes one")
        yield from outcome_is(samples, samples[0], "the execution's solver")


class Single(System):
    name = "single"
    stages = ("solver",)
    templates = ("solver",)
    vocabulary = SingleWords()

    async def run(self, ctx: Context) -> list[Sample]:
        sample = await ctx.complete("solver", await ctx.problem_prompt("solver"), worker=0)
        if sample is None:  # cannot happen: problem_prompt refuses a prompt that leaves no room
            raise AssertionError("no room after a checked prompt")
        await ctx.reward([sample])
        ctx.shape([sample], won=sample.raw_reward == 1)
        return [sample]
