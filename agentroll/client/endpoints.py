"""One server of the rotation: its calls in flight, its limit, and the evidence on whether it is up.

It keeps the outcomes of its recent calls: the evidence `rotation.Rotation` benches it on.
"""

from __future__ import annotations

import math
import time
from collections import deque
from urllib.parse import urlsplit

from ..errors import UsageError
from .settings import Health

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
FATAL_STATUS = frozenset({401, 403, 404})


def normalize_base_url(url: str) -> str:
    """`http://h:8000`, `http://h:8000/` and `http://h:8000/v1` all name the same server. A URL that is not
    http(s)://HOST[:PORT] is a usage error (exit 2)."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"base URL {url!r}: expected http://HOST[:PORT] or https://HOST[:PORT]")
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError:
        raise UsageError(f"base URL {url!r}: the port is not a number") from None
    return url


class Endpoint:
    def __init__(self, url: str, health: Health | None = None) -> None:
        self.url = url
        self.health = health or Health()
        self.in_flight = 0
        self.down = False
        self.last_error = ""
        self.limit: float = math.inf  # --concurrency auto: this endpoint's own cap, moved by its /metrics
        self.last_probe = -math.inf  # when its /health was last asked after a failure
        self.probing = False
        self.benched_for_calls = False  # benched because its calls failed, not its /health
        self._outcomes: deque[tuple[float, bool]] = deque()

    def record(self, ok: bool, error: str = "") -> None:
        now = time.monotonic()
        if not ok:
            self.last_error = error
        outcomes = self._outcomes
        outcomes.append((now, ok))
        while outcomes and outcomes[0][0] < now - self.health.window_s:
            outcomes.popleft()

    def failing(self, share: float) -> bool:
        """More than `share` of its calls over the window failed (out of enough calls to tell)."""
        calls = len(self._outcomes)
        failed = sum(1 for _, ok in self._outcomes if not ok)
        return calls >= self.health.bench_min_calls and failed > share * calls

    def may_probe(self) -> bool:
        """Ask its /health after a failure? Not while a probe runs or was asked within the probe interval."""
        return not self.probing and time.monotonic() - self.last_probe >= self.health.probe_interval_s

    def back(self) -> None:
        self.down = False
        self._outcomes.clear()

    def has_room(self) -> bool:
        return not self.down and self.in_flight < self.limit
