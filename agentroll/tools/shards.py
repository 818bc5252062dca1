"""One shard, for `validate`: read once (a compressed one frame by frame), every line through the record,
conversation, routes and execution checks, then its size, sha256, counts and keys file against the manifest."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from ..folder import raw as folder_files
from ..folder.layout import ZSTD, Layout
from ..systems.vocabulary import Vocabulary
from .conversations import Conversations
from .executions import Row, SystemChecks, check_structure
from .faults import Fault, ValidationReport
from .records import json_type, record_faults
from .sidecars import Routes
from .system import LEGACY, SystemInfo


def _check_keys(shard: Path, name: str, found: list[list[str]], faults: list[Fault]) -> None:
    """The keys file is what a resumed run believes the shard holds: it must list exactly its groups."""
    path = Layout(shard.parent).keys(shard.name)
    if not folder_files.keys_exist(shard):
        return  # not copied along (merge --copy, rsync of dot-folders): the writer rebuilds it from the shard
    try:
        listed = orjson.loads(folder_files.keys_bytes(shard))
    except (OSError, orjson.JSONDecodeError) as exc:
        faults.append(Fault("keys", f"{path.name} is unreadable ({exc}); a resume rebuilds it from the shard", name))
        return
    if listed != found:
        diff = next(
            (i for i, (a, b) in enumerate(zip(listed, found, strict=False)) if a != b), min(len(listed), len(found))
        )
        faults.append(
            Fault(
                "keys",
                f"{path.name} lists {len(listed)} groups, the shard holds {len(found)}; "
                f"they differ from group {diff + 1} on (resume trusts the keys file)",
                name,
            )
        )


def _hashed(f: BinaryIO, digest: Any) -> Iterator[bytes]:
    """A plain shard's lines, newline kept, hashed as they are read: a shard is read once, never held whole."""
    for raw in f:
        digest.update(raw)
        yield raw


def _zstd_lines(data: bytes, frames: set[int], add: Callable[[int | None, str, str], None]) -> Iterator[bytes]:
    """A compressed shard's lines, frame by frame (the writer closes one frame per group), noting in `frames`
    the line number each frame starts at. A frame that does not decompress (damaged, torn by a kill) is a fault
    at the line it would have started; nothing after it can be read."""
    import zstandard

    pos, line = 0, 1
    while pos < len(data):
        frames.add(line)
        frame = zstandard.ZstdDecompressor().decompressobj()
        try:
            block = frame.decompress(data[pos:])
        except zstandard.ZstdError as exc:
            add(line, "zstd", f"the frame at byte {pos} does not decompress ({exc}); the rest of the shard is lost")
            return
        if not frame.eof:
            add(line, "zstd", f"the frame at byte {pos} is incomplete (torn by a kill?); the rest of the shard is lost")
            return
        pos = len(data) - len(frame.unused_data)
        pieces = block.split(b"\n")
        for piece in pieces[:-1]:
            yield piece + b"\n"
        if pieces[-1]:
            yield pieces[-1]  # a frame that does not end its last line: reported as a torn line
        line += len(pieces) - 1 + bool(pieces[-1])
    frames.add(line)


def read_shard(
    folder: Path,
    entry: dict[str, Any],
    k_setting: int | None,
    seen: dict[str, str],
    report: ValidationReport,
    system: SystemInfo = LEGACY,
    vocabulary: Vocabulary | None = None,
    policies: tuple[str, ...] = (),
) -> None:
    """Check one shard of the manifest (`entry`); its faults go to `report`, by line, then the shard's own.
    `seen`: the problems of the shards before it (a problem twice is a duplicate); `policies`: a head-to-head
    run's names, in order."""
    name = str(entry["file"])
    path = folder / name
    shard_faults: list[Fault] = []

    def add(line: int | None, kind: str, message: str) -> None:
        shard_faults.append(Fault(kind, message, name, line))

    if not path.is_file():
        report.add(Fault("missing", f"{path} does not exist", name))
        return
    size = path.stat().st_size
    if size != entry["bytes"]:
        add(None, "bytes", f"{size} bytes where the manifest says {entry['bytes']}")
    digest = hashlib.sha256()
    rows: list[Row | None] = []
    checks = SystemChecks(vocabulary or Vocabulary(), add)
    frames: set[int] | None = None  # zstd: the line numbers at which a frame starts, and the one past the end
    with folder_files.open_shard(path) as f, Routes(folder, entry.get("routes"), add) as sidecar:
        if name.endswith(ZSTD):
            data = f.read()
            digest.update(data)
            frames = set()
            lines: Iterable[bytes] = _zstd_lines(data, frames, add)
        else:
            lines = _hashed(f, digest)
        conversations = Conversations(add)
        for number, raw in enumerate(lines, start=1):
            if not raw.endswith(b"\n"):
                add(number, "json", "the last line has no newline (torn by a crash?)")
            record, unreadable = None, "an empty line"
            if raw.strip():
                try:
                    record = orjson.loads(raw)
                    unreadable = f"{json_type(record)}, not a JSON object"
                except orjson.JSONDecodeError as exc:
                    unreadable = f"not JSON ({exc})"
            if not isinstance(record, dict):
                add(number, "json", unreadable)
                rows.append(None)
                conversations.unreadable()
                checks.record(number, None, False)
                continue
            faults = record_faults(record, system.stages)
            for kind, message in faults:
                add(number, kind, message)
            conversations.record(number, record)
            sidecar.record(number, record)
            checks.record(number, record, not any(kind == "schema" for kind, _ in faults))
            rows.append(Row.of(number, record))
        checks.finish()
        sidecar.finish(name, report.warnings)
    if digest.hexdigest() != entry["sha256"]:
        add(None, "sha256", f"sha256 {digest.hexdigest()} where the manifest says {entry['sha256']}")
    groups = check_structure(rows, k_setting, lambda line, kind, message: add(line, kind, message), system, policies)
    if frames is not None:  # frames hold whole groups: one each while written, all of them once finished
        for g, _ in groups:
            first, last = g[0][0].line, g[-1][-1].line
            if any(first < start <= last for start in frames):
                add(
                    first,
                    "zstd",
                    f"the group of problem {g[0][0].problem_id!r} (lines {first}-{last}) is split "
                    "across zstd frames (a reader stops there)",
                )
    records = sum(row is not None for row in rows)
    executions = sum(len(g) for g, _ in groups)
    for g, _ in groups:
        head = g[0][0]
        key = head.problem_id if isinstance(head.problem_id, str) else repr(head.problem_id)  # a list is no key
        if key in seen:
            add(head.line, "duplicate", f"problem {head.problem_id!r} is also at {seen[key]}")
        else:
            seen[key] = f"{name}:{head.line}"
    for what, counted in (("records", records), ("executions", executions), ("groups", len(groups))):
        if counted != entry[what]:
            add(None, "count", f"{counted} {what} where the manifest says {entry[what]}")
    _check_keys(path, name, [[str(g[0][0].problem_id), str(g[0][0].problem_hash)] for g, _ in groups], shard_faults)
    # by line, then the shard as a whole: a line fault says where, a size or sha256 mismatch only that
    shard_faults.sort(key=lambda fault: (fault.line is None, fault.line or 0))
    for fault in shard_faults:
        report.add(fault)
    report.records += records
    report.executions += executions
    report.groups += len(groups)
