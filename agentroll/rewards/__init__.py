"""Rewards: rule-based (`math`, `exact`), tests run in a sandbox (`code`), a remote reward model (`remote`), or a
user's function.

`RewardSet` picks the reward for each problem (the run's default, or the row's own `reward` field) and keeps
one instance of each kind for the whole run, and the run's sandbox for model code (made on first use).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import RewardError
from ..sandbox import Sandbox, SandboxSettings, make_sandbox
from .base import NO_CONTENT, Reward, RewardRequest, RewardResult
from .code import CodeReward, parse_tests
from .function import FunctionReward
from .remote import RemoteReward
from .rules import AgentReported, ExactReward, MathReward

if TYPE_CHECKING:
    from ..inputs import Problem
    from ..record.schema import Sample
    from ..record.stats import RunStats

__all__ = [
    "NO_CONTENT",
    "CodeReward",
    "ExactReward",
    "FunctionReward",
    "MathReward",
    "RemoteReward",
    "Reward",
    "RewardRequest",
    "RewardResult",
    "RewardSet",
    "RewardSettings",
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
        return {"reward": self.default, "reward_url": self.url, **({"code_reward": changed} if changed else {})}


def label_fault(kind: str, label: Any) -> str | None:
    """Why the reward `kind` cannot score a row of this `label` (None when it can): the code reward needs its
    tests, math and exact a plain answer. Generate and rescore ask before anything runs, so a mismatch is a bad
    row, not a run of zero rewards."""
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
    if ":" in spec:
        return FunctionReward(spec, settings.timeout_s, settings.concurrency)
    raise RewardError(
        f"unknown reward {spec!r}: use math, exact, code, remote, agent, FILE.py:FUNCTION or MODULE:FUNCTION"
    )


class RewardSet:
    """The run's rewards by name, made on first use (the default one up front, so a bad spec fails at start)."""

    def __init__(self, settings: RewardSettings) -> None:
        self.settings = settings
        self._made: dict[str, Reward] = {}
        self._sandbox: Sandbox | None = None
        self.get(settings.default)

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

    async def score(self, samples: list[Sample], problem: Problem, stats: RunStats, spec: str | None = None) -> None:
        """Set each sample's `raw_reward` (and `reward`, which shaping moves later) and `reward_info` from the reward
        `spec` (the row's own, else the run's), and count the failed checks in `stats`. Generate and rescore both
        come here, so a reward is given the same request either way: the answer, the row's label, statement,
        metadata, prompt as given and id, the stage and the whole response."""
        p = problem
        requests = [
            RewardRequest(s.content, p.label, p.statement, s.stage, p.metadata, s.response, p.prompt, p.id)
            for s in samples
        ]
        results = await self.get(spec).score(requests)
        for sample, result in zip(samples, results, strict=True):
            sample.raw_reward = sample.reward = float(result.value)
            sample.reward_info = result.info
            if result.failed == "timeout":
                stats.reward_timeouts += 1
            elif result.failed == "error":
                stats.reward_errors += 1
            elif result.failed == "invalid":
                stats.reward_invalid += 1

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
