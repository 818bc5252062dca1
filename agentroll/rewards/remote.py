"""A reward model behind HTTP: `POST {"prompt", "response", "label", "metadata"}` -> a number or `{"reward": n}`."""

from __future__ import annotations

import asyncio
import json
import math
import random
from typing import Any

import aiohttp
import orjson

from ..errors import RewardError
from .base import RewardRequest, RewardResult, finite

RETRYABLE = frozenset({408, 429, 500, 502, 503, 504})


def read_reward(body: bytes) -> float:
    """The score in a reply, or ValueError saying what was wrong with it. It may be NaN or infinite: Python's
    `json.dumps` writes those as `NaN` and `Infinity`, which orjson refuses."""
    try:
        data: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        try:
            data = json.loads(body)
        except ValueError:
            raise ValueError(f"reply is not JSON: {body[:120]!r}") from None
    if isinstance(data, dict):
        data = data.get("reward")
    if isinstance(data, bool) or not isinstance(data, int | float):
        raise ValueError(f'reply is not a number or {{"reward": number}}: {body[:120]!r}')
    try:
        return float(data)
    except OverflowError:  # an integer past float's range
        return math.inf if data > 0 else -math.inf


class RemoteReward:
    """One shared HTTP client with its own concurrency cap and retries; each attempt has `timeout_s` from when
    it gets a slot (`--reward-timeout`). The full response text is sent and the score is used as it is, unless
    it is NaN or infinite (a counted 0). A reward server that answers badly, or not at all after the retries,
    stops the run (exit 5): scoring every sample 0 would silently poison the training data."""

    name = "remote"

    def __init__(
        self,
        url: str,
        concurrency: int = 32,
        timeout_s: float = 10.0,
        max_retries: int = 5,
        backoff_base_s: float = 0.5,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise RewardError(f"--reward-url {url!r} must be an http:// or https:// URL")
        self.url = url
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self._slots = asyncio.Semaphore(concurrency)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._http: aiohttp.ClientSession | None = None  # made on first use, inside the event loop

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=self._timeout,
                headers={"content-type": "application/json"},
                connector=aiohttp.TCPConnector(limit=0),
            )
        return self._http

    async def score(self, requests: list[RewardRequest]) -> list[RewardResult]:
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def _one(self, request: RewardRequest) -> RewardResult:
        body = orjson.dumps(
            {
                "prompt": request.prompt if request.prompt is not None else request.problem,
                "response": request.response,
                "label": request.label,
                "metadata": request.metadata,
            }
        )
        for attempt in range(self.max_retries + 1):
            try:
                async with self._slots, self._session().post(self.url, data=body) as response:
                    status, reply = response.status, await response.read()
            except asyncio.TimeoutError:
                problem = f"no reply within {self.timeout_s:g}s"
            except aiohttp.ClientError as exc:
                problem = f"{type(exc).__name__}: {exc}"
            else:
                if status == 200:
                    try:
                        return finite(read_reward(reply), None, "the reward model")
                    except ValueError as exc:
                        raise RewardError(f"reward server {self.url}: {exc}") from None
                problem = f"HTTP {status}: {reply[:200].decode('utf-8', 'replace')}"
                if status not in RETRYABLE:
                    raise RewardError(f"reward server {self.url} answered {problem}")
            if attempt < self.max_retries:
                cap = self.backoff_base_s * 2**attempt
                await asyncio.sleep(random.uniform(cap / 2, cap))
        raise RewardError(f"reward server {self.url} failed {self.max_retries + 1} times; last: {problem}")

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.close()
