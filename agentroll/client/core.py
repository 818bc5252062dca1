"""Token-in, token-out client for vLLM: `/v1/completions` or the native `/inference/v1/generate` (`wire.py`).

The prompt goes out as token ids; the response's token ids and logprobs are taken from the server's answer as
they are, never re-tokenized. Completion slots are granted best priority first (`slots.py`); transient failures
are retried with jittered exponential backoff, without holding a slot; 401/403/404 end the run. Which endpoints
take calls, and the pause when none does, is `rotation.py`'s.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import re
import time
from collections.abc import Callable
from typing import Any

import orjson

from ..errors import ServerError
from .endpoints import FATAL_STATUS, RETRYABLE_STATUS, Endpoint, normalize_base_url
from .rotation import Rotation
from .settings import ClientSettings
from .slots import FIRST, Budget, ClientCounters, Priority, Queue, Waiter
from .transport import AiohttpTransport, Transport, TransportFailure
from .wire import APIS, PATHS, Completion, WireError, parse, reader, request_body

FINISHED = frozenset({"stop", "length"})  # what a finished generation ends with; "abort" and the rest are retried

log = logging.getLogger("agentroll")


def error_message(body: bytes, status: int) -> str:
    """The server's own message, from either vLLM error shape (`{"error": {...}}` or `{"object": "error", ...}`);
    anything else (a web server's HTML page, a proxy's text) as one short line."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return one_line(body) or f"HTTP {status}"
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
    return f"HTTP {status}: {one_line(body)}"


NOT_VLLM = "is it a vLLM server? --base-url takes the address `vllm serve` listens on (http://HOST:PORT)"
_TAG = re.compile(r"<(script|style)\b.*?</\1\s*>|<[^>]*>", re.S | re.I)
_TITLE = re.compile(r"<title[^>]*>(.*?)</title\s*>", re.S | re.I)


def one_line(body: bytes, most: int = 120) -> str:
    """A body that is no vLLM answer as one line of at most `most` characters: an HTML page by its title and
    text, any other text with its whitespace folded."""
    text = body.decode("utf-8", "replace")
    if text.lstrip()[:1] == "<":
        title = " ".join((m.group(1) if (m := _TITLE.search(text)) else "").split())
        words = " ".join(_TAG.sub(" ", _TITLE.sub(" ", text)).split()).removeprefix(title).strip()
        text = f"an HTML page: {title}{': ' if title and words else ''}{words}"
    text = " ".join(text.split())
    return text if len(text) <= most else text[: most - 1].rstrip() + "…"


