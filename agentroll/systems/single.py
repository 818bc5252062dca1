"""`single`: one call per execution, K independent samples per prompt: the plain GRPO data most runs need."""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import System

if TYPE_CHECKING:
    from ..context import Context
    from ..schema import Sample


class Single(System):
    name = "single"
    stages = ("solver",)
    templates = ("solver",)

    async def run(self, ctx: Context) -> list[Sample]:
        sample = await ctx.complete("solver", await ctx.problem_prompt("solver"), worker=0)
        if sample is None:  # cannot happen: problem_prompt refuses a prompt that leaves no room
            raise AssertionError("no room after a checked prompt")
        await ctx.reward([sample])
        ctx.shape([sample], won=sample.raw_reward == 1)
        return [sample]
