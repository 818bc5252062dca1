"""Reading an output folder back: records, whole groups, and a live run followed as it commits.

`read_records` and `read_groups` read a finished folder, or a merged one, in manifest order. With `follow=True`,
`read_groups` tails a folder that a run is still writing: it reads finished shards and the partial one up to
its last whole group, yields each group once as soon as it is committed, survives the writer being killed and
restarted (a recovered shard is re-read and its groups already yielded are skipped), and ends by itself when
the manifest says the run is complete.
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

from .errors import OutputError, UsageError
from .group import Group
from .inputs import Problem
from .schema import Sample
from .shards import PARTIAL, SHARD_PREFIX, is_zstd, read_lines, shard_groups
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
    folder = Path(path)
    return [folder / shard["file"] for shard in load_manifest(folder)["shards"]]


def read_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every record of a folder as its JSONL dict, in manifest order."""
    for shard in shard_paths(path):
        for line in read_lines(shard):
            yield orjson.loads(line)


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
                timeout_s: float | None = None, consumer: str | None = None) -> Iterator[Group]:
    """Whole groups of a folder in manifest order; with `follow`, of a live run as it commits them (see the
    module's docstring). `timeout_s` bounds how long a follower waits without the run completing
    (`TimeoutError`); None waits as long as the run takes.

    `consumer` names a durable position (`.agentroll/consumers/NAME`, replaced atomically): a group counts as
    consumed once the next one is asked for, the reader starts after the groups already consumed, and
    `generate --consumer NAME --max-ahead G` stops taking prompts while more than G groups are unconsumed. A
    consumer that dies is given its last group again: at least once, never lost."""
    if consumer is not None:
        yield from _consume(read_groups(path, follow, poll_s, timeout_s), Path(path), consumer)
        return
    if not follow:
        for shard in shard_paths(path):
            data = shard.read_bytes()
            read = 0
            for end, records in shard_groups(data, is_zstd(shard)):
                read = end
                yield as_group(records)
            if read != len(data):
                raise OutputError(f"{shard} is damaged after byte {read} (not whole groups)")
        return
    yield from _follow(Path(path), poll_s, timeout_s)


def _follow(folder: Path, poll_s: float, timeout_s: float | None) -> Iterator[Group]:
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
                offsets[shard.name] = start + end
                pid = str(records[0]["problem_id"])
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
