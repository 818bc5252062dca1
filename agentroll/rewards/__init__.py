"""Rewards: rule-based (`math`, `exact`), tests run in a sandbox (`code`), a remote reward model (`remote`), or a
user's function.

`RewardSet` picks the reward for each problem (the run's default, or the row's own `reward` field) and keeps
one instance of each kind for the whole run, and the run's sandbox for model code (made on first use).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import RewardError
from ..sandbox import Sandbox, SandboxSettings, make_sandbox
from .base import NO_CONTENT, Reward, RewardRequest, RewardResult
from .code import CodeReward, parse_tests
from .components import Component, combined, parse_components
from .function import FunctionReward
from .held import hold
from .judge import JudgeSettings
from .judging import JudgeReward
from .meeting import Meetings
from .remote import RemoteReward
from .rules import AgentReported, ExactReward, MathReward

if TYPE_CHECKING:
    from ..folder.journal import Journal
    from ..inputs import Problem
    from ..record.schema import Sample
    from ..record.stats import RunStats

__all__ = [
    "NO_CONTENT",
    "CodeReward",
    "ExactReward",
    "FunctionReward",
    "JudgeFailed",
    "JudgeReward",
    "JudgeSettings",
    "MathReward",
    "RemoteReward",
    "Reward",
    "RewardRequest",
    "RewardResult",
    "RewardSet",
    "RewardSettings",
    "hold",
    "label_fault",
    "make_reward",
]


@dataclass(frozen=True, slots=True)
class RewardSettings:
    default: str = "math"  # --reward: the kind for rows without their own
    timeout_s: float = 10.0  # --reward-timeout: per math check, function call or reward-model request attempt
    url: str | None = None  # --reward-url, for remote
    concurrency: int = 32  # --reward-concurrency: reward-model requests in flight, or user-function threads
    max_retries: int = 5  # --max-retries, for remote
    workers: int = 1  # --reward-workers: math-check processes
    sandbox: SandboxSettings = field(default_factory=SandboxSettings)  # --sandbox-*: the code reward's, the tools'
    code_test_timeout_s: float = 6.0  # --code-test-timeout
    code_partial_credit: bool = False  # --code-partial-credit
    judge: JudgeSettings | None = None  # --judge-*, for --reward judge
    components: tuple[Component, ...] = ()  # --reward-component: the run's reward is their weighted sum

    def recorded(self) -> dict[str, Any]:
        """What of these settings changes a reward, as a folder's settings hold it (generate's names): the code
        reward's only where they differ from the defaults, so a folder made before they existed still resumes."""
        base = RewardSettings()
        code = {
            "code_test_timeout": (self.code_test_timeout_s, base.code_test_timeout_s),
            "code_partial_credit": (self.code_partial_credit, base.code_partial_credit),
            "sandbox_memory_mb": (self.sandbox.memory_mb, base.sandbox.memory_mb),
            "sandbox_processes": (self.sandbox.processes, base.sandbox.processes),
            "sandbox_disk_mb": (self.sandbox.disk_mb, base.sandbox.disk_mb),
        }
        changed = {name: value for name, (value, default) in code.items() if value != default}
        judge = {"judge": self.judge.recorded()} if self.judge is not None else {}
        code_reward = {"code_reward": changed} if changed else {}
        parts = {"reward_components": [[c.name, c.spec, c.weight] for c in self.components]} if self.components else {}
        return {"reward": self.default, "reward_url": self.url, **code_reward, **judge, **parts}


def label_fault(kind: str, label: Any, components: list[str] | None = None) -> str | None:
    """Why the reward `kind` cannot score a row of this `label` (None when it can): the code reward needs its
    tests, math and exact a plain answer. Generate and rescore ask before anything runs, so a mismatch is a bad
    row, not a run of zero rewards. With `components` (--reward-component), each of theirs instead."""
    if components:
        faults = ((c.name, label_fault(c.spec, label)) for c in parse_components(components))
        return next((f"component {name}: {fault}" for name, fault in faults if fault is not None), None)
    if kind == "code":
        try:
            parse_tests(label)
        except ValueError as exc:
            return f"for the code reward it {exc}"
    elif isinstance(label, dict) and kind in ("math", "exact"):
        return f"an object is a label for the code reward or a reward function, not for {kind}"
    return None


def make_reward(spec: str, settings: RewardSettings | None = None, sandbox: Sandbox | None = None) -> Reward:
    settings = settings or RewardSettings()
    if spec == "code":
        made = sandbox or make_sandbox(settings.sandbox)
        return CodeReward(
            lambda: made, settings.code_test_timeout_s, settings.code_partial_credit, settings.sandbox.memory_mb
        )
    if spec == "math":
        return MathReward(timeout_s=settings.timeout_s, workers=settings.workers)
    if spec == "exact":
        return ExactReward()
    if spec == "agent":
        return AgentReported()
    if spec == "remote":
        if not settings.url:
            raise RewardError("--reward remote needs --reward-url")
        return RemoteReward(settings.url, settings.concurrency, settings.timeout_s, max_retries=settings.max_retries)
    if spec == "judge":
        if settings.judge is None:
            raise RewardError("--reward judge needs --judge-url, --judge-model and --judge-prompt")
        return JudgeReward(settings.judge)
    if ":" in spec:
        return FunctionReward(spec, settings.timeout_s, settings.concurrency)
    raise RewardError(
        f"unknown reward {spec!r}: use math, exact, code, remote, judge, agent, FILE.py:FUNCTION or MODULE:FUNCTION"
    )


