"""Problems of an input, streamed: JSONL (plain, gzip, zstd; a file or stdin) or Parquet (a file).

Both readers go through the same `Reader`, so a row has the same id, metadata and errors in every format and
both ways of reading; only where the items come from differs.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from ..errors import InputError
from .formats import Lines, byte_chunks, file_format
from .rows import DEFAULT_KEYS, InputKeys, Problem, Rows, source_name

AHEAD = 8  # items (chunks of bytes, batches of Parquet rows) the reader thread may read ahead

Item = bytes | list[dict[str, Any]]


class Reader:
    """Turns items (JSONL bytes, or batches of Parquet rows) into problems, numbering lines (rows) from 1. Rows
    come out one by one, lazily: a bad row raises when it is reached, after every row before it in its item (64
    KiB of JSONL, a batch of Parquet rows) has been handed on, and a reader that stops early (`--limit`) never
    checks a row after the last one it took."""

    def __init__(self, path: str, keys: InputKeys, on_invalid: Callable[[InputError], None] | None) -> None:
        self.rows = Rows(source_name(path), keys, on_invalid)
        self.lines = Lines()
        self.line = 0

    def feed(self, item: Item) -> Iterator[Problem]:
        if isinstance(item, bytes):
            yield from self._lines(self.lines.feed(item))
            return
        from .parquet import to_json

        for row in item:
            self.line += 1
            problem = self.rows.take_row(row, self.line, to_json)
            if problem is not None:
                yield problem

    def end(self) -> Iterator[Problem]:
        return self._lines(self.lines.end())

    def _lines(self, lines: list[bytes]) -> Iterator[Problem]:
        for raw in lines:
            self.line += 1
            problem = self.rows.take(raw, self.line)
            if problem is not None:
                yield problem


def items(path: str) -> Iterator[Item]:
    """What `Reader` eats, read lazily from the file (or stdin, `-`): its format decided by its first bytes."""
    source = source_name(path)
    if file_format(path) == "parquet":
        from .parquet import row_batches

        return row_batches(path, source)
    return byte_chunks(path, source)


def check(path: str) -> None:
    """What can be told before a row is read: the file is there, its name does not lie about its bytes, and what
    reads it is installed. A run checks this before it touches its output folder."""
    _exists(path)
    if file_format(path) == "parquet":
        from .parquet import _pq

        _pq(source_name(path))


def _exists(path: str) -> None:
    if path != "-" and (not Path(path).exists() or Path(path).is_dir()):
        raise InputError(path, 0, None, "no such file")  # a FIFO or <(process substitution) is fine


def read_problems(
    path: str, keys: InputKeys = DEFAULT_KEYS, on_invalid: Callable[[InputError], None] | None = None
) -> Iterator[Problem]:
    """Problems of a file (or `-`), lazily. Bad rows raise, unless `on_invalid` takes them (``--skip-invalid``)."""
    _exists(path)
    reader = Reader(path, keys, on_invalid)
    source = items(path)
    try:
        for item in source:
            yield from reader.feed(item)
        yield from reader.end()
    finally:
        close = getattr(source, "close", None)
        if close is not None:
            close()


async def aread_problems(
    path: str, keys: InputKeys = DEFAULT_KEYS, on_invalid: Callable[[InputError], None] | None = None
) -> AsyncIterator[Problem]:
    """`read_problems` for the event loop: a row is handed on as soon as its line arrives (a slow producer on
    stdin is served row by row), and nothing ever waits for stdin to close."""
    _exists(path)
    reader = Reader(path, keys, on_invalid)
    async for item in pumped(lambda: items(path)):
        for problem in reader.feed(item):
            yield problem
    for problem in reader.end():
        yield problem


async def pumped(produce: Callable[[], Iterator[Item]]) -> AsyncIterator[Item]:
    """`produce()`'s items, made by a daemon thread (reading, decompressing, decoding Parquet), so the loop never
    blocks; the thread holds no lock that interpreter shutdown needs, a shutdown never waits for it, and it runs
    at most `AHEAD` items ahead. An error in the thread is raised here."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[Item | BaseException | None] = asyncio.Queue()
    credits = threading.Semaphore(AHEAD)
    stop = threading.Event()

    def pump() -> None:
        source: Iterator[Item] | None = None
        try:
            try:
                source = produce()
            except Exception as exc:
                loop.call_soon_threadsafe(queue.put_nowait, exc)
                return
            while not stop.is_set():
                credits.acquire()
                if stop.is_set():
                    break
                try:
                    item = next(source, None)
                except Exception as exc:
                    loop.call_soon_threadsafe(queue.put_nowait, exc)
                    return
                loop.call_soon_threadsafe(queue.put_nowait, item)
                if item is None:
                    return
        except RuntimeError:  # the loop is closed: the run is over
            return
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()

    threading.Thread(target=pump, name="agentroll-input", daemon=True).start()
    try:
        while True:
            item = await queue.get()
            credits.release()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                break
            yield item
    finally:
        stop.set()
        credits.release()
