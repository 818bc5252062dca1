"""The Responses API (`POST /v1/responses`) on the proxy: a request read as the chat request it amounts to, and a
call answered as OpenAI's Response object (whole, or as its stream of events).

A request becomes chat messages: `instructions` a system message first, `input` a text (one user message) or a list
of items: messages (`user`, `system`, `developer` as system, `assistant`; text parts), `reasoning` (its text, the
reasoning of the assistant turn it opens), `function_call` (a tool call of that turn) and `function_call_output` (a
`tool` message). A turn given back as the proxy answered it (reasoning, text and calls) is the chat answer it was,
so the request continues that call by ids (`history`), as a chat request does. `previous_response_id` puts the
conversation of a response this execution made (the proxy holds its messages and answer; not its instructions,
which the request gives anew, as OpenAI has it) before the input; another id is a 400.
Function tools become chat tools; other tool kinds, `tool_choice` other than auto or none, a text format other than
text, `reasoning` settings, `truncation: auto`, logprobs and anything else that would change what is sampled are a
`BadRequest` naming them: what cannot be served exactly is never served otherwise.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

from ..record.schema import Sample
from .messages import BadRequest
from .replies import Answer
from .requests import ChatRequest, chat_request

__all__ = ["held_conversation", "response_body", "response_events", "responses_request"]

# read and left: they change nothing the model samples
IGNORED = frozenset(
    {
        *("model", "user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"),
        *("background", "prompt_cache_retention", "stream_options", "include", "request_id", "priority"),
    }
)
SERVED = frozenset(
    {
        *("input", "instructions", "tools", "tool_choice", "previous_response_id", "max_output_tokens"),
        *("temperature", "top_p", "stream", "parallel_tool_calls", "text", "truncation", "reasoning", "top_logprobs"),
    }
)


def _text_of(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    """A message's content as one text: a string, or its text parts (`kinds`) joined by newlines."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}: content must be a string or a list of text parts", where)
    texts = []
    for n, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in kinds or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise BadRequest(f"{where}.content.{n}: a {kind!r} part: agentroll's proxy serves text only", where)
        texts.append(part["text"])
    return "\n".join(texts)


