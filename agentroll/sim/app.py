"""The HTTP face of the simulator: vLLM's routes, status codes, headers and error bodies on aiohttp's server.

Routing is done here rather than by aiohttp's router so that unknown paths and wrong methods get FastAPI's
answers (`{"detail": "Not Found"}`, 405 with `allow`), and the `--api-key` check runs before routing, as
vLLM's middleware does. A client that disconnects cancels its handler (aiohttp's `handler_cancellation`): the
request is aborted, as vLLM aborts it, and counted in `SimServer.aborted`.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import orjson
from aiohttp import web

from . import metrics
from .chat import chat_request, chat_response
from .validation import parse_body
from .wire import (
    AUTH_GUARDED,
    MALFORMED_HTML,
    MALFORMED_KINDS,
    SCALE_OUT_DISABLED,
    VLLM_VERSION,
    HTTPFailure,
    bad_request,
    error_body,
)

if TYPE_CHECKING:
    import random

    from .engine import Engine
    from .faults import Faults
    from .metrics import Counters
    from .scheduler import Scheduler


class Served(Protocol):
    """What the routes use of the server they answer for (`SimServer` is one): its settings, its parts, its
    counters. Declared here, below the server, so the routes never import the server that mounts them."""

    model: str
    api_key: str | None
    enable_scale_out: bool
    scheduling_policy: str
    faults: Faults
    engine: Engine
    scheduler: Scheduler
    counters: Counters
    rng: random.Random
    malformed_sent: int
    first_request_at: float | None

    def arrived(self) -> None: ...

    def departed(self) -> None: ...

    def client_left(self) -> None: ...

    def draw_fault(self) -> str | None: ...

    def finished(self, request: dict[str, Any], response: dict[str, Any]) -> None: ...


Handler = Callable[["Served", web.BaseRequest], Awaitable[web.StreamResponse]]
HEADERS = {"server": "uvicorn", "vary": "Origin"}
UNSUPPORTED_MEDIA = "1 validation error:\n  Unsupported Media Type: Only 'application/json' is allowed"


def json_response(status: int, body: Any, **headers: str) -> web.Response:
    return web.Response(
        status=status, body=orjson.dumps(body), content_type="application/json", headers={**HEADERS, **headers}
    )


async def json_body(request: web.BaseRequest) -> Any:
    """The body as FastAPI reads it for a pydantic model: JSON content type only, then JSON."""
    if request.content_type != "application/json":
        raise HTTPFailure(400, error_body(UNSUPPORTED_MEDIA, "Bad Request", 400))
    return parse_body(await request.read())


async def health(server: Served, request: web.BaseRequest) -> web.StreamResponse:
    return web.Response(status=200, headers=HEADERS)


async def version(server: Served, request: web.BaseRequest) -> web.StreamResponse:
    return json_response(200, {"version": VLLM_VERSION})


async def models(server: Served, request: web.BaseRequest) -> web.StreamResponse:
    return json_response(200, server.engine.models())


async def prometheus(server: Served, request: web.BaseRequest) -> web.StreamResponse:
    scheduler = server.scheduler
    body = metrics.render(
        server.model, scheduler.running, scheduler.waiting, scheduler.kv_usage, server.counters, server.first_request_at
    )
    return web.Response(status=200, body=body, headers={**HEADERS, "content-type": metrics.CONTENT_TYPE})


async def tokenize(server: Served, request: web.BaseRequest) -> web.StreamResponse:
    answer = server.engine.tokenize(await json_body(request))
    if server.faults.tokenize_latency_s:
        await asyncio.sleep(server.faults.tokenize_latency_s)
    if server.faults.tokenize_error_rate and server.rng.random() < server.faults.tokenize_error_rate:
        raise engine_failure(server)
    return json_response(200, answer)


async def detokenize(server: Served, request: web.BaseRequest) -> web.StreamResponse:
    return json_response(200, server.engine.detokenize(await json_body(request)))


async def generate(server: Served, request: web.BaseRequest) -> web.StreamResponse:
    """Token-in/token-out generation exists only with `vllm serve --enable-scale-out` (`enable_scale_out`)."""
    if not server.enable_scale_out:
        raise HTTPFailure(403, error_body(SCALE_OUT_DISABLED, "PermissionDeniedError", 403))
    return await _run(server, request, generated)


def check_priority(server: Served, body: dict[str, Any]) -> None:
    """A non-zero `priority` needs `--scheduling-policy priority` (vLLM's documented contract: "Any priority other
    than 0 will raise an error if the served model does not use priority scheduling")."""
    priority = body.get("priority") or 0
    if priority and server.scheduling_policy != "priority":
        raise bad_request(f"Got priority {priority} but Priority scheduling is not enabled.")


def generated(server: Served, data: Any, abort: bool | None) -> tuple[dict[str, Any], dict[str, Any] | None, int]:
    body = server.engine.parse_generate(data)
    check_priority(server, body)
    response = None if abort is None else server.engine.generate(body, abort=abort)
    tokens = len(body["token_ids"]) + (response["usage"]["completion_tokens"] if response else 0)
    return body, response, tokens


def engine_failure(server: Served, legacy: bool = False) -> HTTPFailure:
    status = 500 if server.rng.random() < 0.5 else 503
    kind = "InternalServerError" if status == 500 else "ServiceUnavailableError"
    return HTTPFailure(status, error_body("simulated engine failure", kind, status, legacy=legacy))


async def completions(server: Served, request: web.BaseRequest) -> web.StreamResponse:
    return await _run(server, request, completed)


def completed(server: Served, data: Any, abort: bool | None) -> tuple[dict[str, Any], dict[str, Any] | None, int]:
    body, ids_batch = server.engine.prompts(data)
    check_priority(server, body)
    response = None if abort is None else server.engine.complete(body, ids_batch, abort=abort)
    tokens = sum(len(p) for p in ids_batch) * (body.get("n") or 1)
    return body, response, tokens + (response["usage"]["completion_tokens"] if response else 0)


async def chat_completions(server: Served, request: web.BaseRequest) -> web.StreamResponse:
    return await _run(server, request, chatted)


def chatted(server: Served, data: Any, abort: bool | None) -> tuple[dict[str, Any], dict[str, Any] | None, int]:
    body, ids = chat_request(server.engine, data)
    check_priority(server, body)
    response = None if abort is None else chat_response(server.engine.complete(body, [ids], abort=abort))
    return body, response, len(ids) + (response["usage"]["completion_tokens"] if response else 0)


Answer = Callable[["Served", Any, "bool | None"], tuple[dict[str, Any], "dict[str, Any] | None", int]]


async def _run(server: Served, request: web.BaseRequest, answer: Answer) -> web.StreamResponse:
    """Validate at once (vLLM's API layer answers 400s before scheduling), then queue for a running slot, run
    for `latency_s`, and answer; faults are drawn once per request. `answer(server, body, abort)` validates and
    (unless abort is None: a request that gets no answer) builds the 200 body."""
    server.arrived()
    try:
        data = await json_body(request)
        fault = server.draw_fault()
        try:
            body, response, tokens = answer(server, data, None if fault in ("drop", "error") else fault == "abort")
        except HTTPFailure:
            raise
        except Exception as exc:  # a broken script is the engine failing: vLLM answers 500
            raise HTTPFailure(500, error_body(f"{type(exc).__name__}: {exc}", "InternalServerError", 500)) from exc
        async with server.scheduler.slot(tokens, body.get("priority") or 0):
            generated = response["usage"]["completion_tokens"] if response is not None else 0
            running = server.faults.latency_s + server.faults.decode_latency_s * generated
            if running:
                await asyncio.sleep(running)
        if fault == "drop":
            request.protocol.force_close()  # the connection goes away with no answer
            return web.Response(status=200, headers=HEADERS)
        if fault == "error":
            raise engine_failure(server, legacy=server.rng.random() < 0.5)
        assert response is not None
        if fault == "malformed":
            return malformed(server, response)
        server.finished(body, response)
        return json_response(200, response)
    except asyncio.CancelledError:
        server.client_left()
        raise
    finally:
        server.departed()


def malformed(server: Served, response: dict[str, Any]) -> web.StreamResponse:
    """A 200 that is no completion, as a proxy, a captive portal or a broken build sends: cycles three kinds."""
    kind = MALFORMED_KINDS[server.malformed_sent % len(MALFORMED_KINDS)]
    server.malformed_sent += 1
    if kind == "html":
        return web.Response(
            status=200, body=MALFORMED_HTML, headers={**HEADERS, "content-type": "text/html; charset=utf-8"}
        )
    if kind == "list":
        return json_response(200, [])
    return json_response(200, {k: v for k, v in response.items() if k != "choices"})


ROUTES: dict[str, dict[str, Handler]] = {
    "/health": {"GET": health},
    "/version": {"GET": version},
    "/v1/models": {"GET": models},
    "/metrics": {"GET": prometheus},
    "/tokenize": {"POST": tokenize},
    "/detokenize": {"POST": detokenize},
    "/v1/completions": {"POST": completions},
    "/v1/chat/completions": {"POST": chat_completions},
    "/inference/v1/generate": {"POST": generate},
}


def authorized(header: str | None, key: str) -> bool:
    scheme, _, token = (header or "").partition(" ")
    digest = hashlib.sha256(token.encode()).digest()
    return scheme.lower() == "bearer" and hmac.compare_digest(digest, hashlib.sha256(key.encode()).digest())


def handler(server: Served) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if (
            server.api_key
            and request.method != "OPTIONS"
            and path.startswith(AUTH_GUARDED)
            and not authorized(request.headers.get("Authorization"), server.api_key)
        ):
            return json_response(401, {"error": "Unauthorized"})  # vLLM's --api-key middleware, verbatim
        methods = ROUTES.get(path)
        if methods is None:
            return json_response(404, {"detail": "Not Found"})
        endpoint = methods.get(request.method)
        if endpoint is None:
            return json_response(405, {"detail": "Method Not Allowed"}, allow=", ".join(methods))
        try:
            return await endpoint(server, request)
        except HTTPFailure as failure:
            return json_response(failure.status, failure.body)

    return handle
