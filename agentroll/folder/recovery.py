"""Making a folder whole again after any stop: what a kill -9, a full disk or a power cut can leave.

A group is on disk whole or not at all: recovery keeps a partial shard's whole groups, drops a torn or short
one at its tail (it is redone), cuts its routes sidecar to what the kept records reference, and finishes the
shard. A finished shard missing from the manifest (the run died between the rename and the manifest) is
adopted after a full scan. A listed shard's keys file that is damaged is rebuilt from the shard (keys are
derived data). Temporaries of an interrupted atomic replace are removed, never taken for data.

Finishing a shard (also the writer's normal path): a zstd shard's frames are joined into one first, its keys
file is written, its sidecar renamed, and only then the shard itself takes its final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson

from ..errors import OutputError
from .files import atomic_write, file_sha256, fsync_dir, truncate
from .keys import read_keys, write_keys
from .layout import TMP, Layout, is_zstd, parse_shard, routes_path
from .manifest import Manifest, RoutesEntry, ShardEntry
from .shards import GroupKey, join_frames, scan_groups, scan_routed, torn_frame

log = logging.getLogger("agentroll")


@dataclass(slots=True)
class Recovered:
    shards: list[ShardEntry] = field(default_factory=list)
    done: dict[str, str] = field(default_factory=dict)  # problem id -> content hash, committed or filtered
    filtered_groups: int = 0


def rebuild_keys(layout: Layout, path: Path, entry: ShardEntry) -> list[GroupKey]:
    """The keys of a listed shard read from the shard itself (its keys file was damaged), written again; a shard
    that is not whole groups of its entry's count is one `OutputError` line."""
    data = path.read_bytes()
    kept, _, _, keys = scan_groups(data, is_zstd(path))
    if kept != len(data) or len(keys) != entry.groups:
        raise OutputError(
            f"{path} is damaged (whole groups up to byte {kept} of {len(data)}, {len(keys)} of the "
            f"{entry.groups} groups its manifest lists) and its keys file too; move it away and rerun "
            "(its groups are generated again)"
        )
    write_keys(layout, path.name, keys)
    return keys


def finish_file(
    layout: Layout,
    partial: Path,
    final: Path,
    records: int,
    executions: int,
    keys: list[GroupKey],
    sha256: str,
    routes: tuple[Path, str] | None = None,
) -> ShardEntry:
    """Give a partial shard its final name (see the module's docstring) and return its manifest entry."""
    if is_zstd(final):  # one frame per group while written, one frame once finished (shards.py says why)
        joined = join_frames(partial.read_bytes())
        atomic_write(partial, joined)  # still the partial: a crash here leaves one shard, recoverable
        sha256 = hashlib.sha256(joined).hexdigest()
    write_keys(layout, final.name, keys)  # keys first: a shard on disk always has its keys after a crash
    side = routes_path(final)
    if routes is not None:
        os.replace(routes[0], side)  # before the shard: a partial shard finds it there (recover_partial)
    else:
        with contextlib.suppress(FileNotFoundError):
            side.unlink()  # a stale sidecar of a shard that was moved away
    os.replace(partial, final)
    fsync_dir(layout.root)
    entry = ShardEntry(
        final.name, records, executions, len(keys), final.stat().st_size, sha256, finished_at=round(time.time(), 3)
    )
    if routes is not None:
        entry.routes = RoutesEntry(side.name, side.stat().st_size, routes[1])
    return entry


def read_filtered(layout: Layout, into: Recovered) -> None:
    if not layout.filtered.exists():
        return
    for line in layout.filtered.read_bytes().splitlines():
        try:
            entry = orjson.loads(line)
            into.done[str(entry["problem_id"])] = str(entry["problem_hash"])
        except (orjson.JSONDecodeError, KeyError, TypeError):
            continue  # a line torn by a crash: that group is simply generated again
        into.filtered_groups += 1


