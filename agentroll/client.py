"""Token-in, token-out client for vLLM: `/v1/completions` or the native `/inference/v1/generate` (`wire.py`).

The prompt goes out as token ids; the response's token ids and logprobs are taken from the server's answer as
they are, never re-tokenized. Concurrency is a hard cap over the whole run; transient failures are retried with
jittered exponential backoff (asyncio.sleep, never blocking the loop); 401/404 end the run.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from .errors import ServerError
from .wire import APIS, PATHS, Completion, WireError, parse, request_body

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
FATAL_STATUS = frozenset({401, 403, 404})
FINISHED = frozenset({"stop", "length"})  # what a finished generation ends with; "abort" and the rest are retried

log = logging.getLogger("agentroll")


def normalize_base_url(url: str) -> str:
    """`http://h:8000`, `http://h:8000/` and `http://h:8000/v1` all name the same server."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    if not url.startswith(("http://", "https://")):
        raise ServerError(f"base URL {url!r} must start with http:// or https://")
    return url


def error_message(body: bytes, status: int) -> str:
    """The server's own message, from either vLLM error shape (`{"error": {...}}` or `{"object": "error", ...}`)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace").strip()
        return text[:500] or f"HTTP {status}"
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])
        if isinstance(inner, str):  # vLLM's --api-key middleware: {"error": "Unauthorized"}
            return inner
        if data.get("message"):
            return str(data["message"])
        if data.get("detail"):
            return str(data["detail"])
    return f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}"


class TransportFailure(Exception):
    """No HTTP answer: refused, reset, dropped, or timed out."""


class CallFailed(Exception):
    """One completion call failed for good (after retries, or at once for a non-retryable answer)."""

    def __init__(self, message: str, status: int | None = None, retryable: bool = False,
                 endpoint: Endpoint | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.endpoint = endpoint  # the one that failed: a retry goes elsewhere if it can


class Endpoint:
    """One server: its requests in flight, and whether it is out of rotation after repeated failures."""

    def __init__(self, url: str, failure_threshold: int = 3) -> None:
        self.url = url
        self.in_flight = 0
        self.consecutive_failures = 0
        self.failure_threshold = failure_threshold
        self.down = False
        self.last_error = ""
        self.limit: float = math.inf  # --concurrency auto: this endpoint's own cap, moved by its /metrics

    def record(self, ok: bool, error: str = "") -> bool:
        """Count a call's outcome; True when this failure takes the endpoint out of rotation."""
        if ok:
            self.consecutive_failures = 0
            return False
        self.last_error = error
        self.consecutive_failures += 1
        return not self.down and self.consecutive_failures >= self.failure_threshold


@dataclass(slots=True)
class ClientCounters:
    requests: int = 0
    retries: int = 0
    failures: int = 0
    in_flight: int = 0
    peak_in_flight: int = 0
    concurrency: dict[str, int] = field(default_factory=dict)  # --concurrency auto: each endpoint's limit now


