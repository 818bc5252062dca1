"""The one-method seam under the client: an HTTP exchange, `(status, body)` or `TransportFailure`.

`AiohttpTransport` is what runs (aiohttp, not httpx: at 64+ connections httpcore's pool costs ~12 ms of CPU per
request against aiohttp's ~0.25 ms; bench/transport.py, docs/performance.md). `FunctionTransport` wraps a plain
function, so the client's retries, routing and scheduling are tested without sockets.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Protocol

import aiohttp


class TransportFailure(Exception):
    """No HTTP answer: refused, reset, dropped, or timed out."""


class Transport(Protocol):
    async def request(self, method: str, url: str, body: bytes | None, timeout_s: float) -> tuple[int, bytes]: ...

    async def aclose(self) -> None: ...


class AiohttpTransport:
    """A connection pool with a connection for every request the client may have in flight (`connections`), so a
    request never waits for one and a timeout never counts time queued behind others. A timed-out, cancelled or
    broken request's connection is closed (never reused), so vLLM sees the client go and aborts the request."""

    def __init__(self, connections: int, connect_timeout_s: float, api_key: str | None = None) -> None:
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self.connections = connections
        self._connect_s = connect_timeout_s
        self._http = aiohttp.ClientSession(  # trust_env off: it reads ~/.netrc on every request
            headers=headers,
            connector=aiohttp.TCPConnector(
                limit=connections, limit_per_host=0, keepalive_timeout=4.0
            ),  # below uvicorn's 5 s: never reuse a closing one
        )

    async def request(self, method: str, url: str, body: bytes | None, timeout_s: float) -> tuple[int, bytes]:
        timeout = aiohttp.ClientTimeout(total=timeout_s, connect=None, sock_connect=self._connect_s)
        try:
            async with self._http.request(method, url, data=body, timeout=timeout) as response:
                return response.status, await response.read()
        except asyncio.TimeoutError as exc:
            raise TransportFailure(f"timed out after {timeout_s:g}s") from exc
        except aiohttp.ClientError as exc:
            raise TransportFailure(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc

    async def aclose(self) -> None:
        await self._http.close()


Handler = Callable[[str, str, bytes | None], "tuple[int, bytes] | Awaitable[tuple[int, bytes]]"]


class FunctionTransport:
    """`handler(method, url, body)` answers each request (sync or async); raising `TransportFailure` is a lost
    connection. It records each request in `sent`."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.sent: list[tuple[str, str, bytes | None]] = []

    async def request(self, method: str, url: str, body: bytes | None, timeout_s: float) -> tuple[int, bytes]:
        self.sent.append((method, url, body))
        answer = self.handler(method, url, body)
        if inspect.isawaitable(answer):
            try:
                return await asyncio.wait_for(answer, timeout_s)
            except asyncio.TimeoutError as exc:
                raise TransportFailure(f"timed out after {timeout_s:g}s") from exc
        return answer

    async def aclose(self) -> None:
        return None
