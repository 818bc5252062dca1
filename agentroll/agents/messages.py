"""Chat messages and tools as an agent sends them (OpenAI's chat format), in the forms the proxy needs.

- `canonical`: what a message says, in one form whatever the client's serializer did to it (content parts joined,
  `null` fields dropped, tool-call arguments decoded, `reasoning_content` and `reasoning` as one): two requests
  carry the same turn exactly when their canonical forms are equal. The conversation index compares these.
- `for_template`: what vLLM hands the chat template (its `chat_utils`): content as one string (text parts joined
  by newlines, `null` as ""), an assistant's tool-call arguments as objects, its reasoning as both `reasoning`
  and `reasoning_content`, a tool result's `tool_call_id`, a `name`.
- `for_server`: the same in the OpenAI form that vLLM's `/tokenize` validates (arguments as JSON strings), for a
  run whose prompts the server renders (`--chat-render server`).

A message agentroll cannot render as text (an image part, a role that is not a string) is a `BadRequest`.
"""

from __future__ import annotations

import json
from typing import Any

from ..render.chat import vllm_tools

__all__ = ["BadRequest", "canonical", "for_server", "for_template", "tools_of"]


class BadRequest(Exception):
    """What the agent asked cannot be served exactly: answered with HTTP 400 and this message. `param`: the
    request field at fault, as OpenAI's error bodies name it."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _text(content: Any, where: str) -> str:
    """A message's content as one string: a string, null (""), or a list of text parts joined by newlines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for n, part in enumerate(content):
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif isinstance(part, dict) and part.get("type") in (None, "text"):  # not another kind: a malformed one
                text = '{"type": "text", "text": "..."}'
                raise BadRequest(f"{where}: content part {n} is no text part {text} (its keys: {sorted(part)})", where)
            else:
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(f"{where}: a {kind!r} content part: agentroll's proxy serves text only", where)
        return "\n".join(texts)
    raise BadRequest(f"{where}: content must be a string, a list of text parts or null", where)


def _arguments(value: Any) -> Any:
    """A tool call's arguments as the template sees them: an object (a JSON string decoded), {} for none."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value  # compared as written; the template gets {} (`for_template`), as vLLM coerces it
    return value


def _calls(message: dict[str, Any], where: str) -> list[dict[str, Any]]:
    calls = message.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise BadRequest(f"{where}.tool_calls must be a list", where)
    out = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise BadRequest(f"{where}.tool_calls.{j}: only calls of type 'function' are served", where)
        out.append({"id": call.get("id"), "name": function.get("name"), "arguments": function.get("arguments")})
    return out


def _reasoning(message: dict[str, Any]) -> str | None:
    found = message.get("reasoning")
    if found is None:
        found = message.get("reasoning_content")
    return found if isinstance(found, str) and found else None


def _checked(message: Any, i: int) -> tuple[dict[str, Any], str]:
    where = f"messages.{i}"
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise BadRequest(f"{where}: a message is an object with a string `role`", where)
    return message, where


def canonical(message: Any, i: int = 0) -> dict[str, Any]:
    """What the message says, for comparing turns (see the module's docstring)."""
    message, where = _checked(message, i)
    out: dict[str, Any] = {"role": message["role"], "content": _text(message.get("content"), where)}
    if message["role"] == "assistant":
        calls = _calls(message, where)
        if calls:
            out["tool_calls"] = [{**c, "arguments": _arguments(c["arguments"])} for c in calls]
        reasoning = _reasoning(message)
        if reasoning is not None:
            out["reasoning"] = reasoning
    if message["role"] == "tool" and message.get("tool_call_id") is not None:
        out["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str):
        out["name"] = message["name"]
    return out


def _form(message: Any, i: int, arguments: Any) -> dict[str, Any]:
    """The canonical message with its tool calls in OpenAI's shape, their arguments as `arguments` makes them."""
    out = canonical(message, i)
    if "tool_calls" in out:
        out["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": arguments(c["arguments"])}}
            for c in out["tool_calls"]
        ]
    return out


def for_template(message: Any, i: int = 0) -> dict[str, Any]:
    """The message as vLLM gives it to the chat template (see the module's docstring): arguments as an object
    (unreadable ones as {}, as vLLM coerces them), the reasoning under both names."""
    out = _form(message, i, lambda value: value if isinstance(value, dict) else {})
    if "reasoning" in out:
        out["reasoning_content"] = out["reasoning"]
    return out


def for_server(message: Any, i: int = 0) -> dict[str, Any]:
    """The message in the OpenAI form vLLM's `/tokenize` takes (see the module's docstring): arguments as JSON
    text, the reasoning as `reasoning` (the name its chat endpoint renames `reasoning_content` to)."""
    return _form(message, i, lambda value: value if isinstance(value, str) else json.dumps(value))


def tools_of(tools: Any) -> list[dict[str, Any]] | None:
    """A request's `tools` as vLLM hands them to the template (`chat.vllm_tools`); None for none."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list of {'type': 'function', 'function': {...}}", "tools")
    try:
        return vllm_tools(tools)
    except ValueError as exc:
        raise BadRequest(str(exc), "tools") from None
