"""Prompt JSONL: one validated `Problem` per row, streamed, never the whole file in memory.

A row's identity is its content: without an `id` field the id is a stable hash of the prompt and the label, so
the same row gets the same id in any file on any day, and a different row never collides with a finished one.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .errors import InputError

BOM = b"\xef\xbb\xbf"
CHUNK = 1 << 16


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
        raise InputError(source, line, None, f"expected a JSON object, got {type(row).__name__}")
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
        raise InputError(source, line, keys.label, f"must be a string or a number (or an object of code tests), "
                                                   f"got {type(label).__name__}")
    digest = content_hash(prompt, label)
    pid = row.pop(keys.id, None)
    if pid is None:
        pid = digest
    elif isinstance(pid, bool) or not isinstance(pid, str | int) or pid == "":
        raise InputError(source, line, keys.id, f"must be a non-empty string or an integer, got {pid!r}")
    reward = row.pop(keys.reward, None)
    if reward is not None and (not isinstance(reward, str) or not reward):
        raise InputError(source, line, keys.reward, "must name a reward (math, exact, or one --allow-reward allows)")
    return Problem(id=str(pid), prompt=prompt, label=label, metadata=row, line=line, reward=reward, source=source,
                   content_hash=digest)


def parse_row(raw: bytes, line: int, source: str, keys: InputKeys) -> Problem:
    if line == 1 and raw.startswith(BOM):  # spreadsheet and Windows exports start with a byte-order mark
        raw = raw[len(BOM):]
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
    """Checks each row against the ones before it: an id seen twice is a bad row, the second time."""

    def __init__(self, source: str, keys: InputKeys, on_invalid: Callable[[InputError], None] | None) -> None:
        self.source, self.keys, self.on_invalid = source, keys, on_invalid
        self.seen: dict[str, int] = {}

    def take(self, raw: bytes, line_no: int) -> Problem | None:
        if not raw.strip():
            return None
        try:
            problem = parse_row(raw, line_no, self.source, self.keys)
            first = self.seen.get(problem.id)
            if first is not None:
                raise InputError(self.source, line_no, self.keys.id, f"duplicate id {problem.id!r} (first on line "
                                                                     f"{first})")
        except InputError as exc:
            if self.on_invalid is None:
                raise
            self.on_invalid(exc)
            return None
        self.seen[problem.id] = line_no
        return problem


def read_problems(path: str, keys: InputKeys = InputKeys(),
                  on_invalid: Callable[[InputError], None] | None = None) -> Iterator[Problem]:
    """Problems of a file (or `-`), lazily. Bad rows raise, unless `on_invalid` takes them (``--skip-invalid``)."""
    if path != "-" and (not Path(path).exists() or Path(path).is_dir()):
        raise InputError(path, 0, None, "no such file")
    rows = Rows(source_name(path), keys, on_invalid)
    stream = sys.stdin.buffer if path == "-" else open(path, "rb")  # noqa: SIM115 - closed below
    try:
        for line_no, raw in enumerate(stream, start=1):
            problem = rows.take(raw, line_no)
            if problem is not None:
                yield problem
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


async def aread_problems(path: str, keys: InputKeys = InputKeys(),
                         on_invalid: Callable[[InputError], None] | None = None) -> AsyncIterator[Problem]:
    """`read_problems` for the event loop: a row is handed on as soon as its line arrives (a slow producer on
    stdin is served row by row), and nothing ever waits for stdin to close."""
    if path != "-" and (not Path(path).exists() or Path(path).is_dir()):
        raise InputError(path, 0, None, "no such file")
    rows = Rows(source_name(path), keys, on_invalid)
    line_no = 0
    async for raw in read_lines(path):
        line_no += 1
        problem = rows.take(raw, line_no)
        if problem is not None:
            yield problem


async def read_lines(path: str) -> AsyncIterator[bytes]:
    """Lines of a file or of stdin, read by a daemon thread with raw `os.read`: it never blocks the loop, holds
    no lock that interpreter shutdown needs, and a shutdown never waits for it. Reads ahead at most 8 chunks."""
    loop = asyncio.get_running_loop()
    chunks: asyncio.Queue[bytes | BaseException] = asyncio.Queue()
    credits = threading.Semaphore(8)
    stop = threading.Event()
    try:
        fd = 0 if path == "-" else os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise InputError(path, 0, None, f"cannot read: {exc.strerror or exc}") from exc

    def pump() -> None:
        try:
            while not stop.is_set():
                credits.acquire()
                if stop.is_set():
                    break
                try:
                    chunk = os.read(fd, CHUNK)
                except OSError as exc:
                    loop.call_soon_threadsafe(chunks.put_nowait, exc)
                    return
                loop.call_soon_threadsafe(chunks.put_nowait, chunk)
                if not chunk:
                    return
        except RuntimeError:  # the loop is closed: the run is over
            return
        finally:
            if fd != 0:
                os.close(fd)

    threading.Thread(target=pump, name="agentroll-input", daemon=True).start()
    pending = b""
    try:
        while True:
            chunk = await chunks.get()
            credits.release()
            if isinstance(chunk, BaseException):
                raise InputError(source_name(path), 0, None, f"cannot read: {chunk}")
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                yield line
        if pending:
            yield pending
    finally:
        stop.set()
        credits.release()
