"""Which endpoints take calls: the evidence that one is down, its probes, and the pause when all are.

An endpoint leaves the rotation on evidence that it is down, never for a few unlucky answers among many in
flight: a failure makes the client ask its `/health` (at most once per probe interval), and it is benched when
that probe fails, or when its failure share over the recent window is more than retries can absorb. While
another endpoint can take the calls, that is half of them; for the last one it is the share at which most calls
would fail for good even after every retry, so 5% of 500s never bench it, and a server that fails (nearly) every
call while its /health says 200 does. An endpoint benched for its calls comes back only when a one-token call
answers again, not on its /health alone. When every endpoint is down, calls wait (one line when the pause starts,
one when it ends) up to the down timeout, then fail with a `ServerError` (exit 4): the run stops, no group is
marked failed for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ..errors import ServerError
from .endpoints import RETRYABLE_STATUS, Endpoint
from .settings import ClientSettings
from .transport import TransportFailure

log = logging.getLogger("agentroll")

Ask = Callable[[str, str, bytes | None], Awaitable[tuple[int, bytes]]]


class Rotation:
    """The endpoints of one client, up or down. `ask` is the client's side request (outside the completion
    slots), `spawn` its background tasks, `on_change` re-grants slots when an endpoint comes back or all die."""

    def __init__(
        self,
        endpoints: list[Endpoint],
        settings: ClientSettings,
        ask: Ask,
        spawn: Callable[[Any], None],
        on_change: Callable[[], None],
    ) -> None:
        self.endpoints = endpoints
        self.settings = settings
        self._ask, self._spawn, self._on_change = ask, spawn, on_change
        self._back = asyncio.Event()  # an endpoint came back
        self._outage: float | None = None  # when every endpoint went down
        self.dead: ServerError | None = None  # down past the down timeout: every call fails
        self.trial: tuple[str, bytes] | None = None  # a one-token call (path, body), to see a benched one answer
        retries = settings.retries.max_retries
        # the failure share at which a call fails for good even after every retry more often than not
        self.last_share = 0.5 ** (1 / (retries + 1))

    async def live(self, prefer: Endpoint | None = None, avoid: Endpoint | None = None) -> Endpoint:
        """An endpoint that is up, for calls that take no completion slot (renders, probes); with every endpoint
        down, waits for one to come back, up to the down timeout."""
        while True:
            if self.dead is not None:
                raise self.dead
            up = [e for e in self.endpoints if not e.down]
            if up:
                if prefer is not None and prefer in up and prefer is not avoid:
                    return prefer
                return min([e for e in up if e is not avoid] or up, key=lambda e: e.in_flight)
            self._back.clear()
            await self._back.wait()

    def failed(self, endpoint: Endpoint, error: str) -> None:
        """A failure on `endpoint`: ask its /health (once per probe interval); bench it on the evidence."""
        endpoint.record(ok=False, error=error)
        if endpoint.down:
            return
        alone = not any(not e.down for e in self.endpoints if e is not endpoint)
        share = self.last_share if alone else endpoint.health.bench_share
        if endpoint.failing(share):
            why = "nearly every call failed of late" if alone else "most of its recent calls failed"
            self.mark_down(endpoint, f"{error}; {why}", calls=True)
            return
        if endpoint.may_probe():
            endpoint.probing, endpoint.last_probe = True, time.monotonic()
            self._spawn(self._check(endpoint))

    async def _check(self, endpoint: Endpoint) -> None:
        try:
            ok = await self._healthy(endpoint)
        finally:
            endpoint.probing = False
        if not ok and not endpoint.down:
            self.mark_down(endpoint, endpoint.last_error)

    async def _healthy(self, endpoint: Endpoint) -> bool:
        try:
            status, _ = await self._ask("GET", f"{endpoint.url}/health", None)
        except TransportFailure:
            return False
        return status == 200

    async def _answers(self, endpoint: Endpoint) -> bool:
        """Does a one-token call get an answer? A status retries would not redo (400) is an answer too."""
        if self.trial is None:
            return True
        path, body = self.trial
        try:
            status, _ = await self._ask("POST", f"{endpoint.url}{path}", body)
        except TransportFailure:
            return False
        return status not in RETRYABLE_STATUS

    def mark_down(self, endpoint: Endpoint, error: str, calls: bool = False) -> None:
        """Out of rotation until `GET /health` answers 200 again (and, when benched for its `calls`, a
        one-token call answers too)."""
        if endpoint.down:
            return
        endpoint.down, endpoint.last_error, endpoint.benched_for_calls = True, error, calls
        interval = self.settings.health.probe_interval_s
        self._spawn(self._probe(endpoint))
        if all(e.down for e in self.endpoints) and self._outage is None:
            self._outage = time.monotonic()
            log.warning(
                "endpoint %s out of rotation (%s): every endpoint is down, calls wait up to %gs for one to "
                "answer again (probed every %gs)",
                endpoint.url,
                error,
                self.settings.health.down_timeout_s,
                interval,
            )
            self._spawn(self._outage_deadline())
        else:
            log.warning("endpoint %s out of rotation (%s); probing it every %gs", endpoint.url, error, interval)

    async def _probe(self, endpoint: Endpoint) -> None:
        while True:
            await asyncio.sleep(self.settings.health.probe_interval_s)
            if await self._healthy(endpoint) and (not endpoint.benched_for_calls or await self._answers(endpoint)):
                break
        endpoint.back()
        if self._outage is not None:
            log.warning(
                "endpoint %s is back after %.1fs of outage: resuming", endpoint.url, time.monotonic() - self._outage
            )
            self._outage = None
        else:
            log.warning("endpoint %s is back", endpoint.url)
        self._back.set()
        self._on_change()

    async def _outage_deadline(self) -> None:
        started = self._outage
        await asyncio.sleep(self.settings.health.down_timeout_s)
        if self._outage is not None and self._outage == started:
            detail = "; ".join(f"{e.url}: {e.last_error}" for e in self.endpoints)
            self.dead = ServerError(
                f"every endpoint has been down for {self.settings.health.down_timeout_s:.0f}s ({detail})"
            )
            self._on_change()
            self._back.set()
