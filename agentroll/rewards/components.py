"""`--reward-component NAME=SPEC[*WEIGHT]`: several rewards at once, each named and weighted.

Each component is a reward of its own (`math`, `exact`, `code`, `remote`, `judge`, a function), scoring every
sample; the sample's `raw_reward` is the sum of value x weight, and `reward_components` keeps each one's value and
weight, so a trainer that wants the parts (GDPO-style per-component normalisation, NeMo Gym's components,
verifiers' per-function metrics) has them. A component that fails counts as its reward's failures do (a judge's
failure is no reward at all, whatever the others say).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..errors import UsageError
from .base import RewardResult

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


@dataclass(frozen=True, slots=True)
class Component:
    name: str
    spec: str
    weight: float = 1.0


def graded(components: tuple[Component, ...] | list[Component]) -> bool:
    """Whether the run's outcomes stay on the 0..1 scale where 1 means solved (every part right): no components,
    or weights none below 0 that add up to 1. Otherwise pass@k and a share solved mean nothing: none is given."""
    return not components or (
        all(c.weight >= 0 for c in components) and abs(sum(c.weight for c in components) - 1) < 1e-9
    )


def parse_component(text: str) -> Component:
    """`NAME=SPEC` or `NAME=SPEC*WEIGHT` (a weight may be negative: a penalty). `UsageError` saying what is wrong."""
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep or not _NAME.fullmatch(name) or not rest.strip():
        raise UsageError(f"--reward-component {text!r}: expected NAME=SPEC or NAME=SPEC*WEIGHT, e.g. style=judge*0.5")
    spec, _, weight = rest.rpartition("*") if "*" in rest else (rest, "", "1")
    try:
        value = float(weight)
    except ValueError:
        raise UsageError(f"--reward-component {text!r}: weight {weight!r} is not a number") from None
    if not math.isfinite(value):
        raise UsageError(f"--reward-component {text!r}: weight {weight!r} is not finite")
    return Component(name, spec.strip(), value)


def parse_components(texts: list[str]) -> tuple[Component, ...]:
    made = tuple(parse_component(t) for t in texts)
    names = [c.name for c in made]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise UsageError(f"--reward-component: {', '.join(twice)} named twice")
    return made


def combined(
    components: tuple[Component, ...], results: list[RewardResult]
) -> tuple[RewardResult, dict[str, dict[str, float]]]:
    """One sample's result from its components' (in order): the weighted sum, each part said in `info`; the first
    failure's kind (a judge's before any other); the judge's verdict."""
    value = sum(c.weight * r.value for c, r in zip(components, results, strict=True))
    parts = [
        f"{c.name} {r.value:g}x{c.weight:g}" + (f" ({r.info})" if r.info else "")
        for c, r in zip(components, results, strict=True)
    ]
    kinds = [r.failed for r in results if r.failed]
    failed = "judge" if "judge" in kinds else (kinds[0] if kinds else None)
    judge = next((r.judge for r in results if r.judge is not None), None)
    parts_of = {c.name: {"value": r.value, "weight": c.weight} for c, r in zip(components, results, strict=True)}
    return RewardResult(value, "; ".join(parts), failed=failed, judge=judge), parts_of
