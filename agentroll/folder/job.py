"""A `--ray` job's folder: `OUT/part-I` per partition, `OUT/.agentroll/ray/` (the plan, the driver's lock, each
partition's log), and the merged view in `OUT` once the partitions are done.

The plan (`plan.json`) keeps the number of partitions, so a rerun splits the input the same way even on a
cluster of another size. One driver per job folder (its lock); `--overwrite` deletes no partition while a
process still writes it (each partition's writer lock is taken first).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from ..errors import OutputError, UsageError
from . import lock
from .files import atomic_write
from .layout import PART, Layout
from .manifest import Manifest

PLAN = "plan.json"
LOCK = "lock"  # OUT/.agentroll/ray/lock: held by the job's driver while it runs


def part_dir(out: Path, index: int) -> Path:
    return Layout(out).part(index)


def log_path(out: Path, index: int) -> Path:
    return Layout(out).ray / f"part-{index}.log"


def _is_part(out: Path, entry: object) -> bool:
    """An entry of a merged manifest's `merged_from` that is one of `out`'s partitions."""
    folder = entry.get("folder") if isinstance(entry, dict) else None
    if not isinstance(folder, str) or not PART.fullmatch(Path(folder).name):
        return False
    parent, home = Path(folder).parent, os.path.realpath(out)
    return os.path.realpath(parent) == home or os.path.realpath(out / parent) == home


def check_folder(out: Path) -> Manifest | None:
    """The merged manifest an earlier run of the job left in `out`, or None. A folder that holds anything else
    (a run without --ray, a merged view of other folders) is refused: the job would delete or mix it."""
    layout = Layout(out)
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out} is a file, not a folder")
    manifest = Manifest.load(out) if layout.manifest.exists() else None
    if (manifest is not None and manifest.merged_from is None) or layout.ours():
        raise OutputError(f"{out} holds the rollouts of a run without --ray; give the --ray job a folder of its own")
    if manifest is not None and manifest.merged_from is not None:
        foreign = [str(m.get("folder")) for m in manifest.merged_from if not _is_part(out, m)]
        if foreign:
            raise OutputError(
                f"{layout.manifest} is a merged view of other folders ({', '.join(foreign[:3])}), not "
                f"of {out}/part-*: move it away, or give the --ray job a folder of its own"
            )
    return manifest


def lock_job(out: Path) -> int:
    """Hold `OUT/.agentroll/ray/lock` for the driver's lifetime and return its descriptor (closing it lets go):
    a second driver (the same command run again while the first runs, a requeued batch job) is refused at once
    instead of running, or with --overwrite deleting, partitions the first is writing."""
    path = Layout(out).ray / LOCK
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"output folder {out}: {exc.strerror or exc}") from exc
    fd = lock.take(
        path, f"{out} is in use by another agentroll generate --ray (it holds {path}): wait for it to end, or stop it"
    )
    assert fd is not None
    return fd


def _take_parts(out: Path) -> list[tuple[Path, int | None]]:
    """Each partition folder of `out` with its writer's lock taken (None: it has no lock file)."""
    taken: list[tuple[Path, int | None]] = []
    try:
        for path in sorted(out.glob("part-*")):
            if not (PART.fullmatch(path.name) and path.is_dir()):
                continue
            busy = (
                f"{path} is being written by another agentroll process: --overwrite deletes no partition "
                "while it runs; stop it first"
            )
            taken.append((path, None))
            taken[-1] = (path, lock.take(Layout(path).lock, busy, create=False))
    except BaseException:
        _let_go(taken)
        raise
    return taken


def _let_go(taken: list[tuple[Path, int | None]]) -> None:
    for _, fd in taken:
        lock.release(fd)


def prepare_output(out: Path, requested: int | None, default: int, overwrite: bool) -> int:
    """Make `out` ready for a job and return its number of partitions: the one recorded by an earlier run of the
    job (a rerun resumes, on a cluster of any size), else `requested`, else `default`. The merged manifest of an
    earlier run goes: it is written again at the end. The caller holds the job's lock (`lock_job`)."""
    layout = Layout(out)
    state, plan = layout.ray, layout.ray / PLAN
    manifest = check_folder(out)
    try:
        if overwrite:
            taken = _take_parts(out)
            try:
                if manifest is not None:  # first: no merged view outlives the folders it points at
                    layout.manifest.unlink()
                    manifest = None
                for path, _ in taken:
                    shutil.rmtree(path)
            finally:
                _let_go(taken)
            for entry in state.iterdir() if state.is_dir() else []:
                if entry.name == LOCK:  # the driver's own: it is held
                    continue
                if entry.is_dir():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        recorded = None
        if plan.exists():
            recorded = int(orjson.loads(plan.read_bytes())["partitions"])
        if requested is not None and recorded is not None and requested != recorded:
            raise UsageError(
                f"{out} holds a job split into {recorded} partitions: rerun it with --partitions "
                f"{recorded} (or without --partitions), or pass --overwrite to start over"
            )
        partitions = recorded or requested or default
        state.mkdir(parents=True, exist_ok=True)
        atomic_write(plan, orjson.dumps({"partitions": partitions}))
        if manifest is not None:
            layout.manifest.unlink()
    except OSError as exc:
        raise OutputError(f"output folder {out}: {exc.strerror or exc}") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise OutputError(f"{plan} is damaged ({exc}); fix it, or pass --overwrite") from exc
    return partitions


def part_manifest(out: Path, index: int) -> Manifest:
    return Manifest.load(part_dir(out, index))


class PartitionState:
    """A partition's files under `OUT/.agentroll/ray` (its task writes them on its node): `part-I.log` (the
    child's stderr and the task's own notes) and `part-I.attempts` (one JSON line per attempt)."""

    def __init__(self, state: Path, index: int) -> None:
        self.log = Path(state) / f"part-{index}.log"
        self.attempts = Path(state) / f"part-{index}.attempts"

    def open_log(self) -> BinaryIO:
        return open(self.log, "ab")

    def note(self, text: str) -> None:
        with contextlib.suppress(OSError), open(self.log, "ab") as f:
            f.write(text.encode() + b"\n")

    def attempts_of(self, job: str) -> int:
        try:
            data = self.attempts.read_bytes()
        except OSError:
            return 0
        count = 0
        for line in data.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError, AttributeError):
                count += orjson.loads(line).get("job") == job
        return count

    def add_attempt(self, record: dict[str, Any]) -> None:
        with open(self.attempts, "ab") as f:
            f.write(orjson.dumps(record) + b"\n")

    def tail(self, offset: int, lines: int = 12) -> str:
        """The last `lines` lines the log got after byte `offset`."""
        try:
            with open(self.log, "rb") as f:
                f.seek(offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.strip().splitlines()[-lines:])
