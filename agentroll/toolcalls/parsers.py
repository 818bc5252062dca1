"""Tool calls in model text, one parser per model family; `parser_for(spec)` picks one by name or loads yours.

A parser takes the text the calls are read from (`tool_text`: the answer after the think block) and returns
every call it finds, in order, as `ParsedCall`s; a call that is there but cannot be read (broken JSON, no name,
no closing tag) is a `ParsedCall` with `error` set, so the model can be told what was wrong. No call at all: an
empty list, and the response is the model's answer. A call object's string `"id"` (Mistral's models write one)
is kept as the call's id; `call_id` derives one for a call without it.

- `hermes` (Qwen2.5, Qwen3, Hermes; vLLM's `hermes` parser): `<tool_call>{"name": ..., "arguments": {...}}
  </tool_call>`, one block per call, several allowed;
- `llama3_json` (Llama 3.x): the whole answer a JSON object `{"name": ..., "parameters": {...}}` (after an
  optional `<|python_tag|>`), several joined by `;`;
- `mistral`: `[TOOL_CALLS]` then a JSON array of `{"name": ..., "arguments": {...}}`.
- `FILE.py:NAME` or `MODULE:NAME`: a function `text -> list[ParsedCall]`, or a class whose instances have
  `parse(text)`.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import UsageError
from ..process.loading import load_object

__all__ = ["PARSERS", "ParsedCall", "Parser", "call_id", "parser_for", "tool_text"]

THINK_CLOSE = "</think>"
ID_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True, slots=True)
class ParsedCall:
    """One call as the model wrote it: `arguments` is the object when the call is well-formed, else whatever
    could be read of it (the raw text); `error` says why it is malformed; `id` the id the model gave it."""

    name: str | None
    arguments: Any
    raw: str
    error: str | None = None
    id: str | None = None


Parser = Callable[[str], list[ParsedCall]]


def tool_text(response: str, think: bool = True) -> str:
    """The part of a response calls are read from: with thinking, the text after its one `</think>` (as the
    answer is read: `agentroll.record.parsing.answer_content`), none when the block never closes (or closes twice), so
    call-like text in unfinished reasoning is never run; without thinking (`--no-think`), all of it."""
    if not think:
        return response
    parts = response.split(THINK_CLOSE)
    return parts[1] if len(parts) == 2 else ""


def call_id(*parts: object) -> str:
    """An id for a call the model gave none: 9 letters and digits (the form Mistral's templates require), the
    same for the same parts (the run's seed, the problem, the execution, the turn, the call's place)."""
    key = "\x1f".join(map(str, parts)).encode()
    number = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
    return "".join(ID_ALPHABET[number // len(ID_ALPHABET) ** i % len(ID_ALPHABET)] for i in range(9))


def _call(raw: str, data: Any, keys: tuple[str, ...] = ("arguments",)) -> ParsedCall:
    """A decoded call object checked: a string `name`, an object of arguments (or one as a JSON string)."""
    if not isinstance(data, dict):
        return ParsedCall(None, raw, raw, f"a call must be a JSON object, got {type(data).__name__}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return ParsedCall(None, raw, raw, 'the call has no "name"')
    arguments: Any = next((data[k] for k in keys if k in data), {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return ParsedCall(name, arguments, raw, f'the "{keys[0]}" of {name!r} are not JSON')
    if not isinstance(arguments, dict):
        return ParsedCall(name, arguments, raw, f'the "{keys[0]}" of {name!r} must be a JSON object')
    given = data.get("id")
    return _keepable(ParsedCall(name, arguments, raw, id=given if isinstance(given, str) and given else None), keys[0])


def _keepable(call: ParsedCall, key: str = "arguments") -> ParsedCall:
    """The call, or the same call malformed when records cannot hold its arguments (they are written with orjson:
    an integer past 64 bits the model wrote would end the run, not fail its call)."""
    if call.error is not None:
        return call
    try:
        orjson.dumps(call.arguments)
    except TypeError as exc:
        return ParsedCall(
            call.name, call.raw, call.raw, f'the "{key}" of {call.name!r} cannot be kept ({exc})', call.id
        )
    return call


def _json(raw: str, keys: tuple[str, ...] = ("arguments",)) -> ParsedCall:
    try:
        data = json.loads(raw)
    except ValueError as exc:
        return ParsedCall(None, raw, raw, f"the call is not valid JSON ({exc})")
    return _call(raw, data, keys)


_HERMES = re.compile(r"<tool_call>(.*?)(</tool_call>|\Z)", re.S)


def hermes(text: str) -> list[ParsedCall]:
    calls = []
    for found in _HERMES.finditer(text):
        raw = found.group(1).strip()
        if not found.group(2):
            calls.append(ParsedCall(None, raw, raw, "a <tool_call> without its closing </tool_call>"))
        else:
            calls.append(_json(raw))
    return calls


def llama3_json(text: str) -> list[ParsedCall]:
    body = text.strip().removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return []
    decoder, at = json.JSONDecoder(), 0
    calls: list[ParsedCall] = []
    while at < len(body):
        try:
            data, end = decoder.raw_decode(body, at)
        except ValueError as exc:
            raw = body[at:].strip()
            return [*calls, ParsedCall(None, raw, raw, f"the call is not valid JSON ({exc})")]
        calls.append(_call(body[at:end], data, ("parameters", "arguments")))
        at = end
        while at < len(body) and body[at] in " \t\r\n;":
            at += 1
    return calls


def mistral(text: str) -> list[ParsedCall]:
    _, marker, rest = text.partition("[TOOL_CALLS]")
    if not marker:
        return []
    raw = rest.strip()
    try:
        data = json.JSONDecoder().raw_decode(raw)[0]
    except ValueError as exc:
        return [ParsedCall(None, raw, raw, f"the calls are not valid JSON ({exc})")]
    items = data if isinstance(data, list) else [data]
    return [_call(json.dumps(item), item) for item in items]


PARSERS: dict[str, Parser] = {"hermes": hermes, "llama3_json": llama3_json, "mistral": mistral}


def parser_for(spec: str) -> Parser:
    """A built-in parser by name, or a user's by FILE.py:NAME or MODULE:NAME."""
    if spec in PARSERS:
        return PARSERS[spec]
    if ":" not in spec:
        raise UsageError(f"tool-call parser {spec!r}: not one of {', '.join(PARSERS)} nor FILE.py:NAME")
    found = load_object(spec, "tool-call parser", UsageError, "function or class")
    if inspect.isclass(found):
        found = getattr(found(), "parse", None)
    if not callable(found):
        raise UsageError(f"tool-call parser {spec!r}: not a function, nor a class with a parse method")

    def checked(text: str) -> list[ParsedCall]:
        calls = found(text)
        if not isinstance(calls, list) or not all(isinstance(c, ParsedCall) for c in calls):
            raise UsageError(f"tool-call parser {spec!r} must return a list of agentroll.toolcalls.ParsedCall")
        return [_keepable(call) for call in calls]

    return checked
