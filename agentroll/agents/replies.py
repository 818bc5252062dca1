"""A recorded call as the agent is answered: OpenAI's chat and completion formats, whole or streamed.

An answer is read from the response text the record holds (vLLM's detokenization of the sampled ids): with
thinking (the run's default), the text before its one `</think>` is the `reasoning` (also sent as
`reasoning_content`, the name many clients read) and the rest the `content`; a response without a closed think
block is all content. When the request offered tools (and `tool_choice` is not `none`), the calls the run's tool
parser finds in the content become `tool_calls` (`finish_reason: tool_calls`), the text before them the content;
a call that cannot be read leaves the whole content as text, as vLLM's parsers do, and a response cut at
`max_tokens` is never read for calls. A call's id is the one the model wrote, else one derived from the call's
request (the same on a replay), so the agent's next request names it the same way.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..record.schema import Sample
from ..toolcalls import ParsedCall, Parser, call_id

__all__ = ["Answer", "answer_of", "chat_body", "chat_chunks", "text_body", "text_chunks"]

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
MARKERS = ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>")


@dataclass(frozen=True, slots=True)
class Answer:
    """One choice as the agent sees it, and the calls its record keeps."""

    content: str | None
    reasoning: str | None
    tool_calls: list[dict[str, Any]]  # OpenAI's form
    finish_reason: str
    recorded: list[dict[str, Any]] | None  # the record's `tool_calls`

    def message(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            out["reasoning"] = out["reasoning_content"] = self.reasoning
        if self.tool_calls:
            out["tool_calls"] = self.tool_calls
        return out


def _split(response: str, think: bool) -> tuple[str | None, str]:
    if think and response.count(THINK_CLOSE) == 1:
        reasoning, _, content = response.partition(THINK_CLOSE)
        reasoning = reasoning.strip()
        return reasoning.removeprefix(THINK_OPEN).strip() or None, content.lstrip()
    return None, response


def _before_calls(text: str, calls: list[ParsedCall]) -> str | None:
    at = min((text.find(m) for m in MARKERS if m in text), default=-1)
    if at < 0:
        at = max(text.find(calls[0].raw), 0)
    return text[:at].strip() or None


def answer_of(
    sample: Sample,
    *,
    think: bool,
    parse: Parser,
    tools: list[dict[str, Any]] | None,
    tool_choice: str,
    where: tuple[Any, ...],
) -> Answer:
    """The agent's view of `sample` (see the module's docstring); `where` derives the ids of calls without one."""
    reasoning, content = _split(sample.response, think)
    finish = "length" if sample.finish_reason == "length" else "stop"
    if not tools or tool_choice == "none" or finish == "length":
        return Answer(content or None, reasoning, [], finish, None)
    calls = parse(content)
    if not calls:
        return Answer(content or None, reasoning, [], finish, None)
    offered = {t["function"]["name"] for t in tools}
    readable = all(c.error is None for c in calls)
    recorded, handed = [], []
    for j, call in enumerate(calls):
        ident = call.id or call_id(*where, j)
        status = "malformed" if call.error else "ok" if call.name in offered else "unknown"
        recorded.append(
            {
                "id": ident,
                "name": call.name,
                "arguments": call.arguments,
                "result": None,
                "duration_s": None,
                "error": call.error if call.error else None if status == "ok" else "not among the request's tools",
                "status": status,
            }
        )
        if readable:
            arguments = json.dumps(call.arguments, ensure_ascii=False)
            handed.append({"id": ident, "type": "function", "function": {"name": call.name, "arguments": arguments}})
    if not readable:
        return Answer(content or None, reasoning, [], finish, recorded)
    return Answer(_before_calls(content, calls), reasoning, handed, "tool_calls", recorded)


# -- bodies ---------------------------------------------------------------------------------------------------------
def _usage(samples: list[Sample]) -> dict[str, int]:
    prompt = len(samples[0].prompt_token_ids)
    completion = sum(len(s.response_token_ids) for s in samples)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _piece(tokenizer: Any, token: int) -> str:
    return str(tokenizer.decode([token], skip_special_tokens=False))


def _chat_logprobs(sample: Sample, tokenizer: Any, top: int) -> dict[str, Any]:
    def entry(token: int, logprob: float) -> dict[str, Any]:
        piece = _piece(tokenizer, token)
        return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}

    content = []
    for i, (token, logprob) in enumerate(zip(sample.response_token_ids, sample.response_logprobs, strict=True)):
        alternatives = []
        if top and sample.top_token_ids is not None and sample.top_logprobs is not None:
            pairs = zip(sample.top_token_ids[i][:top], sample.top_logprobs[i][:top], strict=True)
            alternatives = [entry(t, lp) for t, lp in pairs]
        content.append({**entry(token, logprob), "top_logprobs": alternatives})
    return {"content": content}


def _ids(sample: Sample, wanted: bool) -> dict[str, Any]:
    return {"token_ids": sample.response_token_ids} if wanted else {}


def chat_body(
    pairs: list[tuple[Sample, Answer]], model: str, tokenizer: Any, logprobs: int | None, ids: bool
) -> dict[str, Any]:
    """A whole chat completion: one choice per sample."""
    samples = [s for s, _ in pairs]
    choices = [
        {
            "index": i,
            "message": answer.message(),
            "logprobs": None if logprobs is None else _chat_logprobs(sample, tokenizer, logprobs),
            "finish_reason": answer.finish_reason,
            "stop_reason": sample.stop_reason,
            **_ids(sample, ids),
        }
        for i, (sample, answer) in enumerate(pairs)
    ]
    body = _head("chat.completion", "chatcmpl", model)
    body.update(choices=choices, usage=_usage(samples))
    if ids:
        body["prompt_token_ids"] = samples[0].prompt_token_ids
    return body


def chat_chunks(
    pairs: list[tuple[Sample, Answer]],
    model: str,
    tokenizer: Any,
    logprobs: int | None,
    ids: bool,
    usage: bool,
) -> Iterator[dict[str, Any]]:
    """A chat completion as the chunks of a stream: per choice its role, reasoning, content, each tool call and
    its finish (the whole answer at once: the run asks vLLM for whole completions), then the usage if asked."""
    head = _head("chat.completion.chunk", "chatcmpl", model)

    def chunk(index: int, delta: dict[str, Any], finish: str | None = None, **more: Any) -> dict[str, Any]:
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish, **more}
        return {**head, "choices": [choice]}

    for i, (sample, answer) in enumerate(pairs):
        yield chunk(i, {"role": "assistant", "content": ""})
        if answer.reasoning is not None:
            yield chunk(i, {"reasoning": answer.reasoning, "reasoning_content": answer.reasoning})
        if answer.content is not None:
            yield chunk(i, {"content": answer.content})
        for j, call in enumerate(answer.tool_calls):
            yield chunk(i, {"tool_calls": [{"index": j, **call}]})
        last = chunk(i, {}, answer.finish_reason, stop_reason=sample.stop_reason, **_ids(sample, ids))
        if logprobs is not None:
            last["choices"][0]["logprobs"] = _chat_logprobs(sample, tokenizer, logprobs)
        yield last
    if usage:
        yield {**head, "choices": [], "usage": _usage([s for s, _ in pairs])}


def _text_logprobs(sample: Sample, tokenizer: Any, top: int) -> dict[str, Any]:
    tokens = [_piece(tokenizer, t) for t in sample.response_token_ids]
    offsets, at = [], 0
    for piece in tokens:
        offsets.append(at)
        at += len(piece)
    alternatives = None
    if top and sample.top_token_ids is not None and sample.top_logprobs is not None:
        alternatives = [
            {_piece(tokenizer, t): lp for t, lp in zip(ids[:top], lps[:top], strict=True)}
            for ids, lps in zip(sample.top_token_ids, sample.top_logprobs, strict=True)
        ]
    return {
        "tokens": tokens,
        "token_logprobs": list(sample.response_logprobs),
        "top_logprobs": alternatives,
        "text_offset": offsets,
    }


def _text_choice(i: int, sample: Sample, tokenizer: Any, logprobs: int | None, ids: bool) -> dict[str, Any]:
    return {
        "index": i,
        "text": sample.response,
        "logprobs": None if logprobs is None else _text_logprobs(sample, tokenizer, logprobs),
        "finish_reason": "length" if sample.finish_reason == "length" else "stop",
        "stop_reason": sample.stop_reason,
        **_ids(sample, ids),
        **({"prompt_token_ids": sample.prompt_token_ids} if ids else {}),
    }


def text_body(samples: list[Sample], model: str, tokenizer: Any, logprobs: int | None, ids: bool) -> dict[str, Any]:
    """A whole text completion: one choice per sample."""
    body = _head("text_completion", "cmpl", model)
    body.update(
        choices=[_text_choice(i, s, tokenizer, logprobs, ids) for i, s in enumerate(samples)], usage=_usage(samples)
    )
    return body


def text_chunks(
    samples: list[Sample], model: str, tokenizer: Any, logprobs: int | None, ids: bool, usage: bool
) -> Iterator[dict[str, Any]]:
    """A text completion as a stream: one chunk per choice (its whole text and finish), then the usage if asked."""
    head = _head("text_completion", "cmpl", model)
    for i, sample in enumerate(samples):
        yield {**head, "choices": [_text_choice(i, sample, tokenizer, logprobs, ids)]}
    if usage:
        yield {**head, "choices": [], "usage": _usage(samples)}


def _head(kind: str, prefix: str, model: str) -> dict[str, Any]:
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model}