class CallFailed(Exception):
    """One call failed for good (after retries, or at once for a non-retryable answer)."""

    def __init__(
        self, message: str, status: int | None = None, retryable: bool = False, endpoint: Endpoint | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = retryable
        self.endpoint = endpoint  # the one that failed: a retry goes elsewhere if it can


class CompletionClient:
    """One set of endpoints. Several clients of one run share a `Budget` (slots and counters)."""

    def __init__(
        self,
        base_urls: list[str],
        settings: ClientSettings | None = None,
        *,
        budget: Budget | None = None,
        transport: Transport | None = None,
        api: str = "completions",
    ) -> None:
        if not base_urls:
            raise ServerError("no server given: pass --base-url or set AGENTROLL_BASE_URL")
        if api not in APIS:
            raise ValueError(f"api must be one of {APIS}, not {api!r}")
        self.settings = s = settings or ClientSettings()
        self.api = api  # "completions" or "generate"; `probes.detect_api` settles --api auto
        self.send_priority = False  # send each call's group number as vLLM's `priority` (`probes.detect_priority`)
        self.endpoints = [Endpoint(normalize_base_url(u), s.health) for u in dict.fromkeys(base_urls)]
        self.by_url = {e.url: e for e in self.endpoints}
        self.budget = budget or Budget(s.concurrency.fixed)
        self.queue = Queue(self._choose)
        self.budget.join(self.queue, self.endpoints)
        connections = s.concurrency.ceiling(len(self.endpoints)) + s.concurrency.aux
        self.transport: Transport = transport or AiohttpTransport(connections, s.timeouts.connect_s, s.api_key)
        # /tokenize, /health, /v1/models have a small cap of their own: a render never waits behind C long
        # generations, and never takes a slot a completion needs
        self._aux_slots = asyncio.Semaphore(s.concurrency.aux)
        self._tasks: set[asyncio.Task[None]] = set()
        self.rotation = Rotation(self.endpoints, s, self._ask, self.spawn, self._rotated)

    @property
    def counters(self) -> ClientCounters:
        return self.budget.counters

    @property
    def adaptive(self) -> bool:
        return self.settings.concurrency.adaptive

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.transport.aclose()

    def spawn(self, coroutine: Any) -> None:
        """A background task of the client's (an endpoint's probe, its metrics), cancelled by `aclose`."""
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def side_request(self, method: str, url: str, payload: bytes | None = None) -> tuple[int, bytes]:
        """A request outside the completion slots (health, metrics, model list, probes), a few at a time."""
        async with self._aux_slots:
            return await self.transport.request(method, url, payload, self.settings.timeouts.aux_s)

    async def _ask(self, method: str, url: str, payload: bytes | None) -> tuple[int, bytes]:
        return await self.side_request(method, url, payload)

    # -- choosing an endpoint -------------------------------------------------------------------------------------
    def _choose(self, waiter: Waiter | None) -> Endpoint | None:
        """An endpoint with room for one more completion: the preferred one while it has room (vLLM's prefix
        cache then serves the execution's later stages); else, with an affinity key, the key's (`affine`); else
        the least busy; other than `avoid` (the one that just failed) if possible. None: no room anywhere."""
        room = [e for e in self.endpoints if e.has_room()]
        if not room:
            return None
        prefer, avoid, key = (waiter.prefer, waiter.avoid, waiter.key) if waiter else (None, None, None)
        if prefer is not None and prefer in room and prefer is not avoid:
            return prefer
        candidates = [e for e in room if e is not avoid] or room
        if key is not None and len(candidates) > 1:
            return self.affine(key, candidates)
        return min(candidates, key=lambda e: e.in_flight)

    def affine(self, key: str, candidates: list[Endpoint]) -> Endpoint:
        """Consistent hashing with bounded load: the key's highest-ranked endpoint (rendezvous hashing, so a
        key keeps its endpoint when others come and go), unless it holds more than a fair share (1.25 times the
        average in flight, plus `affinity_slack`: room for one group's first stage); then the next in rank.
        All of a problem's executions share a prompt prefix: on one server, vLLM's prefix cache serves them."""
        ranked = sorted(
            candidates, reverse=True, key=lambda e: hashlib.blake2b(f"{key}|{e.url}".encode(), digest_size=8).digest()
        )
        bound = 1.25 * (sum(e.in_flight for e in candidates) + 1) / len(candidates) + self.settings.affinity_slack
        return next((e for e in ranked if e.in_flight < bound), min(candidates, key=lambda e: e.in_flight))

    async def _slot(
        self, priority: Priority, prefer: Endpoint | None, avoid: Endpoint | None, key: str | None
    ) -> Endpoint:
        """A completion slot and its endpoint, granted best priority first."""
        if self.rotation.dead is not None:
            raise self.rotation.dead
        budget = self.budget
        budget.started(priority[0])
        waiter = Waiter(asyncio.get_running_loop().create_future(), prefer, avoid, key, priority[0])
        if self.queue.head() is None and not budget.full():
            endpoint = self._choose(waiter)
            if endpoint is not None:
                budget.take(endpoint, waiter.group)
                return endpoint
        budget.enqueue(self.queue, priority, waiter)
        budget.dispatch()
        try:
            return await waiter.future
        except asyncio.CancelledError:
            if waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                budget.release(waiter.future.result(), waiter.group)  # granted, then cancelled: the slot goes on
            raise

    # -- health (rotation.py) ------------------------------------------------------------------------------------
    def mark_down(self, endpoint: Endpoint, error: str) -> None:
        """Out of rotation until `GET /health` answers 200 again (an endpoint that does not answer at start)."""
        self.rotation.mark_down(endpoint, error)

    def _rotated(self) -> None:
        """An endpoint came back (slots to grant), or every one stayed down too long (every waiting call fails)."""
        if self.rotation.dead is not None:
            self.budget.fail_all(self.queue, self.rotation.dead)
        else:
            self.budget.dispatch()

    # -- plain requests -------------------------------------------------------------------------------------------
    async def get_json(self, path: str, endpoint: Endpoint | None = None) -> Any:
        """A plain GET (model list, version) with the server's error message on failure."""
        url = f"{(endpoint or self.first_up()).url}{path}"
        try:
            status, body = await self.side_request("GET", url)
        except TransportFailure as exc:
            raise ServerError(f"cannot reach {url}: {exc}") from None
        if status != 200:
            vllm = body.lstrip()[:1] == b"{"  # vLLM answers every error in JSON
            said = f": {error_message(body, status)}" if vllm else f" ({error_message(body, status)}); {NOT_VLLM}"
            raise ServerError(f"{url} answered {status}{said}", status)
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError:
            raise ServerError(
                f"{url} answered 200 with a body that is not JSON: {one_line(body)} ({NOT_VLLM})"
            ) from None

    def first_up(self) -> Endpoint:
        return next((e for e in self.endpoints if not e.down), self.endpoints[0])

    async def post_json(self, path: str, body: dict[str, Any], endpoint: Endpoint | None = None) -> tuple[int, Any]:
        """One POST outside the completion path (the parity probe): (status, parsed JSON or None)."""
        url = f"{(endpoint or self.first_up()).url}{path}"
        try:
            status, raw = await self.side_request("POST", url, orjson.dumps(body))
        except TransportFailure as exc:
            raise ServerError(f"cannot reach {url}: {exc}") from None
        try:
            return status, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return status, None

    async def post_with_retries(self, path: str, body: dict[str, Any], absent: frozenset[int] = frozenset()) -> Any:
        """A POST that the run depends on (server-side rendering, the parity probe): retried like a completion,
        on its own cap. Returns the parsed JSON of a 200, or None for a status in `absent` (the server does not
        offer this); raises `CallFailed` when it fails for good."""
        payload = orjson.dumps(body)
        attempt, avoid = 0, None
        while True:
            attempt += 1
            endpoint = await self.rotation.live(avoid=avoid)
            try:
                status, raw = await self.side_request("POST", f"{endpoint.url}{path}", payload)
            except TransportFailure as exc:
                problem = CallFailed(f"{endpoint.url}{path}: {exc}", retryable=True, endpoint=endpoint)
            else:
                if status == 200:
                    try:
                        return orjson.loads(raw)
                    except orjson.JSONDecodeError:
                        problem = CallFailed(
                            f"{endpoint.url}{path} answered 200 with a body that is not JSON", status, True, endpoint
                        )
                else:
                    if status in absent:
                        return None
                    if status in FATAL_STATUS:
                        raise ServerError(
                            f"{endpoint.url}{path} answered {status}: {error_message(raw, status)}", status
                        )
                    problem = CallFailed(
                        f"{endpoint.url}{path} answered {status}: {error_message(raw, status)}",
                        status,
                        status in RETRYABLE_STATUS,
                        endpoint,
                    )
            if not problem.retryable or attempt > self.settings.retries.max_retries:
                self.counters.failures += 1
                raise problem
            self.counters.retries += 1
            avoid = problem.endpoint
            await asyncio.sleep(self._backoff(attempt))

    # -- completions ----------------------------------------------------------------------------------------------
    async def complete(
        self,
        prompt_ids: list[int],
        params: dict[str, Any],
        model: str,
        alternatives: int = 0,
        prefer: Endpoint | None = None,
        key: str | None = None,
        priority: Priority = FIRST,
    ) -> Completion:
        """POST one call on `self.api`, retrying what is transient. Raises `CallFailed` or, for 401/403/404,
        `ServerError`. `priority`: (group admission number, stage rank), lower first when slots are scarce."""
        api = self.api
        sent = priority[0] if self.send_priority and priority[0] >= 0 else None
        payload = orjson.dumps(request_body(api, model, prompt_ids, params, alternatives, sent))
        read = lambda data: [parse(api, data, prompt_ids, alternatives)]  # noqa: E731 - one answer, in a list
        loads = reader(api, alternatives)
        return (await self.call(PATHS[api], payload, read, model, prompt_ids, prefer, key, priority, loads))[0]

    async def call(
        self,
        path: str,
        payload: bytes,
        read: Callable[[Any], list[Completion]],
        model: str,
        prompt_ids: list[int],
        prefer: Endpoint | None,
        key: str | None,
        priority: Priority,
        loads: Callable[[bytes], Any] = orjson.loads,
    ) -> list[Completion]:
        """One call's attempts, retried as `complete` says: `loads` decodes the answer, `read` makes it `Completion`s,
        one per sequence sent (a `WireError` is retried; a teacher's scores are read so: `teacher.scorer`)."""
        started = time.monotonic()
        attempt = 0
        avoid: Endpoint | None = None
        while True:
            attempt += 1
            try:
                endpoint, data = await self._post(path, payload, priority, prefer, avoid, key, loads)
                try:
                    answers = read(data)
                except WireError as exc:  # a malformed answer (a proxy's error page?) may be passing: retried
                    raise CallFailed(f"{endpoint.url}: {exc}", 200, True, endpoint) from None
                done = next((a for a in answers if a.finish_reason not in FINISHED), answers[0])
                if done.finish_reason not in FINISHED:
                    # vLLM aborted it (a pause for a weight sync, a shutdown): what it holds is not what the
                    # model would have said. Asked again; never recorded as an outcome.
                    raise CallFailed(
                        f"{endpoint.url}: the server ended the request with finish_reason {done.finish_reason!r}",
                        200,
                        True,
                        endpoint,
                    )
            except CallFailed as exc:
                if exc.retryable and (self.rotation.trial is None or self.rotation.trial[0] != path):
                    self._keep_trial(self.api, model, prompt_ids)
                if not exc.retryable or attempt > self.settings.retries.max_retries:
                    self.counters.failures += 1
                    raise
                self.counters.retries += 1
                log.debug("attempt %d failed (%s): retried", attempt, exc)
                avoid = exc.endpoint
                self.budget.rest(priority[0], True)  # its group wants no room meanwhile: another may start
                try:
                    await asyncio.sleep(self._backoff(attempt))
                finally:
                    self.budget.rest(priority[0], False)
                continue
            for done in answers:
                done.endpoint, done.latency_s, done.attempts = endpoint.url, time.monotonic() - started, attempt
            return answers

    def _keep_trial(self, api: str, model: str, prompt_ids: list[int]) -> None:
        """A one-token call like one that failed: what shows that an endpoint benched for its calls answers."""
        body = request_body(api, model, prompt_ids[:16], {"max_tokens": 1, "temperature": 1.0}, 0)
        self.rotation.trial = (PATHS[api], orjson.dumps(body))

    def _backoff(self, attempt: int) -> float:
        r = self.settings.retries
        cap = min(r.backoff_max_s, r.backoff_base_s * 2 ** (attempt - 1))
        return random.uniform(cap / 2, cap)

    async def _post(
        self,
        path: str,
        payload: bytes,
        priority: Priority,
        prefer: Endpoint | None,
        avoid: Endpoint | None,
        key: str | None,
        loads: Callable[[bytes], Any] = orjson.loads,
    ) -> tuple[Endpoint, dict[str, Any]]:
        """One attempt, in a slot: the endpoint is chosen when the slot is granted, so the in-flight counts it
        compares are current, not those of when the call started waiting."""
        endpoint = await self._slot(priority, prefer, avoid, key)
        group = priority[0]
        self.counters.requests += 1
        try:
            status, body = await self.transport.request(
                "POST", endpoint.url + path, payload, self.settings.timeouts.request_s
            )
        except TransportFailure as exc:
            self.rotation.failed(endpoint, str(exc))
            raise CallFailed(f"{endpoint.url}: {exc}", retryable=True, endpoint=endpoint) from None
        finally:
            self.budget.release(endpoint, group)
        if status == 200:
            endpoint.record(ok=True)
            try:
                return endpoint, loads(body)
            except orjson.JSONDecodeError:
                raise CallFailed(f"{endpoint.url}: response is not JSON", status, True, endpoint) from None
        message = error_message(body, status)
        if status in FATAL_STATUS:
            raise ServerError(f"{endpoint.url} answered {status}: {message}", status)
        retryable = status in RETRYABLE_STATUS
        if retryable:
            self.rotation.failed(endpoint, f"HTTP {status}: {message}")
        else:
            endpoint.record(ok=True)  # the server answered: a bad request is not a sign that it is down
        raise CallFailed(f"HTTP {status}: {message}", status, retryable, endpoint)


__all__ = ["FATAL_STATUS", "RETRYABLE_STATUS", "CallFailed", "CompletionClient", "error_message"]
