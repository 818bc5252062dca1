"""Streaming reader for prompt JSONL: one validated `Problem` per row, never the whole file in memory."""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from .errors import InputError


@dataclass(frozen=True, slots=True)
class InputKeys:
    prompt: str = "prompt"
    label: str = "label"
    id: str = "id"
    reward: str = "reward"


@dataclass(slots=True)
class Problem:
    id: str
    prompt: str | list[dict[str, Any]]
    label: Any
    metadata: dict[str, Any]
    line: int
    reward: str | None = None  # the row's own reward kind (`reward` field), else the run's --reward

    @property
    def statement(self) -> str:
        """The problem text the rewriter and selector templates see: for chat rows, the last user message."""
        if isinstance(self.prompt, str):
            return self.prompt
        users = [m["content"] for m in self.prompt if m.get("role") == "user"]
        return users[-1] if users else self.prompt[-1]["content"]


def _check_messages(value: list[Any]) -> str | None:
    if not value:
        return "an empty list of messages"
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            return f"message {i} is not an object"
        if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
            return f"message {i} needs string 'role' and 'content'"
    return None


def parse_row(raw: bytes, line: int, source: str, keys: InputKeys) -> Problem:
    """Validate one line; raise `InputError` naming the line and the field."""
    try:
        row = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(source, line, None, f"malformed JSON ({exc})") from None
    if not isinstance(row, dict):
        raise InputError(source, line, None, f"expected a JSON object, got {type(row).__name__}")
    if keys.prompt not in row:
        raise InputError(source, line, keys.prompt, "missing")
    prompt = row.pop(keys.prompt)
    if isinstance(prompt, list):
        problem = _check_messages(prompt)
        if problem:
            raise InputError(source, line, keys.prompt, problem)
    elif not isinstance(prompt, str) or not prompt.strip():
        raise InputError(source, line, keys.prompt, "must be a non-empty string or a list of chat messages")
    if keys.label not in row:
        raise InputError(source, line, keys.label, "missing")
    label = row.pop(keys.label)
    if isinstance(label, bool) or not isinstance(label, str | int | float):
        raise InputError(source, line, keys.label, f"must be a string or a number, got {type(label).__name__}")
    pid = row.pop(keys.id, None)
    if pid is None:
        pid = line
    elif isinstance(pid, bool) or not isinstance(pid, str | int):
        raise InputError(source, line, keys.id, f"must be a string or an integer, got {type(pid).__name__}")
    reward = row.pop(keys.reward, None)
    if reward is not None and (not isinstance(reward, str) or not reward):
        raise InputError(source, line, keys.reward, "must name a reward (math, exact, remote, FILE.py:FUNCTION)")
    return Problem(id=str(pid), prompt=prompt, label=label, metadata=row, line=line, reward=reward)


def in_partition(problem_id: str, index: int, count: int) -> bool:
    """Slice `index` of `count` by a stable hash of the id: the same on every host, Python and run."""
    digest = hashlib.blake2b(problem_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % count == index


def parse_partition(text: str) -> tuple[int, int]:
    """`I/N` with 0 <= I < N."""
    try:
        index, count = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--partition {text!r}: expected I/N, e.g. 0/4") from None
    if not 0 <= index < count:
        raise ValueError(f"--partition {text!r}: need 0 <= I < N")
    return index, count


def _open(path: str) -> tuple[BinaryIO, str]:
    if path == "-":
        return sys.stdin.buffer, "<stdin>"
    p = Path(path)
    if not p.is_file():
        raise InputError(path, 0, None, "no such file")
    return p.open("rb"), path


def read_problems(
    path: str,
    keys: InputKeys = InputKeys(),
    on_invalid: Callable[[InputError], None] | None = None,
) -> Iterator[Problem]:
    """Yield problems lazily. Bad rows raise, unless `on_invalid` takes them (``--skip-invalid``).

    Duplicate ids are bad rows too: two rows with one id would make resume and grouping ambiguous.
    """
    stream, source = _open(path)
    seen: set[str] = set()
    try:
        for line_no, raw in enumerate(stream, start=1):
            if not raw.strip():
                continue
            try:
                problem = parse_row(raw, line_no, source, keys)
                if problem.id in seen:
                    raise InputError(source, line_no, keys.id, f"duplicate id {problem.id!r}")
            except InputError as exc:
                if on_invalid is None:
                    raise
                on_invalid(exc)
                continue
            seen.add(problem.id)
            yield problem
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()
