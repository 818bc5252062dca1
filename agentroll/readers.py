"""Reading an output folder back: records, whole groups, and a live run followed as it commits.

`read_records` and `read_groups` read a finished folder, or a merged one, in manifest order. With `follow=True`,
`read_groups` tails a folder that a run is still writing: it reads finished shards and the partial one up to
its last whole group, yields each group once as soon as it is committed, survives the writer being killed and
restarted (a recovered shard is re-read and its groups already yielded are skipped), and ends by itself when
the manifest says the run is complete.

With `routes=True` a record's `routed_experts` (a reference into its shard's routes sidecar) becomes the full
numpy array, shape (prompt + response - 1, layers, experts per token), read a blob at a time; with False the
reference stays (docs/routed-experts.md).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import orjson

from . import routes as _routes
from .errors import OutputError, UsageError
from .group import Group
from .inputs import Problem
from .schema import Sample
from .shards import PARTIAL, SHARD_PREFIX, is_zstd, read_lines, routes_name, routes_path, shard_groups
from .writer import MANIFEST, STATE_DIR

_SAMPLE_FIELDS = frozenset(f.name for f in fields(Sample))
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_INDEX = re.compile(rf"^{re.escape(SHARD_PREFIX)}(\d+)\.jsonl(?:\.zst)?(?:{re.escape(PARTIAL)})?$")


def load_manifest(folder: Path) -> dict[str, Any]:
    """A folder's manifest, or one `OutputError` line saying why it cannot be read."""
    path = folder / MANIFEST
    try:
        manifest = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise OutputError(f"{path}: not a readable agentroll manifest ({exc})") from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("shards"), list):
        raise OutputError(f"{path}: not an agentroll manifest")
    return manifest


def shard_paths(path: str | os.PathLike[str]) -> list[Path]:
    """The finished shards of a folder (or a merged folder, whose shard paths are relative to it), in order."""
    return [shard for shard, _ in shard_files(path)]


def shard_files(path: str | os.PathLike[str]) -> list[tuple[Path, Path | None]]:
    """The finished shards of a folder in order, each with its routes sidecar (None: its records have none)."""
    folder = Path(path)
    out = []
    for shard in load_manifest(folder)["shards"]:
        side = shard.get("routes")
        out.append((folder / shard["file"], folder / side["file"] if isinstance(side, dict) else None))
    return out


class RoutesUnavailable(OSError):
    """A reference reaches past the end of the sidecar (or the sidecar is not there)."""


