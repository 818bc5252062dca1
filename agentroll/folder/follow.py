"""Following a live run, and durable reader positions (consumers).

`follow` tails a folder that a run is still writing: the shards its manifest lists (wherever they are: a merged
view points into other folders), the folder's own finished shards not listed yet, and its partial shard up to
its last whole group. It yields each group once as soon as it is committed, survives the writer being killed
and restarted (a recovered shard is read again and its groups already yielded are skipped), starts over when
the folder is overwritten (a new `folder_id`), and ends by itself once the manifest is final: the run is
complete, or the folder is a merged view (`agentroll merge`; nothing ever completes one that was merged with
`--allow-incomplete`: the follower reads the groups it lists and ends, and a new merge makes a new view). It
ends with `RunEnded` (naming the run's exit) once the run ended without completing by itself (exit 8, 4, 7...:
`last_run.exit`) and no process is writing the folder; a run stopped by a signal or killed is waited for. A
final folder is what its manifest lists (nothing else beside it is read). A listed shard is checked as the plain
reader checks it, as soon as it is read: its size, its routes sidecar, whole groups to its end, its group count;
damage raises one `OutputError` line.

A consumer (`read_groups(consumer=NAME)`) keeps its position in `.agentroll/consumers/NAME` (replaced
atomically): a group counts as consumed once the next one is asked for; a rerun of the reader starts after the
groups already consumed; a position of an earlier dataset in the folder (another `folder_id`) counts for none.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from ..errors import OutputError, RunEnded, UsageError
from ..record.group import Group
from . import lock
from .files import atomic_write
from .layout import MANIFEST, PARTIAL, Layout, is_zstd, routes_name, routes_path
from .manifest import RESUMED, Manifest, ShardEntry, run_exit
from .places import Place
from .reader import ShardFile, as_group, check_counts, check_size, damaged, finished_groups, missing
from .routes import RoutesUnavailable, Sidecar
from .shards import placed_groups


def read_groups(
    path: str | os.PathLike[str],
    follow: bool = False,
    poll_s: float = 0.5,
    timeout_s: float | None = None,
    consumer: str | None = None,
    routes: bool = False,
) -> Iterator[Group]:
    """Whole groups of a folder in manifest order; with `follow`, of a live run as it commits them (see the
    module's docstring). `timeout_s` bounds how long a follower waits without the run completing
    (`TimeoutError`); None waits as long as the run takes, and a run that ended for good without completing
    raises `RunEnded` (its `exit_code` is the run's). `routes`: samples' `routed_experts` as arrays.

    `consumer` names a durable position: `generate --consumer NAME --max-ahead G` stops taking prompts while more
    than G groups are unconsumed. A consumer that dies is given its last group again: at least once, never lost."""
    folder = Path(path)
    if folder.is_file():  # a follower would wait for a run that can never write here
        raise OutputError(f"{folder} is a file, not a folder: give the output folder that holds {MANIFEST}")
    if follow:
        groups = (
            (identity, as_group(records))
            for identity, _, records, fresh in _follow(folder, poll_s, timeout_s, routes)
            if fresh
        )
    else:
        manifest = Manifest.load(folder)
        groups = ((manifest.folder_id, g) for g in finished_groups(folder, routes))
    if consumer is None:
        for _, group in groups:
            yield group
        return
    try:
        where = Layout(folder).consumer(consumer)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    yield from _consume(groups, where)


def placed(
    path: str | os.PathLike[str], follow: bool = True, poll_s: float = 1.0, stop: threading.Event | None = None
) -> Iterator[Found]:
    """Each whole group with its `Place`, as `read_groups(follow=True)` reads them: (folder_id, place, records,
    fresh). A group read again from a new place (its shard finished and renamed, or recovered) comes again, not
    fresh; a new folder_id means the folder was overwritten: everything before it is gone. Without `follow`, one
    pass over what is there now (a live run's partial shard too). `stop` ends the wait between passes."""
    return _follow(Path(path), poll_s, None, False, stop, once=not follow)


def consumed(folder: Path, name: str, folder_id: str | None = None) -> int:
    """How many groups the consumer has taken, in commit order (0 before it starts, or for another dataset)."""
    try:
        position = orjson.loads(Layout(folder).consumer(name).read_bytes())
        if folder_id is None:
            folder_id = _identity(folder)
        if position.get("folder_id", "") != (folder_id or ""):
            return 0
        return int(position["groups"])
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return 0


def _identity(folder: Path) -> str | None:
    try:
        return Manifest.load(folder).folder_id
    except OutputError:
        return None


def _consume(groups: Iterator[tuple[str, Group]], path: Path) -> Iterator[Group]:
    folder = path.parents[2]
    identity: str | None = None
    count = already = 0
    for folder_id, group in groups:
        if folder_id != identity:  # a first group, or the folder was overwritten: positions start over
            identity, count = folder_id, 0
            already = consumed(folder, path.name, folder_id)
        count += 1
        if count <= already:
            continue
        yield group
        path.parent.mkdir(parents=True, exist_ok=True)  # asked for the next one: this one is done
        atomic_write(path, orjson.dumps({"groups": count, "problem_id": group.problem_id, "folder_id": folder_id}))


def _manifest(folder: Path, failures: list[OutputError]) -> Manifest | None:
    """The manifest now, or None while it is not there; a manifest that stays unreadable for two passes
    raises (one pass may meet it being replaced on storage without atomic renames)."""
    if not Layout(folder).manifest.exists():
        return None
    try:
        manifest = Manifest.load(folder)
    except OutputError as exc:
        failures.append(exc)
        if len(failures) > 1:
            raise
        return None
    failures.clear()
    return manifest


def _files(folder: Path, manifest: Manifest | None, final: bool) -> list[tuple[Path, ShardEntry | None]]:
    """Listed shards in manifest order with their entries; unless the manifest is final, then the folder's own
    finished and partial ones not listed yet (a finished one before its partial namesake)."""
    listed: list[tuple[Path, ShardEntry | None]] = [(folder / s.file, s) for s in manifest.shards] if manifest else []
    if final:
        return listed  # a finished folder is what its manifest lists, whatever else lies beside it
    known = {os.path.realpath(p) for p, _ in listed}
    own = [path for _, _, path in Layout(folder).entries() if os.path.realpath(path) not in known]
    return listed + [(path, None) for path in own]


def _live_routes(shard: Path, records: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """A live shard's group with its routes, or None when they cannot be read yet. A partial shard's sidecar is
    renamed to its final name just before the shard is."""
    candidates = [routes_path(shard)]
    if shard.name.endswith(PARTIAL):
        candidates.append(shard.with_name(routes_name(shard.name.removesuffix(PARTIAL))))
    for path in candidates:
        with Sidecar(path, shard) as sidecar:
            try:
                return sidecar.resolve(records)
            except RoutesUnavailable:
                continue
    return None


class _Replaced(Exception):
    """A listed file changed under the follower because the folder was overwritten: read it again."""


def _damage(folder: Path, identity: str, error: OutputError) -> Exception:
    """A listed shard that is not what its entry says: damage, unless the folder was overwritten since the
    manifest was read (its files are then another dataset's, named alike)."""
    try:
        same = Manifest.load(folder).folder_id == identity
    except OutputError:
        same = False
    return error if same else _Replaced()


def _listed_fault(folder: Path, shard: Path, entry: ShardEntry, routes: bool) -> OutputError | None:
    """What is wrong with a finished shard (and, when routes are read, its sidecar) before it is read."""
    try:
        check_size(ShardFile(shard, None, entry), shard.stat().st_size)
    except OSError as exc:
        return missing(shard, exc)
    except OutputError as exc:
        return exc
    if routes and entry.routes is not None:
        side = folder / entry.routes.file
        size = side.stat().st_size if side.exists() else None
        if size != entry.routes.bytes:
            have = "is missing" if size is None else f"holds {size} bytes where the manifest says {entry.routes.bytes}"
            return OutputError(f"{side} (the routes sidecar of {shard.name}) {have}")
    return None


Found = tuple[str, Place, list[dict[str, Any]], bool]  # (folder_id, where, records, first time seen)


def _follow(
    folder: Path,
    poll_s: float,
    timeout_s: float | None,
    routes: bool,
    stop: threading.Event | None = None,
    once: bool = False,
) -> Iterator[Found]:
    """Each whole group with its place, as it is committed; a group read again (its shard renamed, recovered)
    comes again with its new place, marked not fresh. `once`: one pass over what is there now. `stop`: set, it
    ends the wait between passes."""
    seen: set[str] = set()
    offsets: dict[str, int] = {}  # real path -> bytes of whole groups already read
    counts: dict[str, int] = {}  # real path -> whole groups already read
    lines: dict[str, int] = {}  # real path -> records (lines) of those groups
    identity = ""
    failures: list[OutputError] = []
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        manifest = _manifest(folder, failures)  # read before the pass: a complete one comes after every shard
        if manifest is not None and manifest.folder_id != identity:
            if identity:  # overwritten since: another dataset in the same place
                seen.clear()
                offsets.clear()
                counts.clear()
                lines.clear()
            identity = manifest.folder_id
        final = manifest is not None and (manifest.complete or manifest.merged_from is not None)
        try:
            for shard, entry in _files(folder, manifest, final):
                key = os.path.realpath(shard)
                start = offsets.get(key, 0)
                if entry is not None:
                    if start == entry.bytes:
                        continue  # read whole already
                    fault = _listed_fault(folder, shard, entry, routes)
                    if fault is not None:
                        raise _damage(folder, identity, fault)
                try:
                    with open(shard, "rb") as f:
                        f.seek(start)
                        data = f.read()
                except FileNotFoundError:  # renamed (finished) or recovered since the listing: next pass
                    if entry is not None:
                        raise _damage(folder, identity, missing(shard, FileNotFoundError())) from None
                    continue
                sidecar = Sidecar(folder / entry.routes.file if entry and entry.routes else None, shard)
                with sidecar:
                    for span, records in placed_groups(data, is_zstd(shard)):
                        pid = str(records[0]["problem_id"])
                        if pid not in seen and routes:
                            resolved = sidecar.resolve_or_fail(records) if entry else _live_routes(shard, records)
                            if resolved is None:
                                break  # its sidecar is being renamed: the next pass reads the group again
                            records = resolved
                        line = lines.get(key, 0)
                        place = Place(
                            shard,
                            pid,
                            line + 1,
                            len(records),
                            start + span.frame_start,
                            start + span.frame_end,
                            span.start,
                            span.end,
                            is_zstd(shard),
                        )
                        offsets[key], counts[key] = start + span.frame_end, counts.get(key, 0) + 1
                        lines[key] = line + len(records)
                        fresh = pid not in seen  # a shard renamed or recovered is read again from its start
                        seen.add(pid)
                        yield identity, place, records, fresh
        except _Replaced:
            final = False
        if final:
            assert manifest is not None
            _check_whole(folder, manifest, offsets, counts)
            return
        if once:
            return  # what is there now, a run that ended without completing or not
        if manifest is not None:
            _ended_for_good(folder, manifest)
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{folder}: the run did not complete within {timeout_s:g}s")
        if stop is None:
            time.sleep(poll_s)
        elif stop.wait(poll_s):
            return


def _ended_for_good(folder: Path, manifest: Manifest) -> None:
    """`RunEnded` when the run that wrote the folder ended by itself without completing (it recorded its exit:
    8, 4, 7...) and no process holds the folder now; everything its manifest lists has been read by then (the
    manifest was read before the pass). A run stopped by a signal, or killed (it recorded nothing), is waited
    for: it is resumed. A manifest replaced since (a rerun that began, and maybe ended) is looked at again."""
    ended = run_exit(manifest.last_run)
    if ended is None or ended[0] == 0 or ended[0] in RESUMED or lock.held(Layout(folder).lock):
        return
    try:
        now = Manifest.load(folder)
    except OutputError:
        return
    if now.folder_id != manifest.folder_id or now.last_run.get("finished_at") != manifest.last_run.get("finished_at"):
        return
    code, reason = ended
    raise RunEnded(
        f"{folder}: the run writing it ended with exit {code}{f' ({reason})' if reason else ''} before completing, "
        "and no process is writing it now: run the same generate command again to finish it, then follow again",
        code,
    )


def _check_whole(folder: Path, manifest: Manifest, offsets: dict[str, int], counts: dict[str, int]) -> None:
    """A finished folder read to its end: every listed shard whole groups to the size and count its entry says,
    as the plain reader demands."""
    for entry in manifest.shards:
        path = folder / entry.file
        key = os.path.realpath(path)
        read = offsets.get(key, 0)
        if read != entry.bytes:
            raise damaged(path, f"not whole groups after byte {read}")
        check_counts(ShardFile(path, None, entry), "groups", counts.get(key, 0))
