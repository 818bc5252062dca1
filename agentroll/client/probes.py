"""Tiny calls that settle what a server takes before the run relies on it: the native token API, a request
priority. Each asks every answering endpoint (or the first up) once, outside the completion slots."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

import orjson

from ..errors import ServerError
from .core import error_message
from .transport import TransportFailure
from .wire import PATHS, request_body

if TYPE_CHECKING:
    from .core import CompletionClient
    from .endpoints import Endpoint

log = logging.getLogger("agentroll")

# Every probe samples with top_k > 0 and temperature > 0: vLLM returning sampling masks (--return-sampling-mask)
# refuses any other call, and a probe reads no further than the top few tokens.
PROBE_TOP_K = 20


async def detect_api(client: CompletionClient, model: str, token_ids: list[int]) -> str:
    """`--api auto`: the native generate endpoint when every answering server offers it (one tiny call
    each), else /v1/completions. vLLM answers 403 without `--enable-scale-out`; older ones and others 404."""
    params = {"max_tokens": 1, "temperature": 1.0, "top_k": PROBE_TOP_K}
    body = orjson.dumps(request_body("generate", model, token_ids, params, 0))
    path = PATHS["generate"]

    async def offers(endpoint: Endpoint) -> bool | None:
        try:
            status, raw = await client.side_request("POST", f"{endpoint.url}{path}", body)
        except TransportFailure:
            return None  # down: its calls will tell
        if status == 401:
            raise ServerError(f"{endpoint.url}{path} answered 401: {error_message(raw, status)}", status)
        if status >= 500 and status != 501:
            return None  # failing for now: no verdict from it
        return status == 200

    answers = [a for a in await asyncio.gather(*(offers(e) for e in client.endpoints if not e.down)) if a is not None]
    if answers and all(answers):
        return "generate"
    if any(answers):
        log.warning("only some endpoints serve %s (vllm serve --enable-scale-out): using /v1/completions", path)
    return "completions"


async def detect_priority(client: CompletionClient, model: str, token_ids: list[int]) -> bool:
    """Does every server take a request `priority`? One one-token call with priority 1 each: vLLM without
    `--scheduling-policy priority` may refuse it (400, "Priority scheduling is not enabled"); vLLM 0.32 takes it
    under either policy (under fcfs it orders nothing). One body goes to every endpoint, so it is sent only when
    all of them take it (one down now gives no yes): one that refused would fail every call sent to it."""
    body = orjson.dumps(
        request_body(client.api, model, token_ids, {"max_tokens": 1, "temperature": 1.0, "top_k": PROBE_TOP_K}, 0, 1)
    )

    async def takes(endpoint: Endpoint) -> bool | None:
        try:
            status, raw = await client.side_request("POST", f"{endpoint.url}{PATHS[client.api]}", body)
        except TransportFailure:
            return None  # down: no verdict from it
        if status == 400 and "priority" in error_message(raw, status).lower():
            log.info(
                "%s does not take a request priority (vllm serve --scheduling-policy priority): groups are "
                "ordered by agentroll's own slots only",
                endpoint.url,
                extra={"detail": True},  # needs no action: said with --verbose (agentroll.cli.console.DETAIL)
            )
        return status == 200

    answers = await asyncio.gather(*(takes(e) for e in client.endpoints if not e.down))
    return len(answers) == len(client.endpoints) and all(a is True for a in answers)