class Sidecar:
    """A shard's routes sidecar (`path` None: the shard has none), read a blob at a time; `resolve` gives
    records with their references replaced by arrays. Close it, or use it as a context manager."""

    def __init__(self, path: Path | None, shard: Path) -> None:
        self.path, self.shard = path, shard
        self._fd: int | None = None
        self._prompts: dict[_routes.Span, Any] = {}

    def __enter__(self) -> Sidecar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self, offset: int, nbytes: int) -> bytes:
        if self.path is None:
            raise RoutesUnavailable(f"{self.shard} has routes references, but its manifest entry lists no sidecar")
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                raise RoutesUnavailable(f"{self.path} (the routes of {self.shard.name}) does not exist") from None
        data = os.pread(self._fd, nbytes, offset)
        if len(data) != nbytes:
            raise RoutesUnavailable(f"{self.path}: a reference to bytes {offset}..{offset + nbytes} reaches past "
                                    f"its end")
        return data

    def resolve(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The records, those with routes as copies holding the full array. `RoutesUnavailable` when a blob
        is not (yet) there, `OutputError` when one is damaged."""
        out = []
        for record in records:
            ref = record.get("routed_experts")
            if ref is not None and not isinstance(ref, dict):
                raise OutputError(f"{self.shard}: routed_experts of problem {record.get('problem_id')!r} is not a "
                                  "sidecar reference")
            if ref is not None:
                try:
                    record = {**record, "routed_experts": _routes.load(ref, self.read, self._prompts)}
                except ValueError as exc:
                    raise OutputError(f"{self.path}: the routes of problem {record.get('problem_id')!r}, rollout "
                                      f"{record.get('rollout_id')}: {exc}") from exc
            out.append(record)
        return out


def _resolve(sidecar: Sidecar, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    try:
        return sidecar.resolve(records)
    except RoutesUnavailable as exc:
        raise OutputError(str(exc)) from exc


def read_records(path: str | os.PathLike[str], routes: bool = False) -> Iterator[dict[str, Any]]:
    """Every record of a folder as its JSONL dict, in manifest order; with `routes`, `routed_experts` as the full
    numpy array (see the module's docstring)."""
    for shard, side in shard_files(path):
        with Sidecar(side, shard) as sidecar:
            for line in read_lines(shard):
                record = orjson.loads(line)
                yield _resolve(sidecar, [record])[0] if routes else record


def as_group(records: list[dict[str, Any]]) -> Group:
    """A group's records as an `agentroll.Group`. `problem.prompt` is the solver prompt as rendered (the row's
    own prompt is not stored); `problem.content_hash` is the row's identity."""
    executions: list[list[Sample]] = []
    for record in records:
        sample = Sample(**{k: v for k, v in record.items() if k in _SAMPLE_FIELDS})
        if not executions or executions[-1][0].rollout_id != sample.rollout_id:
            executions.append([])
        executions[-1].append(sample)
    first = records[0]
    problem = Problem(id=str(first["problem_id"]), prompt=first.get("prompt", ""), label=first.get("label"),
                      metadata=first.get("metadata") or {}, line=0, source="<folder>",
                      content_hash=str(first.get("problem_hash", "")))
    return Group(problem, executions)


def read_groups(path: str | os.PathLike[str], follow: bool = False, poll_s: float = 0.5,
                timeout_s: float | None = None, consumer: str | None = None, routes: bool = False) -> Iterator[Group]:
    """Whole groups of a folder in manifest order; with `follow`, of a live run as it commits them (see the
    module's docstring). `timeout_s` bounds how long a follower waits without the run completing
    (`TimeoutError`); None waits as long as the run takes. `routes`: samples' `routed_experts` as arrays.

    `consumer` names a durable position (`.agentroll/consumers/NAME`, replaced atomically): a group counts as
    consumed once the next one is asked for, the reader starts after the groups already consumed, and
    `generate --consumer NAME --max-ahead G` stops taking prompts while more than G groups are unconsumed. A
    consumer that dies is given its last group again: at least once, never lost."""
    if consumer is not None:
        yield from _consume(read_groups(path, follow, poll_s, timeout_s, routes=routes), Path(path), consumer)
        return
    if not follow:
        for records, sidecar in stored_groups(path):
            yield as_group(_resolve(sidecar, records) if routes else records)
        return
    yield from _follow(Path(path), poll_s, timeout_s, routes)


def stored_groups(path: str | os.PathLike[str]) -> Iterator[tuple[list[dict[str, Any]], Sidecar]]:
    """Each whole group of a finished folder as its records (references as written), with its shard's sidecar
    (open while the shard is read) to resolve the routes of the groups one wants."""
    for shard, side in shard_files(path):
        data = shard.read_bytes()
        read = 0
        with Sidecar(side, shard) as sidecar:
            for end, records in shard_groups(data, is_zstd(shard)):
                read = end
                yield records, sidecar
        if read != len(data):
            raise OutputError(f"{shard} is damaged after byte {read} (not whole groups)")


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


def _follow(folder: Path, poll_s: float, timeout_s: float | None, routes: bool = False) -> Iterator[Group]:
    seen: set[str] = set()
    offsets: dict[str, int] = {}  # file name -> bytes of whole groups already read
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        complete = _is_complete(folder)  # read before the pass: a complete manifest is written after every shard
        for shard in _live_shards(folder):
            try:
                with open(shard, "rb") as f:
                    f.seek(offsets.get(shard.name, 0))
                    data = f.read()
            except FileNotFoundError:  # renamed (finished) or recovered since the listing: next pass
                continue
            start = offsets.get(shard.name, 0)
            for end, records in shard_groups(data, is_zstd(shard)):
                pid = str(records[0]["problem_id"])
                if pid not in seen and routes:
                    resolved = _live_routes(shard, records)
                    if resolved is None:
                        break  # its sidecar is being renamed: the next pass reads the group again
                    records = resolved
                offsets[shard.name] = start + end
                if pid not in seen:  # a shard renamed or recovered is read again from its start
                    seen.add(pid)
                    yield as_group(records)
        if complete:
            return
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{folder}: the run did not complete within {timeout_s:g}s")
        time.sleep(poll_s)


def consumer_path(folder: Path, name: str) -> Path:
    if not _NAME.match(name):
        raise UsageError(f"consumer name {name!r}: use letters, digits, '.', '_' and '-'")
    return folder / STATE_DIR / "consumers" / name


def consumed(folder: Path, name: str) -> int:
    """How many groups the consumer has taken, in commit order (0 before it starts)."""
    try:
        return int(orjson.loads(consumer_path(folder, name).read_bytes())["groups"])
    except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return 0


def _consume(groups: Iterator[Group], folder: Path, name: str) -> Iterator[Group]:
    path = consumer_path(folder, name)
    already = consumed(folder, name)
    for count, group in enumerate(groups, start=1):
        if count <= already:
            continue
        yield group
        path.parent.mkdir(parents=True, exist_ok=True)  # asked for the next one: this one is done
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(orjson.dumps({"groups": count, "problem_id": group.problem_id}))
        os.replace(tmp, path)


def _is_complete(folder: Path) -> bool:
    try:
        return bool(orjson.loads((folder / MANIFEST).read_bytes()).get("complete"))
    except (OSError, orjson.JSONDecodeError, AttributeError):
        return False  # not written yet, or replaced this instant: ask again next pass


def _live_shards(folder: Path) -> list[Path]:
    """Finished and partial shards by index; a finished shard before its partial namesake."""
    found = []
    if not folder.is_dir():  # the run has not created it yet
        return []
    for entry in folder.iterdir():
        match = _INDEX.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry.name.endswith(PARTIAL), entry))
    return [path for _, _, path in sorted(found)]
