"""The recording proxy: an OpenAI-compatible endpoint on loopback, served by agentroll while a run lasts.

`POST /v1/chat/completions` (whole or streamed), `POST /v1/completions`, `POST /v1/responses` (whole or
streamed: `responses`), `GET /v1/models`. Each execution gets a
credential of its own (the API key its agent is given): a request is tied to its execution by the credential it
carries, never by guessing, and a credential is refused once its execution has ended. A request is checked
(`requests`), made as token-exact calls of its execution (`session`), and answered in OpenAI's format
(`replies`). What cannot be served exactly is a 400 saying why; a call that failed for good a 500 (its execution
is not written). Bodies and errors are OpenAI's (`{"error": {"message", "type", "param", "code"}}`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any

import orjson
from aiohttp import web

from ..context import ExecutionFailed
from ..errors import UsageError, first_line
from .messages import BadRequest
from .replies import chat_body, chat_chunks, text_body, text_chunks
from .requests import chat_request, text_request
from .responses import held_conversation, response_body, response_events, responses_request
from .session import Session

__all__ = ["Proxy"]

log = logging.getLogger("agentroll")
PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models")
MAX_BODY = 256 << 20  # a long agent conversation is many megabytes of JSON


def _error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


class Proxy:
    """One per run, started on first use in the run's event loop. `open(session)` gives a credential. What a
    request is served as (the model's name, its context length, the logprob alternatives) is its session's: in a
    head-to-head run (`--policy`) each execution's agent talks to its own policy's model."""

    def __init__(self) -> None:
        self.sessions: dict[str, Session] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.created = int(time.time())

    @property
    def url(self) -> str:
        """The base URL an OpenAI client takes (`OPENAI_BASE_URL`)."""
        return f"http://127.0.0.1:{self.port}/v1"

    async def start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY, handler_args={"handler_cancellation": True})
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runner, self.port = runner, runner.addresses[0][1]

    async def aclose(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    def open(self, session: Session) -> str:
        credential = f"agentroll-{secrets.token_urlsafe(24)}"
        self.sessions[credential] = session
        return credential

    def close(self, credential: str) -> None:
        self.sessions.pop(credential, None)

    # -- requests -----------------------------------------------------------------------------------------------
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/")
        if path not in PATHS:
            return _error(
                404, f"{request.path} is not served: agentroll's proxy serves {', '.join(PATHS)}", "NotFoundError"
            )
        scheme, _, credential = request.headers.get("Authorization", "").partition(" ")
        session = self.sessions.get(credential) if scheme.lower() == "bearer" else None
        if session is None:
            return _error(
                401,
                "unknown or expired API key: each execution's agent gets its own (OPENAI_API_KEY), valid while "
                "the execution runs",
                "AuthenticationError",
            )
        if path == "/v1/models":
            return self._models(session)
        if request.method != "POST":
            return _error(405, f"{path} takes POST", "MethodNotAllowed")
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            return _error(400, f"the body is not JSON: {exc}", "BadRequestError")
        try:
            if path == "/v1/chat/completions":
                return await self._chat(request, session, body)
            if path == "/v1/responses":
                return await self._responses(request, session, body)
            return await self._text(request, session, body)
        except BadRequest as exc:
            log.warning("the agent's request was refused (400): %s", exc)
            return _error(400, str(exc), "BadRequestError", exc.param)
        except UsageError as exc:  # the chat template rejects the messages: the agent's request, not the run
            return _error(400, str(exc), "BadRequestError", "messages")
        except ExecutionFailed as exc:
            return _error(500, f"the call failed for good, and with it this execution: {exc}", "InternalServerError")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # an error that ends the run (server gone, bad key) or a bug: the system raises it
            session.fail(exc)
            return _error(500, f"agentroll stops: {first_line(exc)}", "InternalServerError")

    def _models(self, session: Session) -> web.Response:
        card = {"id": session.model, "object": "model", "created": self.created, "owned_by": "agentroll"}
        if session.limit is not None:
            card["max_model_len"] = session.limit
        return web.Response(body=orjson.dumps({"object": "list", "data": [card]}), content_type="application/json")

    async def _chat(self, request: web.Request, session: Session, body: Any) -> web.StreamResponse:
        asked = chat_request(body, session.alternatives, session.encoder.kwargs)
        made = await session.chat(asked)
        return await self._answer(request, session, asked, made, chat_chunks, chat_body)

    async def _responses(self, request: web.Request, session: Session, body: Any) -> web.StreamResponse:
        """The Responses API: the request as the chat request it amounts to, answered as a Response."""
        template = str(getattr(session.encoder.tokenizer, "chat_template", None) or "")
        read = "reasoning_effort" in template and "reasoning_effort" not in session.encoder.kwargs
        asked = responses_request(body, session.alternatives, session.encoder.kwargs, session.held, read)
        ((sample, answer),) = await session.chat(asked)
        ident = f"resp_{uuid.uuid4().hex}"
        session.held[ident] = held_conversation(asked, answer, body)
        whole = response_body(ident, sample, answer, session.model, body, session.think)
        if not asked.stream:
            return web.Response(body=orjson.dumps(whole), content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for kind, event in response_events(whole):
            await response.write(f"event: {kind}\ndata: ".encode() + orjson.dumps(event) + b"\n\n")
        await response.write_eof()
        return response

    async def _text(self, request: web.Request, session: Session, body: Any) -> web.StreamResponse:
        asked = text_request(body, session.alternatives, len(session.encoder.tokenizer))
        made = await session.text(asked)
        return await self._answer(request, session, asked, made, text_chunks, text_body)

    async def _answer(
        self, request: web.Request, session: Session, asked: Any, made: Any, chunks: Any, whole: Any
    ) -> web.StreamResponse:
        """The calls made for a request, as a stream of chunks or one body."""
        tokenizer, ids, model = session.encoder.tokenizer, asked.return_token_ids, session.model
        if asked.stream:
            return await _stream(request, chunks(made, model, tokenizer, asked.logprobs, ids, asked.include_usage))
        answer = whole(made, model, tokenizer, asked.logprobs, ids)
        return web.Response(body=orjson.dumps(answer), content_type="application/json")


async def _stream(request: web.Request, chunks: Iterator[dict[str, Any]]) -> web.StreamResponse:
    """Server-sent events, as OpenAI streams them: `data: {chunk}` lines, then `data: [DONE]`."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    for chunk in chunks:
        await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
