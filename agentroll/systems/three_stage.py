"""`three-stage` (the default): N solvers in parallel -> N rewriters, each shown every valid solver answer -> one
selector judging the rewrites (`Judgment: K`).

The stages pass on answer *contents* (the text after `</think>`), and the selector's pick is matched to a
rewrite by its index in the list it was shown, never by comparing text. The selector earns the raw reward of the
rewrite it picked; every reward is then shaped by whether that pick was correct.

Its vocabulary (`ThreeStageWords`): the selector is judged by its picks (over the executions that reached it),
majority vote and best of N over the solvers, a page section on the pick against the best of its candidates,
the checks of a pick, and a tree of solvers -> rewriters -> selector in `inspect`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ..process.concurrency import gather_or_cancel
from ..record.parsing import parse_judgment
from ..record.schema import Sample
from . import System
from .vocabulary import SYSTEM_ACCURACY, Chart, Figure, Finding, Label, accuracy
from .votes import BEST_OF_N, MAJORITY_VOTE, Votes

if TYPE_CHECKING:
    from ..context import Context
    from .recorded import Rescoring

PICK = Figure(
    "selector_pick_accuracy", "selector (its pick)", "selector.raw_reward_sum", "selections", stage="selector"
)
NO_ROOM = "no call made (no room left in the context window)"
CASES = {  # (a candidate right, the pick right): the counter, and how the page names the case
    (True, True): ("candidate_right_pick_right", "candidate right, pick right"),
    (True, False): ("candidate_right_pick_wrong", "candidate right, pick wrong"),
    (False, True): ("no_candidate_right_pick_right", "no candidate right, pick right"),
    (False, False): ("no_candidate_right_pick_wrong", "no candidate right, pick wrong"),
}
SELECTOR_CHART = Chart(
    "selector",
    "The selector's pick against best of N",
    (
        Figure("selected_best_of_n", "best of N solvers", "selected_solver_right", "selections"),
        Figure("best_of_candidates", "best of the candidates", "candidate_right", "selections"),
        Figure("pick", "selector's pick", "pick_right", "selections"),
        MAJORITY_VOTE,
        SYSTEM_ACCURACY,
        Figure("pick_given_possible", "its pick, a right one there", "candidate_right_pick_right", "candidate_right"),
    ),
    "Over the {selections} executions with a selector record: a right answer among the solvers (best of N) or "
    "among the candidates it was shown (best of the candidates: the most its pick could reach), and its pick; "
    "then how often it picked a right one when one was there. Majority vote and the system are over every "
    "execution.",
    counts=(
        *((name, counter) for counter, name in CASES.values()),
        ("selections without a Judgment: K", "no_judgment"),
    ),
    needs="selections",
    missing="No execution reached the selector.",
)


class ThreeStageWords(Votes):
    figures = (accuracy("solver"), MAJORITY_VOTE, BEST_OF_N, accuracy("rewriter"), PICK)
    charts = (SELECTOR_CHART,)

    def tally(self, samples: list[Sample]) -> Mapping[str, float]:
        out = {"selections": 0, "selected_solver_right": 0, "candidate_right": 0, "pick_right": 0, "no_judgment": 0}
        out |= {counter: 0 for counter, _ in CASES.values()}
        selector = next((s for s in samples if s.stage == "selector"), None)
        if selector is not None:
            solvers = [s for s in samples if s.stage == "solver"]
            shown = [s for s in samples if s.listed_as is not None] or solvers
            case = (any(s.raw_reward == 1.0 for s in shown), selector.raw_reward == 1.0)
            out |= {"selections": 1, "candidate_right": case[0], "pick_right": case[1], CASES[case][0]: 1}
            out["selected_solver_right"] = any(s.raw_reward == 1.0 for s in solvers)
            out["no_judgment"] = selector.judgment is None
        return {**super().tally(samples), **out}

    def check(self, samples: list[Sample]) -> Iterable[Finding]:
        """One selector at most; the outcome is its raw reward (0 without one); its raw reward is that of the
        rewrite its judgment names by `listed_as` (0 when none is listed so)."""
        rid = samples[0].rollout_id[:12]
        at = [i for i, s in enumerate(samples) if s.stage == "selector"]
        if len(at) > 1:
            yield Finding(at[1], f"a second selector record in execution {rid}")
        outcome = samples[at[0]].raw_reward if at else 0.0
        final = samples[0].final_reward
        if not _close(final, outcome):
            yield Finding(0, f"final_reward {final} is not the selector's raw_reward ({outcome}) in execution {rid}")
        selector = samples[at[0]] if at else None
        if selector is not None and selector.judgment is not None:
            listed = {s.listed_as: s for s in samples if s.stage == "rewriter" and s.listed_as is not None}
            picked = listed.get(selector.judgment)
            expected = picked.raw_reward if picked is not None else 0.0
            if not _close(selector.raw_reward, expected):
                what = (
                    f"the raw_reward of the rewrite listed as {selector.judgment}" if picked else "0 (no such rewrite)"
                )
                yield Finding(at[0], f"selector raw_reward {selector.raw_reward} is not {what}: {expected}")

    def heading(self, stage: str, members: list[Sample], samples: list[Sample]) -> str:
        solvers = [s for s in samples if s.stage == "solver"]
        answered = sum(s.content is not None for s in solvers)
        listed = [s for s in samples if s.stage == "rewriter" and s.listed_as is not None]
        if stage == "solver":
            return f"solvers ({len(members)}, {answered} with an answer)"
        if stage == "rewriter":
            if not members:
                why = (
                    "no solver gave an answer" if not answered else "no call made (no room left in the context window)"
                )
                return f"rewriters: none ({why})"
            return f"rewriters ({len(members)}, each shown {answered} solver answer{'s' * (answered != 1)})"
        if stage == "selector":
            if not members:
                why = (
                    "no rewriter gave an answer" if not listed else "no call made (no room left in the context window)"
                )
                return f"selector: none ({why})"
            return f"selector (shown {len(listed)} rewrite{'s' * (len(listed) != 1)})"
        return super().heading(stage, members, samples)

    def label(self, sample: Sample, samples: list[Sample]) -> Label:
        listed = [s for s in samples if s.stage == "rewriter" and s.listed_as is not None]
        selector = next((s for s in samples if s.stage == "selector"), None)
        k = selector.judgment if selector is not None else None
        picked = k if k is not None and 1 <= k <= len(listed) else None
        if sample.stage == "rewriter":
            where = f"listed as {sample.listed_as}" if sample.listed_as is not None else "not listed"
            mark = "◀ picked by the selector" if picked is not None and sample.listed_as == picked else ""
            return Label(f"rewriter {sample.worker} · {where}", mark)
        if sample.stage == "selector":
            if picked is not None:
                chosen = next(r for r in listed if r.listed_as == picked)
                return Label(f"selector · judgment {k} → rewrite {picked} (rewriter {chosen.worker})")
            if k is not None:
                return Label(f"selector · judgment {k} → out of range 1..{len(listed)}: nothing picked")
            return Label("selector · no judgment: nothing picked")
        if sample.stage == "solver":
            return Label(f"solver {sample.worker}")
        return super().label(sample, samples)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


class ThreeStage(System):
    name = "three-stage"
    stages = ("solver", "rewriter", "selector")
    templates = ("solver", "rewriter", "selector")
    vocabulary = ThreeStageWords()

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
        solvers = [s for s in samples if s.stage == "solver"]
        await execution.reward(solvers)  # as `run` asks: the solvers, then the rewriters (a group judge's meetings)
        if any(s.content is not None for s in solvers):
            await execution.reward([s for s in samples if s.stage == "rewriter"])
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
