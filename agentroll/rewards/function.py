"""A user's own reward function, named `path/to/file.py:function` or `package.module:function`.

The function takes a `RewardRequest` and returns a number (or `{"reward": n, "info": "..."}`); it may be
`async`. A function with the attribute `batched = True` takes a list of requests and returns a list.

A sync function runs in worker processes of its own (`_user_function.py`, at most `concurrency`, started as
calls need them), one call at a time each: it never blocks the event loop, and a call past the timeout costs only
its own sample, which scores 0 (`failed="timeout"`): its worker is killed and replaced, and the other calls go on
(`_pool.py`, as the math check's). The function must therefore be importable by its path (a file, or a module
on agentroll's `sys.path`), which is checked at start. An async function runs in agentroll's event loop and is
cancelled at the timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import operator
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import orjson

from ..errors import RewardError
from ..process.loading import load_object
from ._pool import CheckFailed, CheckTimeout, WorkerPool, WorkerUnavailable
from .base import RewardRequest, RewardResult, finite

log = logging.getLogger("agentroll")

WORKER = str(Path(__file__).with_name("_user_function.py"))


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


class FunctionPool(WorkerPool):
    what = "reward function's worker"


class FunctionReward:
    """A user's function; `concurrency` caps the worker processes its sync calls run in (`--reward-concurrency`)."""

    def __init__(self, spec: str, timeout_s: float = 10.0, concurrency: int = 32) -> None:
        self.name = spec
        self.function = load_function(spec)
        self.timeout_s = timeout_s
        self.batched = bool(getattr(self.function, "batched", False))
        self.is_async = inspect.iscoroutinefunction(self.function)
        self._pool = FunctionPool(
            [sys.executable, WORKER, spec, orjson.dumps([p for p in sys.path if p]).decode()], concurrency, timeout_s
        )
        self._warned = False

    async def ready(self) -> None:
        """A sync function loaded in a worker process (`RewardError` at start when it cannot be)."""
        if not self.is_async:
            await self._worker(None)

    async def _worker(self, given: Any) -> Any:
        try:
            payload = orjson.dumps(given, default=str, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
            return orjson.loads(await self._pool.call(payload))
        except WorkerUnavailable as exc:
            raise RewardError(
                f"reward {self.name} cannot run in a worker process ({exc}): a sync reward function runs in worker "
                "processes, so that a call that hangs can be stopped; make it importable by its path "
                "(FILE.py:FUNCTION, or a module agentroll can import), or make it async"
            ) from None

    async def _call(self, argument: Any) -> list[RewardResult]:
        """The results of one call: one, or a batch's."""
        if self.is_async:
            value = await asyncio.wait_for(self.function(argument), self.timeout_s)
            if not self.batched:
                return [as_result(value, self.name)]
            if not isinstance(value, list | tuple) or len(value) != len(argument):
                raise RewardError(f"batched reward {self.name!r} must return one value per request")
            return [as_result(v, self.name) for v in value]
        given = [asdict(r) for r in argument] if self.batched else asdict(argument)
        try:
            kind, said = await self._worker(given)
        except CheckTimeout:
            raise asyncio.TimeoutError from None
        if kind == "stop":
            raise RewardError(said)
        if kind == "raised":
            raise Raised(said)
        return [RewardResult(*r) for r in (said if self.batched else [said])]

    def _failed(self, exc: BaseException) -> RewardResult:
        if isinstance(exc, asyncio.TimeoutError):
            return RewardResult(0.0, f"reward function timed out after {self.timeout_s:g}s", failed="timeout")
        why = str(exc) if isinstance(exc, Raised | CheckFailed) else f"{type(exc).__name__}: {exc}"
        if not self._warned:
            self._warned = True
            log.warning(
                "reward function %s raised %s (scored 0; further errors are counted, not logged)", self.name, why
            )
        return RewardResult(0.0, f"reward function error: {why}"[:300], failed="error")

    async def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        if self.batched:
            try:
                return await self._call(list(requests))
            except RewardError:
                raise
            except (Exception, asyncio.TimeoutError) as exc:
                return [self._failed(exc)] * len(requests)
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: RewardRequest) -> RewardResult:
        try:
            (result,) = await self._call(request)
        except RewardError:
            raise
        except (Exception, asyncio.TimeoutError) as exc:
            return self._failed(exc)
        return result

    async def aclose(self) -> None:
        self._pool.close()


class Raised(Exception):
    """The function raised in its worker: `Type: message`."""
