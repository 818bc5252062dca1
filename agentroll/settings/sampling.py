"""How a call samples, as one value object: declared here with its defaults, validated here only.

`generate`'s flags (--temperature, ...), a stage's own settings (--stage NAME.temperature=...) and a system's
per-call overrides (`ctx.complete(..., temperature=...)`) all become a `Sampling` through `Sampling.of`/`with_`,
so a value is checked once, with one message.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any

from agentroll.errors import UsageError

KEYS = ("max_tokens", "temperature", "top_p", "top_k", "min_p")
# what vLLM would otherwise fill in from the model's generation_config.json: sent as neutral values on every call
NEUTRAL = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


RULES: dict[str, tuple[Any, str]] = {
    "max_tokens": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1, "a whole number of at least 1"),
    "temperature": (lambda v: _number(v) and v >= 0, "0 or more"),
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "in (0, 1]"),
    "top_k": (
        lambda v: isinstance(v, int) and not isinstance(v, bool) and (v >= 0 or v == -1),
        "at least 1 (or -1: off)",
    ),
    "min_p": (lambda v: _number(v) and 0 <= v <= 1, "in [0, 1]"),
}


@dataclass(frozen=True, kw_only=True, slots=True)
class Sampling:
    max_tokens: int = 4096  # most tokens per response (capped to the context left)
    temperature: float = 1.0
    top_p: float = 1.0  # 1: off
    top_k: int = -1  # -1 (or 0, as vLLM takes it): off
    min_p: float = 0.0  # 0: off

    def __post_init__(self) -> None:
        for name in KEYS:
            value = getattr(self, name)
            check, what = RULES[name]
            if not check(value):
                raise UsageError(f"--{name.replace('_', '-')} must be {what}, got {value!r}")
        if self.top_k == 0:
            object.__setattr__(self, "top_k", -1)  # vLLM takes 0 and -1 alike: off

    def with_(self, overrides: dict[str, Any], where: str = "") -> Sampling:
        """This sampling with `overrides` (names of `KEYS`), each checked; `where` names them in a message."""
        unknown = sorted(set(overrides) - set(KEYS))
        if unknown:
            raise UsageError(f"{where or 'sampling'}: {', '.join(unknown)} is not one of {', '.join(KEYS)}")
        try:
            return replace(self, **overrides)
        except UsageError as exc:
            raise UsageError(f"{where}: {exc}" if where else str(exc)) from None

    def params(self) -> dict[str, Any]:
        """What shapes the distribution, sent explicitly on every call (max_tokens apart: it is capped per call)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            **NEUTRAL,
        }


DEFAULT = Sampling()
FIELDS = tuple(f.name for f in fields(Sampling))