class _Turns:
    """Input items as chat messages: the assistant-side items of one turn (reasoning, text, calls) made one."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the assistant turn being put together

    def _assistant(self, starts: bool) -> dict[str, Any]:
        if self._open is None or starts:
            self._open = {"role": "assistant", "content": None}
            self.messages.append(self._open)
        return self._open

    def add(self, item: Any, i: int) -> None:
        where = f"input.{i}"
        if not isinstance(item, dict):
            raise BadRequest(f"{where}: an input item is an object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role == "assistant":
                turn = self._open
                text = _text_of(item.get("content"), where, ("output_text", "input_text", "text"))
                starts = turn is None or turn["content"] is not None or "tool_calls" in turn
                self._assistant(starts)["content"] = text
                return
            if role not in ("user", "system", "developer"):
                raise BadRequest(f"{where}: role {role!r} is not served (user, system, developer, assistant)", where)
            self._open = None
            text = _text_of(item.get("content"), where, ("input_text", "text"))
            self.messages.append({"role": "system" if role == "developer" else role, "content": text})
        elif kind == "reasoning":
            parts = item.get("content") or item.get("summary") or []
            text = _text_of(parts, where, ("reasoning_text", "summary_text"))
            turn = self._open
            starts = turn is None or turn["content"] is not None or "tool_calls" in turn or "reasoning" in turn
            self._assistant(starts)["reasoning"] = text
        elif kind == "function_call":
            call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
            if not all(isinstance(v, str) for v in (call_id, name, arguments)):
                raise BadRequest(f"{where}: a function_call has a string call_id, name and arguments", where)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            self._assistant(False).setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            output = item.get("output")
            if not isinstance(item.get("call_id"), str):
                raise BadRequest(f"{where}: a function_call_output has a string call_id", where)
            text = _text_of(output, where, ("input_text", "output_text", "text"))
            self._open = None
            self.messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
        else:
            raise BadRequest(f"{where}: a {kind!r} item is not served (messages, reasoning, function calls)", where)


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise BadRequest("`tools` must be a list of function tools", "tools")
    out = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
            raise BadRequest(f"tools.{j}: a {kind!r} tool is not served: only function tools are", "tools")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return out


def _refuse(body: dict[str, Any], effort_read: bool) -> None:
    for key, value in body.items():
        if value is None or key in IGNORED or key in SERVED:
            continue
        raise BadRequest(f"`{key}` is not served by agentroll's proxy (docs/agents.md lists what is)", key)
    checks = {
        "parallel_tool_calls": (True,),
        "truncation": ("disabled",),
        "top_logprobs": (0,),
    }
    for key, allowed in checks.items():
        value = body.get(key)
        if value is not None and not any(value == a and type(value) is type(a) for a in allowed):
            raise BadRequest(f"`{key}` {value!r} is not served: it would change what is sampled", key)
    text = body.get("text")
    if text is not None and (
        not isinstance(text, dict)
        or text.get("format", {"type": "text"}) != {"type": "text"}
        or not set(text) <= {"format", "verbosity"}
    ):
        raise BadRequest("`text` other than a text format is not served: it needs constrained decoding", "text")
    reasoning = body.get("reasoning")
    if reasoning is not None and (not isinstance(reasoning, dict) or not set(reasoning) <= {"effort", "summary"}):
        raise BadRequest("`reasoning` other than effort and summary is not served", "reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") is not None and effort_read:
        raise BadRequest(
            "`reasoning.effort` is read by the run's chat template (its reasoning_effort): set it for the run with "
            "generate --chat-template-kwargs",
            "reasoning",
        )


def responses_request(
    body: Any,
    alternatives: int,
    template_kwargs: dict[str, Any],
    held: dict[str, list[dict[str, Any]]],
    effort_read: bool = False,
) -> ChatRequest:
    """A `/v1/responses` body as the chat request it amounts to (`BadRequest` for what cannot be served).
    `reasoning.effort` and `text.verbosity` (the Agents SDK sends both by default) are left, as vLLM leaves them to
    a template that reads no `reasoning_effort`; `effort_read`: the run's template reads it, so it is refused."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    _refuse(body, effort_read)
    turns = _Turns()
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise BadRequest("`instructions` must be a text", "instructions")
        turns.messages.append({"role": "system", "content": instructions})
    previous = body.get("previous_response_id")
    if previous is not None:
        if not isinstance(previous, str) or previous not in held:
            raise BadRequest(
                f"previous_response_id {str(previous)[:80]!r} is not a response of this execution",
                "previous_response_id",
            )
        turns.messages.extend(held[previous])  # its instructions are not carried over, as OpenAI has it
    given = body.get("input")
    if isinstance(given, str):
        turns.messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and len(given) <= 1 << 16:
        for i, item in enumerate(given):
            turns.add(item, i)
    else:
        raise BadRequest("`input` must be a text or a list of input items", "input")
    chat = {
        "messages": turns.messages,
        "tools": _tools(body.get("tools")),
        "tool_choice": body.get("tool_choice"),
        "max_completion_tokens": body.get("max_output_tokens"),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "stream": body.get("stream"),
    }
    return chat_request({k: v for k, v in chat.items() if v is not None}, alternatives, template_kwargs)


# -- the Response ---------------------------------------------------------------------------------------------------
def _output(answer: Answer, done: bool) -> list[dict[str, Any]]:
    """The answer's output items, in OpenAI's order: reasoning, the message, each function call."""
    status = "completed" if done else "incomplete"
    items: list[dict[str, Any]] = []
    if answer.reasoning is not None:
        items.append(
            {
                "id": f"rs_{uuid.uuid4().hex}",
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": answer.reasoning}],
                "encrypted_content": None,
                "status": status,
            }
        )
    if answer.content is not None:
        text = {"type": "output_text", "text": answer.content, "annotations": [], "logprobs": []}
        items.append(
            {
                "id": f"msg_{uuid.uuid4().hex}",
                "type": "message",
                "role": "assistant",
                "status": status,
                "content": [text],
            }
        )
    for call in answer.tool_calls:
        function = call["function"]
        items.append(
            {
                "id": f"fc_{uuid.uuid4().hex}",
                "type": "function_call",
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
                "status": "completed",
            }
        )
    return items


