"""What every reward takes and gives back."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class RewardRequest:
    """One answer to score. This is also what a user's reward function receives (see docs/rewards.md)."""

    content: str | None  # the answer content (text after </think>), None when there is none
    label: Any  # the row's reference answer
    problem: str  # the problem statement
    stage: str  # solver, rewriter or selector
    metadata: dict[str, Any] = field(default_factory=dict)  # the row's other fields
    response: str = ""  # the full response text, think block included
    prompt: Any = None  # the row's prompt as given: a string or a list of chat messages
    problem_id: str = ""


@dataclass(slots=True)
class RewardResult:
    value: float
    info: str | None = None
    # When the value is a 0 standing in for a failed check: "timeout", "error", or "invalid" (a NaN or an
    # infinity came back: kept, it would poison the group's mean and every advantage computed from it); "judge":
    # no verdict at all (the value is no reward: the sample's group is not written as scored).
    failed: str | None = None
    judge: dict[str, Any] | None = None  # what an LLM judge said (the record's `judge`)


NO_CONTENT = RewardResult(0.0, "no answer content")


def finite(value: float, info: str | None, source: str) -> RewardResult:
    """The result for a score, unless it is NaN or infinite: then a counted 0, saying which `source` gave it."""
    if math.isfinite(value):
        return RewardResult(value, info)
    return RewardResult(0.0, f"{source} returned {value}", failed="invalid")


class Reward(Protocol):
    name: str

    async def score(self, requests: list[RewardRequest]) -> list[RewardResult]: ...

    async def aclose(self) -> None: ...
