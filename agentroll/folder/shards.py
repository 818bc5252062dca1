"""Shard files: the whole groups in their bytes, plain JSONL or zstd (their names are `layout`'s).

A zstd shard being written holds one frame per group: the writer appends a group in one write, a torn frame at
the tail after a kill is cut off by recovery like a torn line, and a reader following a live run decodes every
whole frame. When the shard is finished its frames are joined into one (`join_frames`), once, before it takes
its final name: `datasets` (through fsspec) reads a zstd file a frame at a time and types its columns from the
first piece it reads, so a first group without, say, a selector would make a later one fail to load.

A shard whose records carry routed experts has a routes sidecar beside it (`layout.routes_name`; `routes`),
never compressed; a group's blobs are written to it before the group's records.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

import orjson

from . import masks, routes

GroupKey = tuple[str, str]  # (problem id, content hash)


class Undecodable(Exception):
    """A finished zstd shard whose data does not decompress."""


def encode(block: bytes, compression: str) -> bytes:
    """A group's JSONL bytes as they go on disk: as they are, or one checksummed zstd frame."""
    if compression != "zstd":
        return block
    import zstandard

    return zstandard.ZstdCompressor(level=3, write_checksum=True).compress(block)


def shard_groups(data: bytes, compressed: bool) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """The whole groups at the start of a shard's (file) bytes: (file offset just past the group, its records)."""
    for span, records in placed_groups(data, compressed):
        yield span.frame_end, records


@dataclass(frozen=True, slots=True)
class Span:
    """Where a group lies in a shard's bytes: `frame_start`..`frame_end`, the bytes to read (the group's own for a
    plain shard; the zstd frame that holds it otherwise), and `start`..`end`, the group's text within them (once
    decompressed)."""

    frame_start: int
    frame_end: int
    start: int
    end: int


def placed_groups(data: bytes, compressed: bool) -> Iterator[tuple[Span, list[dict[str, Any]]]]:
    """`shard_groups` with each group's `Span` in `data` (the viewer reads a group back from it)."""
    if not compressed:
        start = 0
        for end, records in group_blocks(data):
            yield Span(start, end, 0, end - start), records
            start = end
        return
    import zstandard

    decompressor = zstandard.ZstdDecompressor()
    pos = 0
    while pos < len(data):
        frame = decompressor.decompressobj()
        try:
            block = frame.decompress(data[pos:])
        except zstandard.ZstdError:
            return  # a damaged frame: nothing from here on is whole
        if not frame.eof:
            return  # a frame still being written, or torn by a kill
        end = len(data) - len(frame.unused_data)
        groups = list(group_blocks(block))
        if not groups or groups[-1][0] != len(block):
            return  # a frame holds whole groups (one while written, all once finished), or it is damaged
        inner = 0
        for stop, records in groups:
            yield Span(pos, end, inner, stop), records
            inner = stop
        pos = end


def torn_frame(tail: bytes) -> bool:
    """Is what follows a zstd shard's last whole group nothing, or the start of one frame a stop cut short (as
    opposed to a damaged frame, or whole frames past it)?"""
    if not tail:
        return True
    import zstandard

    frame = zstandard.ZstdDecompressor().decompressobj()
    try:
        frame.decompress(tail)
    except zstandard.ZstdError:
        return False
    return not frame.eof


def join_frames(data: bytes) -> bytes:
    """A finished shard's group frames as one frame (see the module's docstring)."""
    import zstandard

    with zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True) as reader:
        plain = reader.read()
    return encode(plain, "zstd")


def read_lines(f: BinaryIO, compressed: bool) -> Iterator[tuple[int, bytes]]:
    """The non-blank JSONL lines of an open shard file with their 1-based line numbers, decompressing a zstd one."""
    if not compressed:
        yield from ((number, line) for number, line in enumerate(f, start=1) if line.strip())
        return
    import zstandard

    with zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True, closefd=False) as reader:
        pending, number = b"", 0
        while True:
            try:
                chunk = reader.read(1 << 20)
            except zstandard.ZstdError as exc:
                raise Undecodable(f"its zstd data does not decompress after line {number} ({exc})") from None
            if not chunk:
                break
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                number += 1
                if line.strip():
                    yield number, line
        if pending.strip():
            yield number + 1, pending


def group_blocks(data: bytes) -> Iterator[tuple[int, list[dict[str, Any]]]]:
    """The whole groups at the start of a shard's bytes, in order: (byte offset just past the group, its records).

    A group is `group_size` executions of one problem, each `rollout_size` parseable records of one rollout;
    it stops at the first torn or short group (the one being written when the process died, or being written
    now, for a reader that follows a live run).
    """
    lines = data.split(b"\n")
    complete = len(lines) - 1  # the last element follows the final newline: empty, or a torn line
    i = pos = 0
    while i < complete:
        try:
            first = orjson.loads(lines[i])
            group_size, pid = int(first["group_size"]), str(first["problem_id"])
            j, records, blocks = i, [], 0
            while blocks < group_size:
                head = orjson.loads(lines[j])
                size = int(head["rollout_size"])
                if size < 1 or j + size > complete:
                    return
                block = [head] + [orjson.loads(x) for x in lines[j + 1 : j + size]]
                if any(r.get("rollout_id") != head["rollout_id"] or str(r.get("problem_id")) != pid for r in block):
                    return
                records += block
                j, blocks = j + size, blocks + 1
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, IndexError):
            return
        pos += sum(len(x) + 1 for x in lines[i:j])
        i = j
        yield pos, records


def _executions(records: list[dict[str, Any]]) -> int:
    return len({r["rollout_id"] for r in records})


def scan_groups(data: bytes, compressed: bool = False) -> tuple[int, int, int, list[GroupKey]]:
    """Whole groups at the start of a shard's bytes: (bytes kept, records, executions, group keys)."""
    kept = records = executions = 0
    keys: list[GroupKey] = []
    for end, group in shard_groups(data, compressed):
        kept = end
        records += len(group)
        executions += _executions(group)
        keys.append((str(group[0]["problem_id"]), str(group[0].get("problem_hash", ""))))
    return kept, records, executions, keys


def scan_routed(data: bytes, compressed: bool, routes_bytes: int) -> tuple[int, int, int, list[GroupKey], int]:
    """`scan_groups` that also stops at the first group with a routes reference that is malformed or reaches past
    `routes_bytes` (the sidecar's size); the last element is the largest sidecar end the kept groups reference."""
    kept = records = executions = needed = 0
    keys: list[GroupKey] = []
    for end, group in shard_groups(data, compressed):
        try:
            need = max(
                (routes.end(r["routed_experts"]) for r in group if r.get("routed_experts") is not None), default=0
            )
            need = max(need, max((masks.end(r["sampling_mask"]) for r in group if r.get("sampling_mask")), default=0))
        except ValueError:
            break
        if need > routes_bytes:
            break
        kept, needed = end, max(needed, need)
        records += len(group)
        executions += _executions(group)
        keys.append((str(group[0]["problem_id"]), str(group[0].get("problem_hash", ""))))
    return kept, records, executions, keys, needed
