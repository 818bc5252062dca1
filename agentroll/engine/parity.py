"""Is the local chat template the server's? Compare our token ids with vLLM's `POST /tokenize`.

Token-in, token-out only works if our rendering of a prompt is the one the model was trained on; a tokenizer
whose template differs from the server's silently trains on prompts the server would never build.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentroll.client import CallFailed, CompletionClient
from agentroll.errors import ServerError, UsageError, first_line
from agentroll.render.chat import ChatEncoder
from agentroll.render.templates import Templates

PROBE_PROBLEM = "What is 17 + 25?"
PROBE_ANSWERS = ["The sum is \\boxed{42}.", "It is \\boxed{\\frac{84}{2}}."]


@dataclass(slots=True)
class Parity:
    checked: int  # prompts compared
    mismatch: str | None  # first difference, or None when every prompt matched
    supported: bool = True  # False: the server has no /tokenize for chat messages


def probe_messages(templates: Templates, problem: str = PROBE_PROBLEM) -> list[list[dict[str, Any]]]:
    """Each of the system's templates, rendered once (the first with no solutions, as a solver sees it); for a
    system that renders none (`--system agent`: its agent writes its own prompts), one user message."""
    found = [templates.messages(name, problem, PROBE_ANSWERS if i else None) for i, name in enumerate(templates.names)]
    return found or [[{"role": "user", "content": problem}]]


# A server that answers these to a chat /tokenize has none (or predates `messages` there): nothing to compare.
NO_CHAT_TOKENIZE = frozenset({400, 404, 405, 422, 501})


async def check_parity(
    client: CompletionClient,
    encoder: ChatEncoder,
    model: str,
    conversations: list[list[dict[str, Any]]],
    fallback: Callable[[], Any] | list[Callable[[], Any]] | None = None,
) -> Parity:
    """Compare our ids with the server's, prompt by prompt (the server is asked for all of them at once). A
    /tokenize that fails for a while (5xx, timeouts) is retried and then ends the run (`ServerError`): taking it
    for "no /tokenize" would switch the check off.

    `fallback` (`AutoTokenizer` of the same name, for a tokenizer that may have been loaded by its config's class
    name; before it, for a `tokenizer_lite.LiteTokenizer`, the class-loaded one) takes the encoder's place when
    the server renders differently or cannot be asked, and is compared in its turn: vLLM loads with
    `AutoTokenizer`, whose model-type tables may pick another class (docs/performance.md, "Tokenizers loaded by
    their class"). One that cannot load is passed over; if none loads, ours stands."""
    answers = await asyncio.gather(
        *(_server_ids(client, encoder, model, m) for m in conversations), return_exceptions=True
    )
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    served: list[list[int] | None] = answers  # type: ignore[assignment]
    turns = [] if fallback is None else fallback if isinstance(fallback, list) else [fallback]
    if not turns:
        return _compare(encoder, conversations, served)
    rejected: UsageError | None = None
    try:
        parity = _compare(encoder, conversations, served)
    except UsageError as exc:  # the template rejects the prompts: the fallback's verdict is the one to report
        parity, rejected = Parity(0, str(exc)), exc
    for turn in turns:
        if not (parity.mismatch or not parity.supported):
            break
        try:
            replacement = await asyncio.to_thread(turn)
        except (UsageError, ImportError):  # AutoTokenizer cannot load here (a broken torch, say): ours stands
            continue
        encoder.tokenizer, rejected = replacement, None
        try:
            parity = _compare(encoder, conversations, served)
        except UsageError as exc:
            parity, rejected = Parity(0, str(exc)), exc
    if rejected is not None:
        raise rejected from None
    return parity


async def _server_ids(
    client: CompletionClient, encoder: ChatEncoder, model: str, messages: list[dict[str, Any]]
) -> list[int] | None:
    body = {
        "model": model,
        "messages": messages,
        "add_generation_prompt": True,
        **({"chat_template_kwargs": encoder.kwargs} if encoder.kwargs else {}),
    }
    try:
        answer = await client.post_with_retries("/tokenize", body, absent=NO_CHAT_TOKENIZE)
    except CallFailed as exc:
        raise ServerError(f"the chat-template check could not ask the server: {exc}", exc.status) from exc
    if answer is None:
        return None
    if not isinstance(answer, dict) or not isinstance(answer.get("tokens"), list):
        raise ServerError(f"/tokenize answered 200 without token ids: {str(answer)[:200]}")
    return list(answer["tokens"])


def _compare(
    encoder: ChatEncoder, conversations: list[list[dict[str, Any]]], answers: list[list[int] | None]
) -> Parity:
    for i, (messages, theirs) in enumerate(zip(conversations, answers, strict=True)):
        if theirs is None:
            return Parity(i, None, supported=False)
        ours = local_ids(encoder, messages)
        if theirs != ours:
            at = next(
                (j for j, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), min(len(ours), len(theirs))
            )
            return Parity(
                i + 1,
                f"prompt {i + 1}: {len(ours)} local vs {len(theirs)} server tokens, first "
                f"difference at token {at} ({ours[at : at + 3]} vs {theirs[at : at + 3]})",
            )
    return Parity(len(conversations), None)


def local_ids(encoder: ChatEncoder, messages: list[dict[str, Any]]) -> list[int]:
    """A stage prompt rendered here; a template that rejects it is one usage line."""
    try:
        return encoder.encode(messages)[1]
    except Exception as exc:  # jinja2 or the tokenizer: the bundled stage prompts cannot be rendered at all
        raise UsageError(
            f"the chat template rejects the stage prompts: {first_line(exc)} (see --prompts, --tokenizer, "
            "--chat-template-kwargs)"
        ) from exc


def server_renderer(
    client: CompletionClient, model: str, kwargs: dict[str, Any]
) -> Callable[..., Awaitable[list[int]]]:
    """Prompt ids from the server's own chat template (`POST /tokenize`), retried like a completion on the
    client's auxiliary cap; a render that fails for good raises `CallFailed`, which fails its execution."""

    async def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        body = {
            "model": model,
            "messages": messages,
            "add_generation_prompt": True,
            **({"chat_template_kwargs": kwargs} if kwargs else {}),
            **({"tools": tools} if tools else {}),
        }
        answer = await client.post_with_retries("/tokenize", body)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
            raise CallFailed(f"/tokenize answered 200 without token ids: {str(answer)[:200]}", 200)
        return list(tokens)

    return render