class CompletionClient:
    def __init__(
        self,
        base_urls: list[str],
        *,
        api_key: str | None = None,
        concurrency: int = 64,
        timeout_s: float = 3600.0,
        connect_timeout_s: float = 10.0,
        aux_concurrency: int = 8,
        aux_timeout_s: float = 30.0,
        max_retries: int = 5,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 30.0,
        probe_interval_s: float = 5.0,
        down_timeout_s: float = 300.0,
        api: str = "completions",
        affinity_slack: int = 8,
        adaptive: bool = False,
    ) -> None:
        if not base_urls:
            raise ServerError("no server given: pass --base-url or set AGENTROLL_BASE_URL")
        if api not in APIS:
            raise ValueError(f"api must be one of {APIS}, not {api!r}")
        self.api = api  # "completions" or "generate"; `detect_api` settles --api auto
        self.affinity_slack = affinity_slack
        self.endpoints = [Endpoint(normalize_base_url(u)) for u in dict.fromkeys(base_urls)]
        self.by_url = {e.url: e for e in self.endpoints}
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.probe_interval_s = probe_interval_s
        self.down_timeout_s = down_timeout_s
        self.counters = ClientCounters()
        self._endpoint_back = asyncio.Event()
        self._probes: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(concurrency)  # under --concurrency auto: --max-concurrency, the ceiling
        self.adaptive = adaptive
        # picks waiting for room under --concurrency auto, woken one per freed slot (first come, first served):
        # waking them all on every answer cost milliseconds of CPU per request with hundreds waiting
        self._waiting: collections.deque[asyncio.Future[None]] = collections.deque()
        self._adapters: set[asyncio.Task[None]] = set()
        # /tokenize, /health and /v1/models have their own small cap, apart from completions: a render never
        # waits behind C long generations, and never takes a slot a completion needs.
        self._aux_slots = asyncio.Semaphore(aux_concurrency)
        headers = {"content-type": "application/json"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        # aiohttp, not httpx: at 64+ connections httpcore's pool costs ~12 ms of CPU per request against
        # aiohttp's ~0.25 ms (bench/transport.py, docs/performance.md).
        # Timeouts by phase: opening a connection (sock_connect) apart from the request itself (total). There is
        # no pool timeout: the pool holds a connection for every slot of both caps, so a request never waits for
        # one, and a timeout never counts time spent queued behind other requests.
        self._timeout = aiohttp.ClientTimeout(total=timeout_s, connect=None, sock_connect=connect_timeout_s)
        self._aux_timeout = aiohttp.ClientTimeout(total=aux_timeout_s, connect=None, sock_connect=connect_timeout_s)
        self._http = aiohttp.ClientSession(
            headers=headers, timeout=self._timeout,  # trust_env off: it reads ~/.netrc on every request
            connector=aiohttp.TCPConnector(limit=concurrency + aux_concurrency, limit_per_host=0,
                                           keepalive_timeout=4.0),  # below uvicorn's 5 s: never reuse a closing one
        )

    def share_budget(self, other: CompletionClient) -> None:
        """Count into `other`'s counters and take `other`'s completion slots: a stage served by another server
        (`--stage NAME.base_url`) stays inside the run's --concurrency and --max-failures."""
        self.counters, self._slots = other.counters, other._slots

    async def aclose(self) -> None:
        tasks = [*self._probes, *self._adapters]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._http.close()

    async def _request(self, method: str, url: str, payload: bytes | None = None,
                       timeout: aiohttp.ClientTimeout | None = None) -> tuple[int, bytes]:
        """One HTTP exchange. A timed-out, cancelled or broken request's connection is closed (never reused),
        so vLLM sees the client go and aborts the request instead of decoding for nobody."""
        timeout = timeout or self._timeout
        try:
            async with self._http.request(method, url, data=payload, timeout=timeout) as response:
                return response.status, await response.read()
        except asyncio.TimeoutError as exc:
            raise TransportFailure(f"timed out after {timeout.total:g}s") from exc
        except aiohttp.ClientError as exc:
            raise TransportFailure(f"{type(exc).__name__}: {exc}".rstrip(": ")) from exc

    async def _aux(self, method: str, url: str, payload: bytes | None = None) -> tuple[int, bytes]:
        async with self._aux_slots:
            return await self._request(method, url, payload, self._aux_timeout)

    async def pick(self, prefer: Endpoint | None = None, avoid: Endpoint | None = None,
                   key: str | None = None, room: bool = True) -> Endpoint:
        """The preferred endpoint while it is up (vLLM's prefix cache then serves the execution's later
        stages); else, with an affinity `key`, the key's endpoint (`affine`); else the least busy endpoint that
        is up; other than `avoid` (the one that just failed) if possible. With every endpoint down, wait for a
        probe to bring one back, up to `down_timeout_s`. `room=False` (renders, probes: they take no completion
        slot) ignores --concurrency auto's limits."""
        deadline: float | None = None
        while True:
            live = [e for e in self.endpoints if not e.down]
            if live:
                live = [e for e in live if e.in_flight < e.limit] if room else live
                if not live:  # --concurrency auto: every live endpoint is at its limit
                    await self._wait_for_room()
                    continue
                if prefer is not None and prefer in live and prefer is not avoid:
                    return prefer
                candidates = [e for e in live if e is not avoid] or live
                if key is not None and len(candidates) > 1:
                    return self.affine(key, candidates)
                return min(candidates, key=lambda e: e.in_flight)
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.down_timeout_s
                log.warning("every endpoint is down; pausing up to %.0fs for one to answer /health",
                            self.down_timeout_s)
            if now >= deadline:
                detail = "; ".join(f"{e.url}: {e.last_error}" for e in self.endpoints)
                raise ServerError(f"every endpoint has been down for {self.down_timeout_s:.0f}s ({detail})")
            self._endpoint_back.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._endpoint_back.wait(), deadline - now)

    async def start_adaptive(self, start: int, fallback: int, maximum: int, interval_s: float = 1.0) -> None:
        """--concurrency auto: each endpoint starts at `start` and follows its /metrics (`adaptive.py`); one
        without readable metrics keeps `fallback`, with a warning."""
        from .adaptive import Controller, parse_metrics

        for endpoint in self.endpoints:
            try:
                status, body = await self._aux("GET", f"{endpoint.url}/metrics")
            except TransportFailure:
                status, body = 0, b""
            if status != 200 or parse_metrics(body.decode("utf-8", "replace")) is None:
                endpoint.limit = min(fallback, maximum)
                log.warning("%s has no readable vLLM /metrics (HTTP %s): its concurrency stays at %d",
                            endpoint.url, status or "none", endpoint.limit)
            else:
                controller = Controller(min(start, maximum), minimum=min(4, maximum), maximum=maximum)
                endpoint.limit = controller.limit
                task = asyncio.create_task(self._adapt(endpoint, controller, interval_s, parse_metrics))
                self._adapters.add(task)
            self.counters.concurrency[endpoint.url] = int(endpoint.limit)

    async def _adapt(self, endpoint: Endpoint, controller: Any, interval_s: float, parse: Any) -> None:
        while True:
            await asyncio.sleep(interval_s)
            if endpoint.down:
                continue
            try:
                status, body = await self._aux("GET", f"{endpoint.url}/metrics")
            except TransportFailure:
                continue
            load = parse(body.decode("utf-8", "replace")) if status == 200 else None
            if load is None:
                continue
            before = endpoint.limit
            endpoint.limit = controller.update(load, endpoint.in_flight)
            self.counters.concurrency[endpoint.url] = int(endpoint.limit)
            for _ in range(max(0, int(endpoint.limit - before))):
                self._wake_one()

    async def _wait_for_room(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._wake_one()  # woken, then cancelled: the slot goes to the next in line
            raise

    def _wake_one(self) -> None:
        while self._waiting:
            waiter = self._waiting.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def affine(self, key: str, candidates: list[Endpoint]) -> Endpoint:
        """Consistent hashing with bounded load: the key's highest-ranked endpoint (rendezvous hashing, so a
        key keeps its endpoint when others come and go), unless it holds more than a fair share (1.25 times the
        average in flight, plus `affinity_slack`: room for one group's first stage); then the next in rank.
        All of a problem's executions share a prompt prefix: on one server, vLLM's prefix cache serves them."""
        ranked = sorted(candidates, reverse=True,
                        key=lambda e: hashlib.blake2b(f"{key}|{e.url}".encode(), digest_size=8).digest())
        bound = 1.25 * (sum(e.in_flight for e in candidates) + 1) / len(candidates) + self.affinity_slack
        return next((e for e in ranked if e.in_flight < bound), min(candidates, key=lambda e: e.in_flight))

    def mark_down(self, endpoint: Endpoint, error: str) -> None:
        """Out of rotation until `GET /health` answers 200 again."""
        if endpoint.down:
            return
        endpoint.down, endpoint.last_error = True, error
        log.warning("endpoint %s out of rotation (%s); probing /health every %.0fs", endpoint.url, error,
                    self.probe_interval_s)
        probe = asyncio.create_task(self._probe(endpoint))
        self._probes.add(probe)
        probe.add_done_callback(self._probes.discard)

    async def _probe(self, endpoint: Endpoint) -> None:
        while True:
            await asyncio.sleep(self.probe_interval_s)
            try:
                status, _ = await self._aux("GET", f"{endpoint.url}/health")
            except TransportFailure:
                continue
            if status == 200:
                endpoint.down, endpoint.consecutive_failures = False, 0
                log.warning("endpoint %s is back", endpoint.url)
                for _ in range(min(len(self._waiting), int(min(endpoint.limit, 1 << 20)))):
                    self._wake_one()
                self._endpoint_back.set()
                return

    async def get_json(self, path: str, endpoint: Endpoint | None = None) -> Any:
        """A plain GET (model list, health) with the server's error message on failure."""
        url = f"{(endpoint or self._first_up()).url}{path}"
        try:
            status, body = await self._aux("GET", url)
        except TransportFailure as exc:
            raise ServerError(f"cannot reach {url}: {exc}") from None
        if status != 200:
            raise ServerError(f"{url} answered {status}: {error_message(body, status)}", status)
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ServerError(f"{url} answered 200 with a body that is not JSON: {body[:120]!r}") from None

    def _first_up(self) -> Endpoint:
        return next((e for e in self.endpoints if not e.down), self.endpoints[0])

    async def post_json(self, path: str, body: dict[str, Any], endpoint: Endpoint | None = None) -> tuple[int, Any]:
        """One POST outside the completion path (the parity probe): (status, parsed JSON or None)."""
        url = f"{(endpoint or self._first_up()).url}{path}"
        try:
            status, raw = await self._aux("POST", url, orjson.dumps(body))
        except TransportFailure as exc:
            raise ServerError(f"cannot reach {url}: {exc}") from None
        try:
            return status, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return status, None

    async def post_with_retries(self, path: str, body: dict[str, Any],
                                absent: frozenset[int] = frozenset()) -> Any:
        """A POST that the run depends on (server-side rendering, the parity probe): retried like a completion,
        on its own cap. Returns the parsed JSON of a 200, or None for a status in `absent` (the server does not
        offer this); raises `CallFailed` when it fails for good."""
        payload = orjson.dumps(body)
        attempt, avoid = 0, None
        while True:
            attempt += 1
            endpoint = await self.pick(avoid=avoid, room=False)
            try:
                status, raw = await self._aux("POST", f"{endpoint.url}{path}", payload)
            except TransportFailure as exc:
                problem = CallFailed(f"{endpoint.url}{path}: {exc}", retryable=True, endpoint=endpoint)
            else:
                if status == 200:
                    try:
                        return orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        problem = CallFailed(f"{endpoint.url}{path} answered 200 with a body that is not JSON",
                                             status, True, endpoint)
                else:
                    if status in absent:
                        return None
                    if status in FATAL_STATUS:
                        raise ServerError(f"{endpoint.url}{path} answered {status}: {error_message(raw, status)}",
                                          status)
                    problem = CallFailed(f"{endpoint.url}{path} answered {status}: {error_message(raw, status)}",
                                         status, status in RETRYABLE_STATUS, endpoint)
            if not problem.retryable or attempt > self.max_retries:
                self.counters.failures += 1
                raise problem
            self.counters.retries += 1
            avoid = problem.endpoint
            await asyncio.sleep(self._backoff(attempt))

    async def detect_api(self, model: str, token_ids: list[int]) -> str:
        """`--api auto`: the native generate endpoint when every answering server offers it (one tiny call
        each), else /v1/completions. vLLM answers 403 without `--enable-scale-out`; older ones and others 404."""
        body = orjson.dumps(request_body("generate", model, token_ids, {"max_tokens": 1, "temperature": 1.0}, 0))
        path = PATHS["generate"]

        async def offers(endpoint: Endpoint) -> bool | None:
            try:
                status, raw = await self._aux("POST", f"{endpoint.url}{path}", body)
            except TransportFailure:
                return None  # down: its calls will tell
            if status == 401:
                raise ServerError(f"{endpoint.url}{path} answered 401: {error_message(raw, status)}", status)
            if status >= 500 and status != 501:
                return None  # failing for now: no verdict from it
            return status == 200

        answers = [a for a in await asyncio.gather(*(offers(e) for e in self.endpoints if not e.down))
                   if a is not None]
        if answers and all(answers):
            return "generate"
        if any(answers):
            log.warning("only some endpoints serve %s (vllm serve --enable-scale-out): using /v1/completions", path)
        return "completions"

    async def complete(self, prompt_ids: list[int], params: dict[str, Any], model: str, alternatives: int = 0,
                       prefer: Endpoint | None = None, key: str | None = None) -> Completion:
        """POST one call on `self.api`, retrying what is transient. Raises `CallFailed` or, for 401/403/404,
        `ServerError`."""
        api = self.api
        payload = orjson.dumps(request_body(api, model, prompt_ids, params, alternatives))
        started = time.monotonic()
        attempt = 0
        avoid: Endpoint | None = None
        while True:
            attempt += 1
            try:
                endpoint, data = await self._post(PATHS[api], payload, prefer, avoid, key)
                try:
                    done = parse(api, data, prompt_ids, alternatives)
                except WireError as exc:  # a malformed answer (a proxy's error page?) may be passing: retried
                    raise CallFailed(f"{endpoint.url}: {exc}", 200, True, endpoint) from None
                if done.finish_reason not in FINISHED:
                    # vLLM aborted it (a pause for a weight sync, a shutdown): what it holds is not what the
                    # model would have said. Asked again; never recorded as an outcome.
                    raise CallFailed(f"{endpoint.url}: the server ended the request with finish_reason "
                                     f"{done.finish_reason!r}", 200, True, endpoint)
            except CallFailed as exc:
                if not exc.retryable or attempt > self.max_retries:
                    self.counters.failures += 1
                    raise
                self.counters.retries += 1
                avoid = exc.endpoint
                await asyncio.sleep(self._backoff(attempt))
                continue
            done.endpoint, done.latency_s, done.attempts = endpoint.url, time.monotonic() - started, attempt
            return done

    def _backoff(self, attempt: int) -> float:
        cap = min(self.backoff_max_s, self.backoff_base_s * 2 ** (attempt - 1))
        return random.uniform(cap / 2, cap)

    async def _post(self, path: str, payload: bytes, prefer: Endpoint | None, avoid: Endpoint | None,
                    key: str | None = None) -> tuple[Endpoint, dict[str, Any]]:
        """One attempt. The endpoint is chosen once a slot is free, so the in-flight counts it compares are
        current, not those of when the call started waiting."""
        counters = self.counters
        async with self._slots:
            endpoint = await self.pick(prefer, avoid, key)
            counters.requests += 1
            counters.in_flight += 1
            endpoint.in_flight += 1
            counters.peak_in_flight = max(counters.peak_in_flight, counters.in_flight)
            try:
                status, body = await self._request("POST", endpoint.url + path, payload)
            except TransportFailure as exc:
                if endpoint.record(ok=False, error=str(exc)):
                    self.mark_down(endpoint, str(exc))
                raise CallFailed(f"{endpoint.url}: {exc}", retryable=True, endpoint=endpoint) from None
            finally:
                counters.in_flight -= 1
                endpoint.in_flight -= 1
                if self.adaptive:
                    self._wake_one()
        if status == 200:
            endpoint.record(ok=True)
            try:
                return endpoint, orjson.loads(body)
            except orjson.JSONDecodeError:
                raise CallFailed(f"{endpoint.url}: response is not JSON", status, True, endpoint) from None
        message = error_message(body, status)
        if status in FATAL_STATUS:
            raise ServerError(f"{endpoint.url} answered {status}: {message}", status)
        retryable = status in RETRYABLE_STATUS
        if endpoint.record(ok=not retryable, error=f"HTTP {status}: {message}"):
            self.mark_down(endpoint, f"HTTP {status}")
        raise CallFailed(f"HTTP {status}: {message}", status, retryable, endpoint)
