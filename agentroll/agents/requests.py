"""What an agent's request asks, read and checked: honoured exactly, left to the run, or refused (HTTP 400).

Honoured: the messages or prompt, `tools`, `tool_choice` `auto` and `none`, `n`, `stream` (and its
`include_usage`), `max_tokens` / `max_completion_tokens`, `temperature`, `top_p`, `top_k`, `min_p`, `stop` (sent
to vLLM, which ends the response at the token completing one), `logprobs` and `top_logprobs` (within the run's
`--logprobs K`), vLLM's `return_token_ids`, and `chat_template_kwargs` equal to the run's. The run's own:
`model` (any name is the run's model), the seed under `--seed`, the request priority. Fields that change nothing
sampled (`user`, `metadata`, `store`, ...) are read and left. Anything else that would change what is sampled or how
it is rendered (stop token ids, penalties, `logit_bias`, a response format, `tool_choice` `required` or a named
tool, a seed, an unknown field) is refused with a `BadRequest` naming it: a request is never served otherwise than
it asked.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..settings.sampling import RULES
from .messages import BadRequest, tools_of

__all__ = ["ChatRequest", "TextRequest", "chat_request", "text_request"]

SAMPLED = ("temperature", "top_p", "top_k", "min_p")
INT32 = 2**31 - 1  # the largest whole number a request's field may carry (ids, counts, sizes)
MOST_CHOICES = 128  # OpenAI's own limit on `n`
MOST_STOPS, LONGEST_STOP = 64, 4096  # stop strings per request, characters per stop string
# read and left: they change nothing the model samples
IGNORED = frozenset(
    {
        "model",
        "user",
        "metadata",
        "store",
        "service_tier",
        "prompt_cache_key",
        "safety_identifier",
        "request_id",
        "cache_salt",
        "priority",
        "stream_options",
        "spaces_between_special_tokens",
    }
)
# a value that changes nothing, for fields otherwise refused
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logit_bias": ({},),
    "stop_token_ids": ([],),
    "best_of": (1,),
    "use_beam_search": (False,),
    "min_tokens": (0,),
    "ignore_eos": (False,),
    "include_stop_str_in_output": (False,),
    "add_generation_prompt": (True,),
    "continue_final_message": (False,),
    "modalities": (["text"],),
    "response_format": ({"type": "text"},),
    "parallel_tool_calls": (True,),
    "skip_special_tokens": (True,),
    "echo": (False,),
}
WHY = {
    "seed": "the run gives each call its own seed (--seed), so the K executions of a problem differ",
    "stop_token_ids": "stop token ids are not served (stop strings are: `stop`)",
    "include_stop_str_in_output": "the text is cut before the stop string, as OpenAI's API cuts it",
    "response_format": "a response format needs constrained decoding, which the run does not apply",
    "logit_bias": "the run samples from the model's own distribution",
    "parallel_tool_calls": "the run cannot hold the model to one tool call per turn",
    "continue_final_message": "a prompt always ends with the template's generation prompt",
    "add_generation_prompt": "a prompt always ends with the template's generation prompt",
    "echo": "the prompt is not echoed",
}


@dataclass(frozen=True, slots=True)
class Common:
    """What chat and completion requests share."""

    n: int = 1
    stream: bool = False
    include_usage: bool = False
    overrides: dict[str, Any] = field(default_factory=dict)  # ctx.complete()'s: max_tokens and sampling
    logprobs: int | None = None  # None: no logprobs; else the alternatives per token (0: the sampled token's only)
    return_token_ids: bool = False
    stop: list[str] | None = None  # stop strings, sent to vLLM as they are


@dataclass(frozen=True, slots=True)
class ChatRequest(Common):
    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] | None = None  # as the template gets them
    tool_choice: str = "auto"  # or "none": the tools are shown, calls are not read (as vLLM does)


@dataclass(frozen=True, slots=True)
class TextRequest(Common):
    prompt: str | list[int] = ""


def _refuse(body: dict[str, Any], known: frozenset[str]) -> None:
    for key, value in body.items():
        if value is None or key in known or key in IGNORED:
            continue
        if key in NEUTRAL and any(value == v and type(value) is type(v) for v in NEUTRAL[key]):
            continue
        reason = WHY.get(key)
        if reason is None:
            reason = (
                "it would change what is sampled"
                if key in NEUTRAL
                else "agentroll cannot honour it exactly (its proxy serves the fields docs/agents.md lists)"
            )
        raise BadRequest(f"`{key}` is not served: {reason}", key)


def _int(body: dict[str, Any], key: str, low: int, default: int | None = None, high: int = INT32) -> int | None:
    """A whole-number field within [low, high]: what vLLM and the tokenizer take (32-bit), never past it."""
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise BadRequest(f"`{key}` must be a whole number from {low} to {high}, got {_short(value)}", key)
    return value


def _short(value: Any) -> str:
    """A value as an error message quotes it: at most 80 characters."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _stop(value: Any) -> list[str] | None:
    """`stop`: a string or a list of them, none empty (vLLM refuses one: it would match everywhere)."""
    if value is None or value == []:
        return None
    stops = [value] if isinstance(value, str) else value
    if (
        not isinstance(stops, list)
        or not 0 < len(stops) <= MOST_STOPS
        or not all(isinstance(s, str) and 0 < len(s) <= LONGEST_STOP for s in stops)
    ):
        raise BadRequest(
            f"`stop` must be a string or a list of at most {MOST_STOPS} strings, each of 1 to {LONGEST_STOP} "
            f"characters, got {_short(value)}",
            "stop",
        )
    return list(stops)


