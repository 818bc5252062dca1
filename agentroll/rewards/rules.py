"""Rule-based rewards: `math` (math-verify on the last \\boxed{}) and `exact` (normalized string equality).

Neither raises for one bad answer: an error or a timeout scores 0 and the cause goes into `RewardResult.info`,
which lands in the record's `reward_info`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
import re
from collections import OrderedDict

from ..parsing import last_boxed
from .base import NO_CONTENT, RewardRequest, RewardResult


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


def math_equal(label: str, answer: str, timeout_s: int) -> bool:
    """math-verify's verdict on two LaTeX values. Runs in a worker process, whose main thread lets
    math-verify's own signal-based timeouts work."""
    from math_verify import parse, verify

    gold = parse(f"${label}$", parsing_timeout=timeout_s)
    pred = parse(f"${answer}$", parsing_timeout=timeout_s)
    if not gold or not pred:
        return False
    return bool(verify(gold, pred, timeout_seconds=timeout_s))


class MathReward:
    """math-verify on the last `\\boxed{...}` of the answer, off the event loop in a small process pool.

    Verdicts are cached per (label, answer): solvers of one problem often agree, and sympy is slow.
    """

    name = "math"

    def __init__(self, timeout_s: float = 10.0, workers: int = 1, cache_size: int = 65536) -> None:
        self.timeout_s = timeout_s
        self.workers = workers
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._cache: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._cache_size = cache_size

    def _executor(self) -> concurrent.futures.ProcessPoolExecutor:
        if self._pool is None:
            # spawn, not fork: the parent has tokenizer and HTTP threads that a fork would copy mid-flight.
            context = multiprocessing.get_context("spawn")
            self._pool = concurrent.futures.ProcessPoolExecutor(self.workers, mp_context=context)
        return self._pool

    async def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: RewardRequest) -> RewardResult:
        if request.content is None:
            return NO_CONTENT
        answer = last_boxed(request.content)
        if answer is None:
            return RewardResult(0.0, "no \\boxed{} answer")
        key = (str(request.label), answer)
        if key in self._cache:
            self._cache.move_to_end(key)
            return RewardResult(1.0 if self._cache[key] else 0.0)
        loop = asyncio.get_running_loop()
        inner = max(1, int(self.timeout_s))
        future = loop.run_in_executor(self._executor(), math_equal, key[0], key[1], inner)
        try:
            equal = await asyncio.wait_for(future, self.timeout_s + 5)
        except asyncio.TimeoutError:
            self._reset_pool()
            return RewardResult(0.0, f"math-verify timed out after {self.timeout_s:g}s", failed="timeout")
        except Exception as exc:  # a crash of the check scores 0; the run goes on
            return RewardResult(0.0, f"math-verify error: {type(exc).__name__}: {exc}"[:300], failed="error")
        self._cache[key] = equal
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return RewardResult(1.0 if equal else 0.0)

    def _reset_pool(self) -> None:
        """A worker stuck past math-verify's own alarm is killed; the next check starts a fresh pool."""
        pool, self._pool = self._pool, None
        if pool is not None:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.kill()
            pool.shutdown(wait=False, cancel_futures=True)

    async def aclose(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            await asyncio.to_thread(pool.shutdown, wait=True, cancel_futures=True)
