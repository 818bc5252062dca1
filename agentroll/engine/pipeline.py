"""One execution of the run's agent system: a `Context` in, the execution's samples out, checked and linked.

The system (`agentroll.systems`) decides what to ask; everything else is the engine's. A call or a render that
fails for good fails the whole execution (`ExecutionFailed`); a system that raises anything else has a bug,
which ends the run with one line naming it rather than writing wrong data.
"""

from __future__ import annotations

import asyncio
import builtins
from typing import TYPE_CHECKING

from agentroll.client import CallFailed, CompletionClient
from agentroll.context import Context, Engine, ExecutionFailed, Stage, SystemConfig, call_seed
from agentroll.errors import AgentrollError, UsageError
from agentroll.inputs import Problem
from agentroll.process.concurrency import gather_or_cancel
from agentroll.record.schema import Sample
from agentroll.record.stats import RunStats
from agentroll.render.chat import ChatEncoder
from agentroll.render.templates import Templates
from agentroll.rewards import RewardSet
from agentroll.systems import System, load_system
from agentroll.teacher.scorer import score_each

if TYPE_CHECKING:
    from agentroll.folder.journal import Journal

__all__ = ["AgentSystem", "ExecutionFailed", "SystemConfig", "call_seed", "final_reward", "gather_or_cancel"]


def final_reward(samples: list[Sample]) -> float:
    """An execution's outcome, as the engine set it on every record."""
    return samples[0].final_reward if samples else 0.0


EXCEPTION_GROUPS = tuple(t for t in (getattr(builtins, "BaseExceptionGroup", None),) if t is not None)


def _leaf(group: BaseException, system: str, problem: str) -> BaseException:
    """The exception an exception group stands for: a failed call or an error that ends the run first, else the
    bug it holds."""
    leaves: list[BaseException] = []
    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop()
        if isinstance(exc, EXCEPTION_GROUPS):
            pending.extend(exc.exceptions)
        else:
            leaves.append(exc)
    for kind in (asyncio.CancelledError, AgentrollError, ExecutionFailed):
        found = next((e for e in leaves if isinstance(e, kind)), None)
        if found is not None:
            return found
    first = leaves[0]
    return UsageError(f"system {system} failed on problem {problem}: {type(first).__name__}: {first}")


class AgentSystem:
    """Runs executions of `system` (three-stage by default) with the engine's calls, rewards and counters."""

    def __init__(
        self,
        client: CompletionClient,
        encoder: ChatEncoder,
        templates: Templates,
        rewards: RewardSet,
        config: SystemConfig,
        stats: RunStats,
        prompt_key: str = "prompt",
        system: System | None = None,
        stages: dict[str, Stage] | None = None,
        policy: str | None = None,
    ) -> None:
        self.system = system if system is not None else load_system("three-stage")
        self.stats = stats
        default = Stage("", client, encoder, config)
        self.engine = Engine(
            dict(stages or {}),
            default,
            rewards,
            templates,
            stats,
            dict(self.system.settings),
            prompt_key,
            tuple(self.system.stages),
            policy=policy,
        )

    def use_journal(self, journal: Journal | None) -> None:
        self.engine.journal = journal

    async def run(self, problem: Problem, sample_index: int, attempt: int = 0, group: int = 0) -> list[Sample]:
        """All samples of one execution, rewards shaped, in the order the system returned them.

        `attempt` > 0 re-runs a problem (--resample-uniform); it changes the per-call seeds. `group`: the group's
        admission number, its calls' priority when slots are scarce (older groups first)."""
        ctx = Context(self.engine, problem, sample_index, attempt, group)
        try:
            samples = await self.system.run(ctx)
        except (ExecutionFailed, AgentrollError, asyncio.CancelledError):
            raise
        except Exception as exc:
            if EXCEPTION_GROUPS and isinstance(exc, EXCEPTION_GROUPS):  # asyncio.TaskGroup in a system: what
                raise _leaf(exc, self.system.name, problem.id) from exc  # failed inside is what counts
            raise UsageError(
                f"system {self.system.name} failed on problem {problem.id}: {type(exc).__name__}: {exc}"
            ) from exc
        if ctx.failure is not None:  # a failed call the system caught: the execution is still not whole
            raise ctx.failure
        if not isinstance(samples, list):
            raise UsageError(f"system {self.system.name} returned {type(samples).__name__}, not a list of Samples")
        finished = ctx.finish(samples)
        await scored(ctx, finished)
        return finished


async def scored(ctx: Context, samples: list[Sample]) -> None:
    """The teachers' scores of an execution's samples (`--teacher`: `ctx.teaching`), once its calls are all made. A
    scoring call that fails for good fails the execution, as a generation would: no record is written without its
    teacher's scores. Meanwhile the run's slots the execution would keep for its next stage go to new groups."""
    asked = [ctx.teaching[id(s)] for s in samples if id(s) in ctx.teaching]
    if not asked:
        return
    budget = ctx.engine.default.client.budget
    budget.rest(ctx.group, True)
    try:
        await score_each(asked, ctx.engine.journal, (ctx.problem.id, ctx.problem.content_hash), (ctx.group, 0))
    except CallFailed as exc:
        ctx.failure = ExecutionFailed(f"teacher call failed: {exc}")
        raise ctx.failure from exc
    finally:
        budget.rest(ctx.group, False)
