"""How a client talks to its servers, as small value objects with their defaults declared once.

`generate`'s options are built from these defaults (agentroll.engine.options), the `Generator` turns its options into
them once, and every client of a run (the main one, a stage's own server, `doctor`) is made from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UsageError


@dataclass(frozen=True, kw_only=True, slots=True)
class Timeouts:
    request_s: float = 3600.0  # one completion attempt, once connected (--request-timeout)
    connect_s: float = 10.0  # opening a connection (--connect-timeout)
    aux_s: float = 30.0  # /tokenize, /health, /v1/models, /metrics


@dataclass(frozen=True, kw_only=True, slots=True)
class Retries:
    max_retries: int = 5  # per call, for transient failures (--max-retries)
    backoff_base_s: float = 0.5  # jittered exponential backoff: cap = base * 2 ** (attempt - 1)
    backoff_max_s: float = 30.0


@dataclass(frozen=True, kw_only=True, slots=True)
class Health:
    """When an endpoint leaves the rotation (`rotation.py`): its /health fails, or more of its calls over
    `window_s` (at least `bench_min_calls`) failed than retries can absorb: `bench_share` while another endpoint
    can take its calls; for the last one, the share at which most calls fail for good after every retry."""

    probe_interval_s: float = 5.0  # between /health probes of a benched endpoint (--probe-interval)
    down_timeout_s: float = 300.0  # how long calls wait when every endpoint is down (--down-timeout)
    window_s: float = 30.0
    bench_share: float = 0.5  # with another endpoint up
    bench_min_calls: int = 20


@dataclass(frozen=True, kw_only=True, slots=True)
class Concurrency:
    """`fixed`: most completion requests in flight over the run (--concurrency N); None: auto, per endpoint,
    following its /metrics from `start`, within [4, `per_endpoint`] (--max-concurrency); `fallback` for an
    endpoint without readable metrics."""

    fixed: int | None = None
    per_endpoint: int = 1024
    start: int = 16
    fallback: int = 64
    aux: int = 8  # /tokenize, /health... apart: a render never waits behind long generations

    @property
    def adaptive(self) -> bool:
        return self.fixed is None

    def ceiling(self, endpoints: int) -> int:
        """Most completions one client may have in flight, for sizing its connection pool."""
        return self.fixed if self.fixed is not None else self.per_endpoint * max(1, endpoints)


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientSettings:
    timeouts: Timeouts = Timeouts()
    retries: Retries = Retries()
    health: Health = Health()
    concurrency: Concurrency = Concurrency()  # auto, as --concurrency defaults to
    api_key: str | None = None
    affinity_slack: int = 8  # room for one group's first stage above a fair share (client.affine)


def read_key(path: str, flag: str = "--api-key-file") -> str:
    """An API key kept in a file (its first line, white space around it dropped): never on a command line, where
    every process of the machine sees it. `UsageError` naming the file and `flag`."""
    try:
        with open(path, encoding="utf-8") as f:
            key = f.readline().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag} {path}: cannot read it ({getattr(exc, 'strerror', None) or exc})") from None
    if not key:
        raise UsageError(f"{flag} {path}: its first line is empty")
    return key
