"""A user's own reward function, named `path/to/file.py:function` or `package.module:function`.

The function takes a `RewardRequest` and returns a number (or `{"reward": n, "info": "..."}`); it may be
`async`. A function with the attribute `batched = True` takes a list of requests and returns a list. Sync
functions run in threads of their own (at most `concurrency`, see `_threads.py`), so they never block the event
loop nor the threads the rest of agentroll uses.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import operator
from collections.abc import Callable
from typing import Any

from ..errors import RewardError
from ..loading import load_object
from ._threads import CallThreads, PoolExhausted
from .base import RewardRequest, RewardResult, finite

log = logging.getLogger("agentroll")


def load_function(spec: str) -> Callable[..., Any]:
    function = load_object(spec, "reward", RewardError, "function")
    if not callable(function):
        raise RewardError(f"reward {spec!r}: {spec.rpartition(':')[0]}'s {spec.rpartition(':')[2]!r} is not a function")
    return function


def as_result(value: Any, spec: str) -> RewardResult:
    """A number (numpy's too) is the reward; NaN or infinity is refused and counted (`failed="invalid"`); anything
    else is a bug in the function that would score every sample alike, so it stops the run."""
    info = None
    if isinstance(value, dict):
        value, info = value.get("reward"), value.get("info")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise RewardError(f'reward {spec!r} returned {value!r}: expected a number or {{"reward": number}}')
    try:
        number = float(value)
    except OverflowError:  # an int past float's range
        number = -math.inf if operator.lt(value, 0) else math.inf
    return finite(number, None if info is None else str(info), "reward function")


class FunctionReward:
    """A user's function; `concurrency` caps the threads its sync calls run in (`--reward-concurrency`)."""

    def __init__(self, spec: str, timeout_s: float = 10.0, concurrency: int = 32) -> None:
        self.name = spec
        self.function = load_function(spec)
        self.timeout_s = timeout_s
        self.batched = bool(getattr(self.function, "batched", False))
        self.is_async = inspect.iscoroutinefunction(self.function)
        self._threads = CallThreads(concurrency, f"agentroll-reward {spec}")
        self._warned = False

    async def _call(self, argument: Any) -> Any:
        if self.is_async:
            return await asyncio.wait_for(self.function(argument), self.timeout_s)
        # A sync function that overruns keeps its thread until it returns; its result is then ignored.
        try:
            return await self._threads.run(self.function, argument, self.timeout_s)
        except PoolExhausted as exc:
            stuck = [getattr(a[0] if isinstance(a, list) and a else a, "problem_id", "?") for a in exc.stuck]
            stuck = list(dict.fromkeys(stuck))  # one problem's several hung calls: named once
            raise RewardError(
                f"reward {self.name}: all {exc.size} of its threads are stuck in calls past "
                f"--reward-timeout {self.timeout_s:g}s (problems {', '.join(map(str, stuck[:5]))}); "
                "nothing else can be scored: fix the function (or raise --reward-concurrency)"
            ) from None

    def _failed(self, exc: BaseException) -> RewardResult:
        if isinstance(exc, asyncio.TimeoutError):
            return RewardResult(0.0, f"reward function timed out after {self.timeout_s:g}s", failed="timeout")
        if not self._warned:
            self._warned = True
            log.warning(
                "reward function %s raised %s: %s (scored 0; further errors are counted, not logged)",
                self.name,
                type(exc).__name__,
                exc,
            )
        return RewardResult(0.0, f"reward function error: {type(exc).__name__}: {exc}"[:300], failed="error")

    async def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        if self.batched:
            try:
                values = await self._call(list(requests))
            except RewardError:
                raise
            except (Exception, asyncio.TimeoutError) as exc:
                return [self._failed(exc)] * len(requests)
            if not isinstance(values, list | tuple) or len(values) != len(requests):
                raise RewardError(f"batched reward {self.name!r} must return one value per request")
            return [as_result(v, self.name) for v in values]
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: RewardRequest) -> RewardResult:
        try:
            value = await self._call(request)
        except RewardError:
            raise
        except (Exception, asyncio.TimeoutError) as exc:
            return self._failed(exc)
        return as_result(value, self.name)

    async def aclose(self) -> None:
        self._threads.close()
