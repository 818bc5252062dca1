"""Rewards: rule-based (`math`, `exact`), a remote reward model (`remote`), or a user's function.

`RewardSet` picks the reward for each problem (the run's default, or the row's own `reward` field) and keeps
one instance of each kind for the whole run.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RewardError
from .base import NO_CONTENT, Reward, RewardRequest, RewardResult
from .function import FunctionReward
from .remote import RemoteReward
from .rules import ExactReward, MathReward

__all__ = ["NO_CONTENT", "ExactReward", "FunctionReward", "MathReward", "RemoteReward", "Reward",
           "RewardRequest", "RewardResult", "RewardSet", "RewardSettings", "make_reward"]


@dataclass(frozen=True, slots=True)
class RewardSettings:
    default: str = "math"  # --reward: the kind for rows without their own
    timeout_s: float = 10.0  # --reward-timeout: per math check, function call or reward-model request attempt
    url: str | None = None  # --reward-url, for remote
    concurrency: int = 32  # --reward-concurrency: reward-model requests in flight, or user-function threads
    max_retries: int = 5  # --max-retries, for remote
    workers: int = 1  # --reward-workers: math-check processes


def make_reward(spec: str, settings: RewardSettings | None = None) -> Reward:
    settings = settings or RewardSettings()
    if spec == "math":
        return MathReward(timeout_s=settings.timeout_s, workers=settings.workers)
    if spec == "exact":
        return ExactReward()
    if spec == "remote":
        if not settings.url:
            raise RewardError("--reward remote needs --reward-url")
        return RemoteReward(settings.url, settings.concurrency, settings.timeout_s, max_retries=settings.max_retries)
    if ":" in spec:
        return FunctionReward(spec, settings.timeout_s, settings.concurrency)
    raise RewardError(f"unknown reward {spec!r}: use math, exact, remote, FILE.py:FUNCTION or MODULE:FUNCTION")


class RewardSet:
    """The run's rewards by name, made on first use (the default one up front, so a bad spec fails at start)."""

    def __init__(self, settings: RewardSettings) -> None:
        self.settings = settings
        self._made: dict[str, Reward] = {}
        self.get(settings.default)

    def get(self, spec: str | None) -> Reward:
        spec = spec or self.settings.default
        if spec not in self._made:
            self._made[spec] = make_reward(spec, self.settings)
        return self._made[spec]

    async def ready(self) -> None:
        """Every reward made so far able to score (a math worker started): `RewardError` otherwise."""
        for reward in list(self._made.values()):
            check = getattr(reward, "ready", None)
            if check is not None:
                await check()

    async def aclose(self) -> None:
        for reward in self._made.values():
            await reward.aclose()
