"""Rule-based rewards: `math` (math-verify on the last \\boxed{}) and `exact` (normalized string equality).

Neither raises for one bad answer: an error or a timeout scores 0 and the cause goes into `RewardResult.info`,
which lands in the record's `reward_info`.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from fractions import Fraction

from ..errors import RewardError
from ..record.parsing import last_boxed
from ._pool import CheckFailed, CheckPool, CheckTimeout, WorkerUnavailable
from ._worker import math_equal
from .base import NO_CONTENT, RewardRequest, RewardResult

__all__ = ["ExactReward", "MathReward", "math_equal"]


# ASCII digits only (`\\d` takes any script's digits, which math-verify does not), and few enough for `int()`
_RATIONAL = re.compile(r"([+-]?)(?:([0-9]{1,1000})|\\[dt]?frac\{\s*([0-9]{1,1000})\s*\}\{\s*([0-9]{1,1000})\s*\})")


def _rational(text: str) -> Fraction | None:
    """A plain integer, or `\\frac{a}{b}` of two (`\\dfrac`, `\\tfrac`, a sign before it), as an exact value."""
    found = _RATIONAL.fullmatch(text.strip())
    if found is None:
        return None
    sign, whole, top, bottom = found.groups()
    if whole is not None:
        value = Fraction(int(whole))
    elif int(bottom) == 0:
        return None
    else:
        value = Fraction(int(top), int(bottom))
    return -value if sign == "-" else value


def quick_verdict(label: str, answer: str) -> bool | None:
    """math-verify's verdict where it is certain without sympy, else None: two exact rationals (integers,
    `\\frac{84}{2}`) are equal exactly when their values are. Decimals are left to math-verify: it rounds them."""
    a, b = _rational(label), _rational(answer)
    if a is None or b is None:
        return None
    return a == b


def _normalize(text: str) -> str:
    text = text.strip().strip("$").strip()
    return re.sub(r"\s+", " ", text).lower()


class ExactReward:
    """1.0 when the last boxed answer (or, without one, the whole answer) equals the label, after normalizing
    case, surrounding `$` and runs of white space."""

    name = "exact"

    async def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return [self._one(r) for r in requests]

    @staticmethod
    def _one(request: RewardRequest) -> RewardResult:
        if request.content is None:
            return NO_CONTENT
        answer = last_boxed(request.content)
        answer = request.content if answer is None else answer
        return RewardResult(1.0 if _normalize(answer) == _normalize(str(request.label)) else 0.0)

    async def aclose(self) -> None:
        pass


class MathReward:
    """math-verify on the last `\\boxed{...}` of the answer, in worker processes off the event loop (`_pool.py`).

    Each check has `timeout_s` from the moment a worker starts it; one that overruns scores 0 and costs only its
    own worker, which is replaced. Verdicts are cached per (label, answer): solvers of one problem often agree,
    and sympy is slow.
    """

    name = "math"

    def __init__(self, timeout_s: float = 10.0, workers: int = 1, cache_size: int = 65536) -> None:
        """`workers`: processes checking at once. A slow check then holds up only its own worker, and the other
        groups' stages go on."""
        self.timeout_s = timeout_s
        self.workers = workers
        self._pool = CheckPool(workers, timeout_s)
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._cache_size = cache_size

    async def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: RewardRequest) -> RewardResult:
        if request.content is None:
            return NO_CONTENT
        answer = last_boxed(request.content)
        if answer is None:
            return RewardResult(0.0, "no \\boxed{} answer")
        key = (str(request.label), answer)
        quick = quick_verdict(*key)
        if quick is not None:
            return RewardResult(1.0 if quick else 0.0)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return RewardResult(1.0 if cached else 0.0)
        try:
            # math-verify's own (whole-second) timeouts may end a slow step first; it then says "not equal".
            equal = await self._pool.check(key[0], key[1], max(1, int(self.timeout_s)))
        except CheckTimeout:
            return RewardResult(0.0, f"math-verify timed out after {self.timeout_s:g}s", failed="timeout")
        except WorkerUnavailable as exc:  # nothing can be checked: scoring every answer 0 would be silent loss
            raise RewardError(f"the math reward cannot check answers: {exc}") from None
        except CheckFailed as exc:  # a crash of the check scores 0; the run goes on
            return RewardResult(0.0, f"math-verify error: {exc}"[:300], failed="error")
        self._cache[key] = equal
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return RewardResult(1.0 if equal else 0.0)

    async def ready(self) -> None:
        """One check through a worker, so that a worker that cannot start is a set-up failure (`RewardError`,
        exit 5) before any group is written, not zeros for every answer off the fast path."""
        try:
            await self._pool.check("1", "1", 1)
        except WorkerUnavailable as exc:
            raise RewardError(f"the math reward cannot check answers: {exc}") from None
        except CheckFailed:
            pass  # the worker runs: one check failing is that check's business

    async def aclose(self) -> None:
        self._pool.close()


class AgentReported:
    """`--reward agent`: the reward the agent reports (`--system agent` sets it on its records itself); asked to
    score anything, it refuses: no other system has an agent's own reward."""

    name = "agent"

    async def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        raise RewardError("--reward agent is the reward an agent reports: only --system agent has one")

    async def aclose(self) -> None:
        pass