def _common(body: dict[str, Any], alternatives: int, chat: bool) -> dict[str, Any]:
    overrides = {k: body[k] for k in SAMPLED if body.get(k) is not None}
    most = _int(body, "max_completion_tokens", 1) if chat else None
    most = most if most is not None else _int(body, "max_tokens", 1)
    if most is not None:
        overrides["max_tokens"] = most
    for key, value in overrides.items():
        check, what = RULES[key]
        if not check(value):
            raise BadRequest(f"`{key}` must be {what}, got {_short(value)}", key)
        if isinstance(value, int) and abs(value) > INT32:
            raise BadRequest(f"`{key}` must be within 32 bits, got {_short(value)}", key)
    if chat:
        wanted = body.get("logprobs")
        if wanted is not None and not isinstance(wanted, bool):
            raise BadRequest("`logprobs` must be true or false", "logprobs")
        top = _int(body, "top_logprobs", 0, 0)
        logprobs = top if wanted else None
        if top and not wanted:
            raise BadRequest("`top_logprobs` needs `logprobs: true`", "top_logprobs")
    else:
        logprobs = _int(body, "logprobs", 0)
    if logprobs and logprobs > alternatives:
        raise BadRequest(
            f"{logprobs} alternatives per token asked, the run keeps {alternatives} (generate --logprobs K)",
            "top_logprobs" if chat else "logprobs",
        )
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise BadRequest("`stream_options` must be an object", "stream_options")
    stream = body.get("stream") is True
    return {
        "stop": _stop(body.get("stop")),
        "n": _int(body, "n", 1, 1, MOST_CHOICES),
        "stream": stream,
        "include_usage": stream and bool((options or {}).get("include_usage")),
        "overrides": overrides,
        "logprobs": logprobs,
        "return_token_ids": body.get("return_token_ids") is True,
    }


CHAT_FIELDS = frozenset(
    {
        "messages",
        "tools",
        "tool_choice",
        "n",
        "stream",
        "max_tokens",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "return_token_ids",
        "chat_template_kwargs",
        "stop",
        *SAMPLED,
    }
)
TEXT_FIELDS = frozenset({"prompt", "n", "stream", "max_tokens", "logprobs", "return_token_ids", "stop", *SAMPLED})


def chat_request(body: Any, alternatives: int, template_kwargs: dict[str, Any]) -> ChatRequest:
    """A `/v1/chat/completions` body, checked (`BadRequest` for what cannot be served exactly)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    _refuse(body, CHAT_FIELDS)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("`messages` must be a non-empty list", "messages")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None and kwargs != template_kwargs:
        raise BadRequest(
            f"`chat_template_kwargs` {kwargs!r} differ from the run's ({template_kwargs!r}): set them with "
            "generate --chat-template-kwargs",
            "chat_template_kwargs",
        )
    choice = body.get("tool_choice")
    if choice is not None and choice not in ("auto", "none"):
        raise BadRequest(
            "`tool_choice` other than auto or none is not served: it needs constrained decoding", "tool_choice"
        )
    return ChatRequest(
        **_common(body, alternatives, chat=True),
        messages=messages,
        tools=tools_of(body.get("tools")),
        tool_choice=choice or "auto",
    )


def text_request(body: Any, alternatives: int, vocab: int) -> TextRequest:
    """A `/v1/completions` body, checked: one prompt, as text or token ids, each id within the tokenizer's `vocab`
    (as vLLM refuses one past it, before anything decodes it)."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    _refuse(body, TEXT_FIELDS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise BadRequest("`prompt` must be one text or one list of token ids (one prompt per request)", "prompt")
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        if bad is not None:
            raise BadRequest(f"Token id {_short(bad)} is out of vocabulary (ids 0 to {vocab - 1})", "prompt")
    elif not isinstance(prompt, str) or not prompt:
        raise BadRequest("`prompt` must be a non-empty text or a list of token ids", "prompt")
    return TextRequest(**_common(body, alternatives, chat=False), prompt=prompt)