def response_body(
    ident: str, sample: Sample, answer: Answer, model: str, body: dict[str, Any], reasoning: bool
) -> dict[str, Any]:
    """The whole Response for one call (`ident` its id, `body` the request it answers)."""
    done = sample.finish_reason != "length"
    prompt, completion = len(sample.prompt_token_ids), len(sample.response_token_ids)
    thought = len(sample.response_token_ids) if reasoning and answer.reasoning and answer.content is None else 0
    tools = body.get("tools") if isinstance(body.get("tools"), list) else []
    return {
        "id": ident,
        "object": "response",
        "created_at": time.time(),
        "status": "completed" if done else "incomplete",
        "error": None,
        "incomplete_details": None if done else {"reason": "max_output_tokens"},
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {},
        "model": model,
        "output": _output(answer, done),
        "parallel_tool_calls": True,
        "temperature": sample.sampling.get("temperature"),
        "top_p": sample.sampling.get("top_p"),
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": tools,
        "max_output_tokens": body.get("max_output_tokens"),
        "previous_response_id": body.get("previous_response_id"),
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": thought},
            "total_tokens": prompt + completion,
        },
    }


def response_events(whole: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The Response as OpenAI streams it: created, in progress, each output item (added, its text or arguments
    as one delta, done), completed (the whole answer at once: the run asks vLLM for whole completions)."""
    counter = iter(range(1 << 30))
    started = {**whole, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}

    def event(kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        return kind, {"type": kind, "sequence_number": next(counter), **fields}

    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    for at, item in enumerate(whole["output"]):
        ident = item["id"]
        if item["type"] == "message":
            yield event(
                "response.output_item.added", output_index=at, item={**item, "content": [], "status": "in_progress"}
            )
            part = item["content"][0]
            empty = {**part, "text": ""}
            yield event("response.content_part.added", item_id=ident, output_index=at, content_index=0, part=empty)
            where = {"item_id": ident, "output_index": at, "content_index": 0, "logprobs": []}
            yield event("response.output_text.delta", delta=part["text"], **where)
            yield event("response.output_text.done", text=part["text"], **where)
            yield event("response.content_part.done", item_id=ident, output_index=at, content_index=0, part=part)
        elif item["type"] == "reasoning":
            yield event(
                "response.output_item.added", output_index=at, item={**item, "content": [], "status": "in_progress"}
            )
            text = item["content"][0]["text"]
            where = {"item_id": ident, "output_index": at, "content_index": 0}
            yield event("response.reasoning_text.delta", delta=text, **where)
            yield event("response.reasoning_text.done", text=text, **where)
        else:
            yield event(
                "response.output_item.added", output_index=at, item={**item, "arguments": "", "status": "in_progress"}
            )
            where = {"item_id": ident, "output_index": at}
            yield event("response.function_call_arguments.delta", delta=item["arguments"], **where)
            yield event(
                "response.function_call_arguments.done", arguments=item["arguments"], name=item["name"], **where
            )
        yield event("response.output_item.done", output_index=at, item=item)
    yield event("response.completed" if whole["status"] == "completed" else "response.incomplete", response=whole)


def held_conversation(request: ChatRequest, answer: Answer, body: dict[str, Any]) -> list[dict[str, Any]]:
    """What `previous_response_id` naming this response goes on from: the request's messages but its
    `instructions` (a later request gives its own), and the answer."""
    given = request.messages[1:] if body.get("instructions") is not None else request.messages
    return [*given, answer.message()]
