"""Reading a folder back: records and whole groups of a finished (or merged) folder, in manifest order.

With `routes=True` a record's `routed_experts` (a reference into its shard's routes sidecar) becomes the full
numpy array, shape (prompt + response - 1, layers, experts per token), read a blob at a time; with False the
reference stays (docs/routed-experts.md). Every shard is checked against its manifest entry: one that is not
there, not of its size, not whole groups to its end, not its count of groups or records, or holding a line that
is not a record, is one `OutputError` line naming the file: a folder is never read short without a word (its
sha256 is `agentroll validate`'s to check).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import orjson

from ..errors import OutputError, json_kind
from ..inputs import Problem
from ..record.group import Group
from ..record.schema import Sample
from .layout import is_zstd
from .manifest import Manifest, ShardEntry
from .routes import Sidecar
from .shards import Undecodable, read_lines, shard_groups

_SAMPLE_FIELDS = frozenset(f.name for f in fields(Sample))


@dataclass(frozen=True, slots=True)
class ShardFile:
    """A finished shard of a folder: its path, its routes sidecar's (None: its records have none), its entry."""

    path: Path
    routes: Path | None
    entry: ShardEntry


def shard_files(folder: str | os.PathLike[str], manifest: Manifest | None = None) -> list[ShardFile]:
    """The finished shards of a folder in manifest order (a merged folder's paths are relative to it), each
    checked to be there and of the size its entry says."""
    root = Path(folder)
    manifest = manifest or Manifest.load(root)
    found = [
        ShardFile(root / s.file, root / s.routes.file if s.routes is not None else None, s) for s in manifest.shards
    ]
    for shard in found:
        try:
            check_size(shard, shard.path.stat().st_size)
        except OSError as exc:
            raise missing(shard.path, exc) from exc
    return found


def shard_paths(folder: str | os.PathLike[str]) -> list[str]:
    """The finished shards of any folder, a merged one too (its shards may lie in other folders), in manifest
    order, each checked to be there and of its size: what `datasets.load_dataset("json", data_files=...)` takes.
    A shard being written is not among them: a finished folder (`complete`) is all of them."""
    return [str(shard.path) for shard in shard_files(folder)]


def missing(path: Path, exc: OSError) -> OutputError:
    """A listed file that cannot be read, in one line."""
    if isinstance(exc, FileNotFoundError):
        return OutputError(
            f"{path} is listed in its folder's manifest but is not there (moved away?): put it "
            "back, or rerun generate into that folder to make its groups again"
        )
    return OutputError(f"{path}: cannot read it ({exc.strerror or exc})")


def damaged(path: Path, what: str) -> OutputError:
    return OutputError(
        f"{path} is damaged: {what} (agentroll validate tells more); move it away and rerun generate into "
        "its folder to make its groups again"
    )


def check_size(shard: ShardFile, size: int) -> None:
    if size != shard.entry.bytes:
        raise damaged(shard.path, f"{size} bytes where its manifest says {shard.entry.bytes}")


def check_counts(shard: ShardFile, what: str, found: int) -> None:
    listed = getattr(shard.entry, what)
    if found != listed:
        raise damaged(shard.path, f"it holds {found} {what} where its manifest says {listed}")


def shard_records(shard: ShardFile) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each record of a finished shard with its line number. A shard that is missing, not the size or the
    record count its manifest entry says, or holding a line that is not a JSON record, is one `OutputError`
    line naming the file (and the line)."""
    count = 0
    try:
        with open(shard.path, "rb") as f:
            check_size(shard, os.fstat(f.fileno()).st_size)
            for number, line in read_lines(f, is_zstd(shard.path)):
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError as exc:
                    raise OutputError(f"{shard.path}:{number}: not a JSON record ({exc})") from None
                if not isinstance(record, dict):
                    raise OutputError(f"{shard.path}:{number}: {json_kind(record)}, not a record (a JSON object)")
                count += 1
                yield number, record
    except OSError as exc:
        raise missing(shard.path, exc) from exc
    except Undecodable as exc:
        raise damaged(shard.path, str(exc)) from None
    check_counts(shard, "records", count)


def shard_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise missing(path, exc) from exc


def read_records(path: str | os.PathLike[str], routes: bool = False, masks: bool = False) -> Iterator[dict[str, Any]]:
    """Every record of a folder as its JSONL dict, in manifest order; with `routes`, `routed_experts` as the full
    numpy array and `sampling_mask` as lists (see the module's docstring); with `masks`, the sampling masks only
    (the routes stay in the sidecar)."""
    for shard in shard_files(path):
        with Sidecar(shard.routes, shard.path) as sidecar:
            for _, record in shard_records(shard):
                if routes:
                    yield sidecar.resolve_or_fail([record])[0]
                elif masks and isinstance(record.get("sampling_mask"), dict):
                    yield sidecar.resolve_or_fail([{**record, "routed_experts": None}])[0] | {
                        "routed_experts": record.get("routed_experts")
                    }
                else:
                    yield record


def as_group(records: list[dict[str, Any]]) -> Group:
    """A group's records as an `agentroll.Group`. `problem.prompt` is the row's own prompt as given (the records'
    `problem`, schema 6; in an older folder, which did not store it, the first record's rendered prompt);
    `problem.content_hash` is the row's identity."""
    executions: list[list[Sample]] = []
    for record in records:
        sample = Sample(**{k: v for k, v in record.items() if k in _SAMPLE_FIELDS})
        if not executions or executions[-1][0].rollout_id != sample.rollout_id:
            executions.append([])
        executions[-1].append(sample)
    first = records[0]
    problem = Problem(
        id=str(first["problem_id"]),
        prompt=first["problem"] if first.get("problem") is not None else first.get("prompt", ""),
        label=first.get("label"),
        metadata=first.get("metadata") or {},
        line=0,
        source="<folder>",
        content_hash=str(first.get("problem_hash", "")),
    )
    return Group(problem, executions)


def stored_groups(
    path: str | os.PathLike[str], manifest: Manifest | None = None
) -> Iterator[tuple[list[dict[str, Any]], Sidecar]]:
    """Each whole group of a finished folder as its records (references as written), with its shard's sidecar
    (open while the shard is read) to resolve the routes of the groups one wants. A shard is checked against
    its manifest entry (size first, then its whole groups and records)."""
    for shard in shard_files(path, manifest):
        data = shard_bytes(shard.path)
        check_size(shard, len(data))
        read = groups = records = 0
        with Sidecar(shard.routes, shard.path) as sidecar:
            for end, found in shard_groups(data, is_zstd(shard.path)):
                read, groups, records = end, groups + 1, records + len(found)
                yield found, sidecar
        if read != len(data):
            raise damaged(shard.path, f"not whole groups after byte {read}")
        check_counts(shard, "groups", groups)
        check_counts(shard, "records", records)


def finished_groups(path: str | os.PathLike[str], routes: bool = False) -> Iterator[Group]:
    for records, sidecar in stored_groups(path):
        yield as_group(sidecar.resolve_or_fail(records) if routes else records)
