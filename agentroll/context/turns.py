"""Token-exact multi-turn: a conversation goes on by token ids, never by rendering it again.

The next prompt is the previous prompt's ids + the response's ids + the tokens the chat template puts between the
model's turn and the next generation prompt. Rendering the whole conversation again would change earlier tokens
on many templates (Qwen3 drops earlier think blocks; a decoded response rarely re-encodes to the same ids), so a
trainer would learn from tokens the model never saw: the retokenization drift of verl #3720 and TRL #5224.

The separator is read off the template itself: a two-turn conversation whose assistant content is a marker is
rendered with the new messages after it, and everything after the marker is what the template adds. The stop
token that ended the response is part of both (it closes the assistant turn in the template, and the model
emitted it), so it is counted once: in the response, where the model sampled it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agentroll.errors import UsageError

MARKER = "AGENTROLLTURNMARKER"  # plain letters: no template trims, escapes or splits it


@dataclass(frozen=True, slots=True)
class Continuation:
    """The next turn's prompt, and over it which tokens the model sampled (mask 1, with their logprobs)."""

    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    injected: list[int]  # the separator and the new messages, as the template renders them


async def separator(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    kwargs: dict[str, Any],
    last_token: int | None,
    server_render: Callable[..., Awaitable[list[int]]] | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The ids the template adds after an assistant turn whose last sampled token is `last_token` (None: the
    response was cut by max_tokens, so the template's end-of-turn is added in full), up to and including the
    generation prompt of the next assistant turn. With `server_render` (the server's template differs from
    ours) they are the server's own ids. `tools`: the template's `tools` argument, as the conversation has it."""
    probe = [{"role": "user", "content": "Q"}, {"role": "assistant", "content": MARKER}, *messages]
    if server_render is not None:
        ids = await (server_render(probe, tools) if tools else server_render(probe))
        return _after_marker_ids(tokenizer, ids, last_token)
    text = tokenizer.apply_chat_template(
        probe, tokenize=False, add_generation_prompt=True, **({"tools": tools} if tools else {}), **kwargs
    )
    at = text.find(MARKER)
    if at < 0 or text.find(MARKER, at + 1) >= 0:
        raise UsageError(VERBATIM)
    after = text[at + len(MARKER) :]
    if last_token is not None:
        closing = tokenizer.decode([last_token], skip_special_tokens=False)
        rest = after.lstrip()  # a template may put a space before its end-of-turn (Llama 2: ' ' + eos)
        if closing and rest.startswith(closing):
            after = rest[len(closing) :]
    return list(tokenizer.encode(after, add_special_tokens=False))


VERBATIM = (
    "the chat template does not render an assistant turn's content verbatim: a conversation cannot be "
    "continued by token ids"
)


def _after_marker_ids(tokenizer: Any, ids: list[int], last_token: int | None) -> list[int]:
    """The ids after the marker in a rendering the server made, without the closing token the model sampled."""
    cut = next(
        (i for i in range(1, len(ids) + 1) if MARKER in tokenizer.decode(ids[:i], skip_special_tokens=False)), None
    )
    if cut is None or not tokenizer.decode(ids[:cut], skip_special_tokens=False).endswith(MARKER):
        raise UsageError(VERBATIM)
    rest = ids[cut:]
    if last_token is not None:
        blank = 0
        while blank < len(rest) and not tokenizer.decode([rest[blank]], skip_special_tokens=False).strip():
            blank += 1
        if blank < len(rest) and rest[blank] == last_token:
            rest = rest[blank + 1 :]
    return list(rest)


def continue_turn(
    prompt_ids: list[int],
    history_mask: list[int] | None,
    history_logprobs: list[float] | None,
    response_ids: list[int],
    response_logprobs: list[float],
    loss_mask: list[int],
    injected: list[int],
) -> Continuation:
    """Append a turn and the injected tokens to a conversation; the masks say which tokens the model sampled."""
    mask = (history_mask if history_mask is not None else [0] * len(prompt_ids)) + loss_mask + [0] * len(injected)
    logprobs = (
        (history_logprobs if history_logprobs is not None else [0.0] * len(prompt_ids))
        + [lp if m else 0.0 for lp, m in zip(response_logprobs, loss_mask, strict=True)]
        + [0.0] * len(injected)
    )
    return Continuation([*prompt_ids, *response_ids, *injected], mask, logprobs, injected)


SAMPLE_TURNS = [
    {"role": "system", "content": "You are a careful mathematician."},
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "<think>\nTwo and two.\n</think>\n\nThe answer is \\boxed{4}."},
    {"role": "user", "content": "Check your answer once more."},
    {"role": "assistant", "content": "<think>\nStill four.\n</think>\n\nIt is \\boxed{4}."},
    {"role": "user", "content": "Thank you."},
]


def prefix_break(
    tokenizer: Any, kwargs: dict[str, Any] | None = None, turns: list[dict[str, Any]] | None = None
) -> str | None:
    """None when rendering turns[:k] is a prefix of rendering turns[:k+1] for every k (the template's prefix
    property), else where and how it breaks."""
    turns = turns or SAMPLE_TURNS
    previous = None
    for k in range(1, len(turns) + 1):
        text = tokenizer.apply_chat_template(turns[:k], tokenize=False, add_generation_prompt=False, **(kwargs or {}))
        if previous is not None and not text.startswith(previous):
            at = next(
                (i for i, (a, b) in enumerate(zip(previous, text, strict=False)) if a != b),
                min(len(previous), len(text)),
            )
            return (
                f"adding turn {k} ({turns[k - 1]['role']}) changes the rendering of the turns before it at "
                f"character {at}: {previous[max(0, at - 20) : at + 30]!r} became {text[max(0, at - 20) : at + 30]!r}"
            )
        previous = text
    return None
