"""A prompt row as a validated `Problem`, whatever file format it came from.

A row's identity is its content: without an `id` field the id is a stable hash of the prompt and the label, so
the same row gets the same id in any file (JSONL, compressed or not, or Parquet) on any day, and a different row
never collides with a finished one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import InputError, json_kind

BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class InputKeys:
    prompt: str = "prompt"
    label: str = "label"
    id: str = "id"
    reward: str = "reward"


DEFAULT_KEYS = InputKeys()


@dataclass(slots=True)
class Problem:
    id: str
    prompt: str | list[dict[str, Any]]
    label: Any
    metadata: dict[str, Any]
    line: int
    reward: str | None = None  # the row's own reward kind (`reward` field), else the run's --reward
    source: str = "<row>"
    content_hash: str = ""  # hash of prompt and label: the row's identity, checked on resume

    def __post_init__(self) -> None:
        if not self.content_hash:
            self.content_hash = content_hash(self.prompt, self.label)

    @property
    def statement(self) -> str:
        """The problem text the rewriter and selector templates see: for chat rows, the last user message."""
        if isinstance(self.prompt, str):
            return self.prompt
        users = [m["content"] for m in self.prompt if m.get("role") == "user"]
        return users[-1] if users else self.prompt[-1]["content"]


def content_hash(prompt: Any, label: Any) -> str:
    """64 bits of blake2b over the canonical JSON of (prompt, label): stable across runs, hosts and Pythons."""
    data = orjson.dumps([prompt, label], option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(data, digest_size=8).hexdigest()


def _check_messages(value: list[Any]) -> str | None:
    if not value:
        return "an empty list of messages"
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            return f"message {i} is not an object"
        if not isinstance(message.get("role"), str) or not isinstance(message.get("content"), str):
            return f"message {i} needs string 'role' and 'content'"
    return None


def problem_from_row(row: Any, line: int = 0, source: str = "<row>", keys: InputKeys = InputKeys()) -> Problem:
    """Validate one row (a dict); raise `InputError` naming the source, line and field."""
    if not isinstance(row, dict):
        raise InputError(source, line, None, f"expected a JSON object, got {json_kind(row)}")
    row = dict(row)
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
    if isinstance(label, bool) or not isinstance(label, str | int | float | dict):
        raise InputError(
            source,
            line,
            keys.label,
            f"must be a string or a number (or an object of code tests), got {json_kind(label)}",
        )
    digest = content_hash(prompt, label)
    pid = row.pop(keys.id, None)
    if pid is None:
        pid = digest
    elif isinstance(pid, bool) or not isinstance(pid, str | int) or pid == "":
        raise InputError(source, line, keys.id, f"must be a non-empty string or an integer, got {pid!r}")
    reward = row.pop(keys.reward, None)
    if reward is not None and (not isinstance(reward, str) or not reward):
        raise InputError(source, line, keys.reward, "must name a reward (math, exact, or one --allow-reward allows)")
    return Problem(
        id=str(pid),
        prompt=prompt,
        label=label,
        metadata=row,
        line=line,
        reward=reward,
        source=source,
        content_hash=digest,
    )


def parse_row(raw: bytes, line: int, source: str, keys: InputKeys) -> Problem:
    if line == 1 and raw.startswith(BOM):  # spreadsheet and Windows exports start with a byte-order mark
        raw = raw[len(BOM) :]
    try:
        row = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(source, line, None, f"malformed JSON ({exc})") from None
    return problem_from_row(row, line, source, keys)


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


def source_name(path: str) -> str:
    return "<stdin>" if path == "-" else path


class Rows:
    """Checks each row against the ones before it: an id seen twice is a bad row, the second time. A bad row
    raises, unless `on_invalid` takes it (``--skip-invalid``)."""

    def __init__(self, source: str, keys: InputKeys, on_invalid: Callable[[InputError], None] | None) -> None:
        self.source, self.keys, self.on_invalid = source, keys, on_invalid
        self.seen: dict[str, int] = {}

    def take(self, raw: bytes, line_no: int) -> Problem | None:
        """A JSONL line (a blank one is no row)."""
        if not raw.strip():
            return None
        return self._admit(lambda: parse_row(raw, line_no, self.source, self.keys), line_no)

    def take_row(self, row: Any, line_no: int, convert: Callable[[Any, str, int], Any]) -> Problem | None:
        """A row of another format, `convert`ed to the values its JSON would hold first."""
        return self._admit(
            lambda: problem_from_row(convert(row, self.source, line_no), line_no, self.source, self.keys), line_no
        )

    def _admit(self, make: Callable[[], Problem], line_no: int) -> Problem | None:
        try:
            problem = make()
            first = self.seen.get(problem.id)
            if first is not None:
                raise InputError(
                    self.source, line_no, self.keys.id, f"duplicate id {problem.id!r} (first on line {first})"
                )
        except InputError as exc:
            if self.on_invalid is None:
                raise
            self.on_invalid(exc)
            return None
        self.seen[problem.id] = line_no
        return problem
