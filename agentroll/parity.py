"""Is the local chat template the server's? Compare our token ids with vLLM's `POST /tokenize`.

Token-in, token-out only works if our rendering of a prompt is the one the model was trained on; a tokenizer
whose template differs from the server's silently trains on prompts the server would never build.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .chat import ChatEncoder
from .client import CallFailed, CompletionClient
from .templates import Templates

PROBE_PROBLEM = "What is 17 + 25?"
PROBE_ANSWERS = ["The sum is \\boxed{42}.", "It is \\boxed{\\frac{84}{2}}."]


@dataclass(slots=True)
class Parity:
    checked: int  # prompts compared
    mismatch: str | None  # first difference, or None when every prompt matched
    supported: bool = True  # False: the server has no /tokenize for chat messages


def probe_messages(templates: Templates, problem: str = PROBE_PROBLEM) -> list[list[dict[str, Any]]]:
    return [templates.messages("solver", problem), templates.messages("rewriter", problem, PROBE_ANSWERS),
            templates.messages("selector", problem, PROBE_ANSWERS)]


async def check_parity(client: CompletionClient, encoder: ChatEncoder, model: str,
                       conversations: list[list[dict[str, Any]]]) -> Parity:
    for i, messages in enumerate(conversations):
        _, ours = encoder.encode(messages)
        body = {"model": model, "messages": messages, "add_generation_prompt": True, **(
            {"chat_template_kwargs": encoder.kwargs} if encoder.kwargs else {})}
        status, answer = await client.post_json("/tokenize", body)
        if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("tokens"), list):
            return Parity(i, None, supported=False)
        theirs = answer["tokens"]
        if theirs != ours:
            at = next((j for j, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                      min(len(ours), len(theirs)))
            return Parity(i + 1, f"prompt {i + 1}: {len(ours)} local vs {len(theirs)} server tokens, first "
                                 f"difference at token {at} ({ours[at:at + 3]} vs {theirs[at:at + 3]})")
    return Parity(len(conversations), None)


def server_renderer(client: CompletionClient, model: str,
                    kwargs: dict[str, Any]) -> Callable[[list[dict[str, Any]]], Awaitable[list[int]]]:
    """Prompt ids from the server's own chat template (`POST /tokenize`), retried like a completion on the
    client's auxiliary cap; a render that fails for good raises `CallFailed`, which fails its execution."""

    async def render(messages: list[dict[str, Any]]) -> list[int]:
        body = {"model": model, "messages": messages, "add_generation_prompt": True,
                **({"chat_template_kwargs": kwargs} if kwargs else {})}
        answer = await client.post_with_retries("/tokenize", body)
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, int) for t in tokens):
            raise CallFailed(f"/tokenize answered 200 without token ids: {str(answer)[:200]}", 200)
        return list(tokens)

    return render