def recover(layout: Layout, manifest: Manifest | None) -> Recovered:
    """The folder's finished shards and done problems, every partial shard finished, strays removed."""
    out = Recovered()
    for stray in layout.strays():
        stray.unlink()
    for stray in layout.state.glob(f"*{TMP}"):
        stray.unlink()
    read_filtered(layout, out)
    known = {s.file: s for s in (manifest.shards if manifest is not None else [])}
    layout.keys_dir.mkdir(exist_ok=True)
    for stray in layout.keys_dir.glob(f"*{TMP}"):
        stray.unlink()
    shards = layout.finished()
    for stale in set(layout.keys_dir.glob("*.keys")) - {layout.keys(p.name) for p in shards}:
        stale.unlink()  # its shard was moved away: those groups are redone
    for path in shards:
        entry = known.get(path.name)
        keys_path = layout.keys(path.name)
        if entry is None or not keys_path.exists():
            entry = adopt(layout, path, out)  # finished but not yet in the manifest when the run died
        else:
            size = path.stat().st_size
            if size != entry.bytes:
                raise OutputError(
                    f"{path} is damaged: {size} bytes where the manifest says {entry.bytes}; "
                    "move it away and rerun (its groups are generated again)"
                )
            check_routes(layout, path, entry)
            keys = read_keys(keys_path)
            if keys is None or len(keys) != entry.groups:
                log.warning("%s is damaged: rebuilt from %s", keys_path, path.name)
                keys = rebuild_keys(layout, path, entry)
            out.done.update(keys)
        out.shards.append(entry)
    for partial in layout.partials():
        recover_partial(layout, partial, out)
    for stray in layout.stray_sidecars():
        stray.unlink()  # the sidecar of a partial shard that held no whole group: nothing references it
    return out


def next_index(shards: list[ShardEntry]) -> int:
    used = [found[0] for s in shards if (found := parse_shard(Path(s.file).name)) is not None]
    return max(used, default=-1) + 1


def recover_partial(layout: Layout, partial: Path, out: Recovered) -> None:
    """Keep the partial shard's whole groups (whose routes are on disk), cut its sidecar to what they
    reference, and finish it as the next shard of `out`; removed when it held no whole group."""
    data = partial.read_bytes()
    final = layout.shard(next_index(out.shards), "zstd" if is_zstd(partial) else "none")
    side = routes_path(partial)
    if not side.exists():
        side = routes_path(final)  # renamed before its shard when the run died (finish_file)
    side_size = side.stat().st_size if side.exists() else 0
    kept, records, executions, keys, needed = scan_routed(data, is_zstd(partial), side_size)
    if is_zstd(partial):
        if not torn_frame(data[kept:]):  # more than the one frame a stop tears: damage
            log.warning(
                "%s: %d bytes after its last whole group (byte %d on) are dropped and their groups generated again "
                "(damage there, or a group cut while it was written)",
                partial,
                len(data) - kept,
                kept,
            )
    elif lines := data[kept:].count(b"\n"):  # whole lines past the last whole group: not only the line a stop tore
        log.warning(
            "%s: %d whole line(s) after its last whole group (line %d on) are dropped and their groups generated "
            "again (damage there, or a group cut while it was written)",
            partial,
            lines,
            data[:kept].count(b"\n") + 1,
        )
    if needed == 0 and side.exists():
        side.unlink()
    if records == 0:
        partial.unlink()
        return
    for path, size in ((partial, kept), (side, needed)):
        if size:
            truncate(path, size)
    routes = (side, file_sha256(side)) if needed else None
    out.shards.append(
        finish_file(layout, partial, final, records, executions, keys, hashlib.sha256(data[:kept]).hexdigest(), routes)
    )
    out.done.update(keys)


def check_routes(layout: Layout, path: Path, entry: ShardEntry) -> None:
    if entry.routes is None:
        return
    side = layout.root / entry.routes.file
    size = side.stat().st_size if side.exists() else None
    if size != entry.routes.bytes:
        have = "missing" if size is None else f"{size} bytes"
        raise OutputError(
            f"{side} (routes of {path.name}) is damaged: {have} where the manifest says "
            f"{entry.routes.bytes}; move both away and rerun (their groups are generated again)"
        )


def adopt(layout: Layout, path: Path, out: Recovered) -> ShardEntry:
    data = path.read_bytes()
    side = routes_path(path)
    side_size = side.stat().st_size if side.exists() else 0
    kept, records, executions, keys, needed = scan_routed(data, is_zstd(path), side_size)
    if kept != len(data):
        raise OutputError(
            f"{path} is damaged after byte {kept} (not whole groups, or routes past the end of "
            f"{side.name}); move it away and rerun (its groups are generated again)"
        )
    write_keys(layout, path.name, keys)
    out.done.update(keys)
    entry = ShardEntry(path.name, records, executions, len(keys), len(data), hashlib.sha256(data).hexdigest())
    if needed:
        entry.routes = RoutesEntry(side.name, side_size, file_sha256(side))
    return entry
