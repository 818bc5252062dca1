"""`three-stage` (the default): N solvers in parallel -> N rewriters, each shown every valid solver answer -> one
selector judging the rewrites (`Judgment: K`).

The stages pass on answer *contents* (the text after `</think>`), and the selector's pick is matched to a
rewrite by its index in the list it was shown, never by comparing text. The selector earns the raw reward of the
rewrite it picked; every reward is then shaped by whether that pick was correct.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..concurrency import gather_or_cancel
from ..parsing import parse_judgment
from . import System

if TYPE_CHECKING:
    from ..context import Context
    from ..rescoring import Rescoring
    from ..schema import Sample


class ThreeStage(System):
    name = "three-stage"
    stages = ("solver", "rewriter", "selector")
    templates = ("solver", "rewriter", "selector")

    async def run(self, ctx: Context) -> list[Sample]:
        n = ctx.config.num_parallel
        prompt = await ctx.problem_prompt("solver")
        solvers = await _stage(ctx, "solver", prompt, n)
        await ctx.reward(solvers)
        contents = [s.content for s in solvers if s.content is not None]
        if not contents:
            return _shaped(ctx, solvers, won=False)

        prompt = await ctx.render(ctx.messages("rewriter", contents), "rewriter")
        rewriters = await _stage(ctx, "rewriter", prompt, n)
        await ctx.reward(rewriters)
        listed = [r for r in rewriters if r.content is not None]
        for position, rewrite in enumerate(listed, start=1):
            rewrite.listed_as = position
        if not listed:
            return _shaped(ctx, solvers + rewriters, won=False)

        prompt = await ctx.render(ctx.messages("selector", [r.content or "" for r in listed]), "selector")
        selector = await ctx.complete("selector", prompt, worker=0)
        if selector is None:  # no room left for the selector in the context window
            return _shaped(ctx, solvers + rewriters, won=False)
        k = parse_judgment(selector.content) if selector.content is not None else None
        selector.judgment = k
        if k is not None and 1 <= k <= len(listed):
            selector.raw_reward = listed[k - 1].raw_reward
            selector.reward_info = f"picked rewrite {k} of {len(listed)}"
        else:
            selector.raw_reward = 0.0
            selector.reward_info = (
                "no content"
                if selector.content is None
                else ("no judgment" if k is None else f"judgment {k} out of range 1..{len(listed)}")
            )
        ctx.final_reward = selector.raw_reward
        return _shaped(ctx, [*solvers, *rewriters, selector], won=selector.raw_reward == 1)

    async def rescore(self, execution: Rescoring) -> None:
        """Solvers and rewriters scored by the new reward; the selector earns the raw reward of the rewrite its
        recorded judgment picked (by its place in the list it was shown, `listed_as`)."""
        samples = execution.samples
        scored = [s for s in samples if s.stage in ("solver", "rewriter")]
        await execution.reward(scored)
        listed = {s.listed_as: s for s in samples if s.stage == "rewriter" and s.listed_as is not None}
        selector = next((s for s in samples if s.stage == "selector"), None)
        if selector is None:
            execution.final_reward = 0.0  # stopped before a selection, as `run` records it
            execution.shape(samples, won=False)
            return
        picked = listed.get(selector.judgment) if selector.judgment is not None else None
        selector.raw_reward = picked.raw_reward if picked is not None else 0.0
        execution.final_reward = selector.raw_reward
        execution.shape(samples, won=selector.raw_reward == 1)


async def _stage(ctx: Context, stage: str, prompt: tuple[str, list[int]], n: int) -> list[Sample]:
    """N calls of one stage on one prompt, in parallel; those with no room left are dropped."""
    results = await gather_or_cancel(*(ctx.complete(stage, prompt, worker=w) for w in range(n)))
    return [s for s in results if s is not None]


def _shaped(ctx: Context, samples: list[Sample], won: bool) -> list[Sample]:
    if ctx.final_reward is None:
        ctx.final_reward = 0.0  # stopped before a selection
    ctx.shape(samples, won)
    return samples