class JudgeFailed(Exception):
    """A sample has no verdict from the judge (after its retries): its group cannot be written as scored."""


class RewardSet:
    """The run's rewards by name, made on first use (the default one up front, so a bad spec fails at start)."""

    def __init__(self, settings: RewardSettings) -> None:
        self.settings = settings
        self._made: dict[str, Reward] = {}
        self._sandbox: Sandbox | None = None
        self._meetings = Meetings()  # --judge-mode group: the executions of a group meet at each reward call
        self.get(settings.default)
        for component in settings.components:
            self.get(component.spec)

    @property
    def sandbox(self) -> Sandbox:
        """The run's sandbox for model code, shared by the code reward and the python tool."""
        if self._sandbox is None:
            self._sandbox = make_sandbox(self.settings.sandbox)
        return self._sandbox

    def get(self, spec: str | None) -> Reward:
        spec = spec or self.settings.default
        if spec not in self._made:
            self._made[spec] = make_reward(spec, self.settings, self.sandbox if spec == "code" else None)
        return self._made[spec]

    async def score(
        self,
        samples: list[Sample],
        problem: Problem,
        stats: RunStats,
        spec: str | None = None,
        journal: Journal | None = None,
        meet: tuple[Any, ...] | None = None,
        together: int = 0,
    ) -> None:
        """Set each sample's `raw_reward` (and `reward`, which shaping moves later) and `reward_info` from the reward
        `spec` (the row's own, else the run's), and count the failed checks in `stats`. Generate and rescore both
        come here, so a reward is given the same request either way: the answer, the row's label, statement,
        metadata, prompt as given and id, the stage and the whole response.

        A judge keeps its verdicts in `journal` (under the problem's group); in `--judge-mode group`, `meet`
        names the call within its execution, and the `together` executions' calls of that name are judged together.
        A sample the judge gave no verdict raises `JudgeFailed` (unless `--judge-failures keep`: then it is
        frozen, its judge's `failed` saying why)."""
        p = problem
        requests = [
            RewardRequest(s.content, p.label, p.statement, s.stage, p.metadata, s.response, p.prompt, p.id)
            for s in samples
        ]
        if not samples and not together:
            return
        execution = samples[0].sample_index if samples else 0  # a group judge numbers answers by execution
        context = (journal, (p.id, p.content_hash), meet, together, stats, execution)
        parts: list[dict[str, dict[str, float]] | None] = [None] * len(samples)
        components = self.settings.components if spec is None else ()
        if components:  # each component scores every sample; a judge's meet is its own
            each = await asyncio.gather(
                *(self._results(c.spec, requests, *context, component=n) for n, c in enumerate(components))
            )
            results = []
            for i in range(len(samples)):
                result, parts[i] = combined(components, [found[i] for found in each])
                results.append(result)
        else:
            results = await self._results(spec, requests, *context)
        failed = []
        for sample, result, part in zip(samples, results, parts, strict=True):
            sample.raw_reward = sample.reward = float(result.value)
            sample.reward_info = result.info
            sample.judge = result.judge
            sample.reward_components = part
            if result.failed == "timeout":
                stats.reward_timeouts += 1
            elif result.failed == "error":
                stats.reward_errors += 1
            elif result.failed == "invalid":
                stats.reward_invalid += 1
            elif result.failed == "judge":
                failed.append(str((result.judge or {}).get("failed")))
        keep = self.settings.judge is not None and self.settings.judge.failures == "keep"
        if failed and not keep:
            raise JudgeFailed(f"{samples[0].stage}: {failed[0]}")

    async def _results(
        self,
        spec: str | None,
        requests: list[RewardRequest],
        journal: Journal | None,
        group: tuple[str, str],
        meet: tuple[Any, ...] | None,
        together: int,
        stats: RunStats,
        execution: int = 0,
        component: int = 0,
    ) -> list[RewardResult]:
        reward = self.get(spec)
        if not isinstance(reward, JudgeReward):
            return await reward.score(requests) if requests else []
        if reward.settings.mode == "group" and meet is not None and together > 1:
            return await self._meetings.join(
                group,
                (*meet, component),
                together,
                requests,
                lambda shown: reward.judged_group(shown, journal, group, stats),
                execution,
            )
        return await reward.judged(requests, journal, group, stats) if requests else []

    def leave(self, group: tuple[str, str], attempt: int, made: int, together: int) -> None:
        """An execution ended after `made` reward calls (`--judge-mode group`: its later meetings stop waiting)."""
        judge = self.settings.judge
        if judge is not None and judge.mode == "group" and together > 1:
            self._meetings.leave(group, attempt, made, together)

    async def ready(self) -> None:
        """Every reward made so far able to score (a math worker started, a user function loaded in a worker
        process): `RewardError` otherwise; and the sandbox, if made, able to run a program (`UsageError`
        saying why not), so that a set-up that cannot work fails at start, not at the first program."""
        for reward in list(self._made.values()):
            check = getattr(reward, "ready", None)
            if check is not None:
                await check()
        if self._sandbox is not None:
            await self._sandbox.describe()

    async def aclose(self) -> None:
        for reward in self._made.values():
            await reward.aclose()
        if self._sandbox is not None:
            await self._sandbox.aclose()
