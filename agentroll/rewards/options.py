"""The reward options, declared once: `agentroll generate` has them (`GenerateOptions` extends `RewardOptions`)
and so has `agentroll rescore`, with the same names, defaults, help and checks; `reward_settings()` makes the
rewards' value object, which is what is passed on (whole) to `RewardSet` and `agentroll.rescore`."""

from __future__ import annotations

import os
from dataclasses import dataclass

from ..client.settings import Retries, Timeouts
from ..errors import UsageError
from ..sandbox import SandboxSettings
from ..settings.declare import at_least, check_types, option, positive
from . import RewardSettings

REWARDS, RETRIES, TIMEOUTS = RewardSettings(), Retries(), Timeouts()


@dataclass(frozen=True, kw_only=True)
class RewardOptions:
    """How answers are scored: the reward, its limits, the sandbox that runs model code, the code reward."""

    reward: str = option(
        REWARDS.default, "math | exact | code | remote | agent (--system agent) | FILE.py:FUNCTION | MODULE:FUNCTION"
    )
    reward_timeout: float = option(REWARDS.timeout_s, "Seconds per reward check (or reward-model request).")
    reward_url: str | None = option(None, "Reward model URL, for --reward remote.")
    reward_workers: int = option(0, "Math-check worker processes (0: a quarter of the cores, at least 1).")
    reward_concurrency: int = option(
        REWARDS.concurrency, "Most reward calls in flight: reward-model requests or function threads."
    )
    max_retries: int = option(RETRIES.max_retries, "Retries per call for transient failures.")
    connect_timeout: float = option(TIMEOUTS.connect_s, "Seconds to open a connection to a server.")
    # -- model code: the sandbox, the code reward (docs/tool-use.md, docs/rewards.md) --------------------------------
    sandbox: str = option(
        REWARDS.sandbox.mode,
        "bwrap | unsafe-local: model code runs locally in bubblewrap, or (asked for by name) without a "
        "filesystem sandbox.",
    )
    sandbox_url: str | None = option(
        None, "SandboxFusion server that runs model code (its /run_code) instead of the local sandbox."
    )
    sandbox_concurrency: int = option(0, "Most sandbox runs at once (0: one per core).")
    sandbox_memory_mb: int = option(REWARDS.sandbox.memory_mb, "Memory per sandbox run, all its processes, in MB.")
    sandbox_processes: int = option(REWARDS.sandbox.processes, "Processes and threads per sandbox run.")
    sandbox_disk_mb: int = option(REWARDS.sandbox.disk_mb, "Files per sandbox run (its tmpfs), in MB.")
    code_test_timeout: float = option(REWARDS.code_test_timeout_s, "--reward code: seconds per test.")
    code_partial_credit: bool = option(
        REWARDS.code_partial_credit, "--reward code: the fraction of tests passed, not 1 only when all pass."
    )

    def __post_init__(self) -> None:
        check_types(self)
        self.check_rewards()

    def check_rewards(self) -> None:
        """Each reward option in its range (a subclass's `__post_init__` calls this among its own checks)."""
        at_least(self, 1, "reward_concurrency")
        at_least(self, 0, "max_retries", "reward_workers", "sandbox_concurrency")
        at_least(self, 16, "sandbox_memory_mb")
        at_least(self, 1, "sandbox_processes", "sandbox_disk_mb")
        if self.sandbox not in ("bwrap", "unsafe-local"):
            raise UsageError(f"--sandbox must be bwrap or unsafe-local, got {self.sandbox!r}")
        positive(self, "reward_timeout", "connect_timeout", "code_test_timeout")
        if self.sandbox_url is not None and not self.sandbox_url.startswith(("http://", "https://")):
            raise UsageError(f"--sandbox-url {self.sandbox_url!r} must be an http:// or https:// URL")

    def reward_settings(self) -> RewardSettings:
        workers = self.reward_workers or max(1, (os.cpu_count() or 1) // 4)
        sandbox = SandboxSettings(
            url=self.sandbox_url,
            mode=self.sandbox,
            concurrency=self.sandbox_concurrency,
            memory_mb=self.sandbox_memory_mb,
            processes=self.sandbox_processes,
            disk_mb=self.sandbox_disk_mb,
            max_retries=self.max_retries,
            connect_timeout_s=self.connect_timeout,
        )
        return RewardSettings(
            self.reward,
            self.reward_timeout,
            self.reward_url,
            self.reward_concurrency,
            self.max_retries,
            workers,
            sandbox,
            self.code_test_timeout,
            self.code_partial_credit,
        )
