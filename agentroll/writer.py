"""Rollout output: JSONL shards with a manifest, safe to kill at any moment and resumed by rerunning.

Layout of an output folder::

    rollouts-00000.jsonl            finished shards: never rewritten once they carry this name
    rollouts-00001.jsonl.partial    the shard being written (a loader globbing *.jsonl never sees it)
    manifest.json                   shards with record counts and sha256, settings, last run's stats
    .agentroll/keys/*.keys          the executions (problem id, sample index) each finished shard holds
    .agentroll/filtered.jsonl       groups left out by --filter-uniform-groups (so a rerun skips them too)
    .agentroll/lock                 one writer at a time

A group's records (all its executions, each execution's records together) are written in one block and never
split across shards. After a crash, the partial
shard's complete execution blocks are kept (a torn tail is cut off) and it is finished like any other shard;
the manifest is rebuilt from what is on disk. Manifest and keys are replaced atomically (temp, fsync, rename).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from .errors import OutputError, PipeClosed
from .schema import SCHEMA_VERSION, Sample

MANIFEST = "manifest.json"
STATE_DIR = ".agentroll"
SHARD_PREFIX = "rollouts-"
PARTIAL = ".partial"

Key = tuple[str, int]


FILTERED = "filtered.jsonl"


def encode_group(executions: list[list[Sample]]) -> bytes:
    return b"".join(orjson.dumps(s) + b"\n" for samples in executions for s in samples)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _shard_name(index: int) -> str:
    return f"{SHARD_PREFIX}{index:05d}.jsonl"


def scan_blocks(data: bytes) -> tuple[int, int, list[Key]]:
    """Complete execution blocks at the start of a shard's bytes: (bytes kept, records, keys).

    A block is complete when it holds `rollout_size` parseable records of one rollout; anything after the
    first incomplete or torn block is dropped (it was being written when the process died).
    """
    kept = records = 0
    keys: list[Key] = []
    pos = 0
    lines = data.split(b"\n")
    i = 0
    while i < len(lines) - 1:  # the last element is after the final newline: empty, or a torn line
        try:
            first = orjson.loads(lines[i])
            size = int(first["rollout_size"])
            if size < 1 or i + size > len(lines) - 1:
                break
            block = [first] + [orjson.loads(x) for x in lines[i + 1 : i + size]]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
            break
        if any(r.get("rollout_id") != first["rollout_id"] for r in block):
            break
        pos += sum(len(x) + 1 for x in lines[i : i + size])
        kept, records, i = pos, records + size, i + size
        keys.append((str(first["problem_id"]), int(first["sample_index"])))
    return kept, records, keys


class ShardWriter:
    """Writes execution blocks into rotating shards and keeps the manifest and the done set current."""

    def __init__(self, directory: Path, settings: dict[str, Any], shard_size: int = 1000,
                 overwrite: bool = False) -> None:
        self.directory = Path(directory)
        self.settings = settings
        self.shard_size = shard_size
        self.overwrite = overwrite
        self.shards: list[dict[str, Any]] = []
        self.done: set[Key] = set()
        self.filtered_groups = 0
        self.run_info: dict[str, Any] = {}
        self._file: Any = None
        self._hash = hashlib.sha256()
        self._records = 0
        self._keys: list[Key] = []
        self._good_size = 0
        self._lock_fd: int | None = None

    # -- opening and recovery -------------------------------------------------------------------------------
    def open(self) -> set[Key]:
        """Prepare the folder (recovering a crashed run) and return the executions already written."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            (self.directory / STATE_DIR).mkdir(exist_ok=True)
            self._lock()
            manifest = self._read_manifest()
            if manifest is not None and manifest.get("merged_from"):
                raise OutputError(f"{self.directory} is a merged view (agentroll merge); generate into another folder")
            if self.overwrite:
                self._clear()
                manifest = None
            elif manifest is not None and manifest.get("settings") != self.settings:
                raise OutputError(self._settings_diff(manifest.get("settings") or {}))
            self._recover(manifest)
            self._write_manifest(complete=False)
        except OSError as exc:
            raise OutputError(f"output folder {self.directory}: {exc.strerror or exc}") from None
        return set(self.done)

    def _lock(self) -> None:
        fd = os.open(self.directory / STATE_DIR / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(f"{self.directory} is being written by another agentroll process") from None
        self._lock_fd = fd

    def _read_manifest(self) -> dict[str, Any] | None:
        path = self.directory / MANIFEST
        if not path.exists():
            return None
        try:
            return orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError:
            raise OutputError(f"{path} is not valid JSON; fix or remove it, or pass --overwrite") from None

    def _settings_diff(self, old: dict[str, Any]) -> str:
        changed = sorted(k for k in set(old) | set(self.settings) if old.get(k) != self.settings.get(k))
        detail = ", ".join(f"{k}: {old.get(k)!r} -> {self.settings.get(k)!r}" for k in changed[:6])
        return (f"{self.directory} holds rollouts made with other settings ({detail}); "
                "use another --output, or --overwrite to start over")

    def _clear(self) -> None:
        for path in self.directory.glob(f"{SHARD_PREFIX}*"):
            path.unlink()
        shutil.rmtree(self.directory / STATE_DIR / "keys", ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            (self.directory / STATE_DIR / FILTERED).unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.directory / MANIFEST).unlink()

    def _keys_path(self, shard: str) -> Path:
        return self.directory / STATE_DIR / "keys" / (shard.removesuffix(".jsonl") + ".keys")

    def _recover(self, manifest: dict[str, Any] | None) -> None:
        filtered = self.directory / STATE_DIR / FILTERED
        if filtered.exists():
            for line in filtered.read_bytes().splitlines():
                try:
                    entry = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue  # a line torn by a crash: that group is simply generated again
                self.filtered_groups += 1
                self.done.update((entry["problem_id"], i) for i in entry["sample_indexes"])
        known = {s["file"]: s for s in (manifest or {}).get("shards", [])}
        (self.directory / STATE_DIR / "keys").mkdir(exist_ok=True)
        for path in sorted(self.directory.glob(f"{SHARD_PREFIX}*.jsonl")):
            entry = known.get(path.name)
            keys_path = self._keys_path(path.name)
            if entry is None or not keys_path.exists():
                entry = self._adopt(path)  # finished but not yet in the manifest when the run died
            else:
                self.done.update((k, i) for k, i in orjson.loads(keys_path.read_bytes()))
            self.shards.append(entry)
        for partial in sorted(self.directory.glob(f"{SHARD_PREFIX}*.jsonl{PARTIAL}")):
            data = partial.read_bytes()
            kept, records, keys = scan_blocks(data)
            if records == 0:
                partial.unlink()
                continue
            with open(partial, "r+b") as f:
                f.truncate(kept)
                f.flush()
                os.fsync(f.fileno())
            final = self.directory / _shard_name(self._next_index())
            self._finish_file(partial, final, records, keys, hashlib.sha256(data[:kept]).hexdigest())

    def _adopt(self, path: Path) -> dict[str, Any]:
        data = path.read_bytes()
        kept, records, keys = scan_blocks(data)
        if kept != len(data):
            raise OutputError(f"{path} is damaged after byte {kept}; move it away and rerun")
        self._write_keys(path.name, keys)
        self.done.update(keys)
        return {"file": path.name, "records": records, "executions": len(keys),
                "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def _next_index(self) -> int:
        used = [int(s["file"][len(SHARD_PREFIX):].split(".")[0]) for s in self.shards]
        return max(used, default=-1) + 1

    # -- writing ----------------------------------------------------------------------------------------------
    def write_group(self, executions: list[list[Sample]]) -> None:
        """Append a group's executions as one block; rotate when the shard is full."""
        executions = [e for e in executions if e]
        if not executions:
            return
        data = encode_group(executions)
        try:
            if self._file is None:
                self._start_shard()
            view = memoryview(data)
            while view:  # unbuffered: after a failure nothing half-written waits in a buffer
                view = view[self._file.write(view):]
        except OSError as exc:
            self._rollback()
            raise OutputError(f"cannot write to {self.directory}: {exc.strerror or exc}") from None
        self._good_size += len(data)
        self._hash.update(data)
        for samples in executions:
            self._records += len(samples)
            key = (samples[0].problem_id, samples[0].sample_index)
            self._keys.append(key)
            self.done.add(key)
        if self._records >= self.shard_size:
            self.finish_shard()

    def mark_filtered(self, problem_id: str, sample_indexes: list[int]) -> None:
        """Remember a group left out as uniform, durably, so a rerun does not generate it again."""
        line = orjson.dumps({"problem_id": problem_id, "sample_indexes": sample_indexes}) + b"\n"
        try:
            with open(self.directory / STATE_DIR / FILTERED, "ab") as f:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise OutputError(f"cannot write to {self.directory}: {exc.strerror or exc}") from None
        self.filtered_groups += 1
        self.done.update((problem_id, i) for i in sample_indexes)

    def _start_shard(self) -> None:
        self._index = self._next_index()
        self._partial = self.directory / (_shard_name(self._index) + PARTIAL)
        self._file = open(self._partial, "wb", buffering=0)  # noqa: SIM115 - open across calls; see finish_shard
        self._hash, self._records, self._keys, self._good_size = hashlib.sha256(), 0, [], 0

    def _rollback(self) -> None:
        """After a failed write (disk full), cut the partial shard back to its last whole execution."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.truncate(self._good_size)
                self._file.seek(self._good_size)

    def finish_shard(self) -> None:
        if self._file is None:
            return
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            if self._records == 0:
                self._partial.unlink()
                return
            final = self.directory / _shard_name(self._index)
            self._finish_file(self._partial, final, self._records, self._keys, self._hash.hexdigest())
            self._write_manifest(complete=False)
        except OSError as exc:
            raise OutputError(f"cannot finish shard in {self.directory}: {exc.strerror or exc}") from None

    def _finish_file(self, partial: Path, final: Path, records: int, keys: list[Key], sha256: str) -> None:
        self._write_keys(final.name, keys)  # keys first: a shard on disk always has its keys after a crash
        os.replace(partial, final)
        _fsync_dir(self.directory)
        self.shards.append({"file": final.name, "records": records, "executions": len(keys),
                            "bytes": final.stat().st_size, "sha256": sha256})
        self.done.update(keys)

    def _write_keys(self, shard: str, keys: Iterable[Key]) -> None:
        _atomic_write(self._keys_path(shard), orjson.dumps([list(k) for k in keys]))

    def _write_manifest(self, complete: bool) -> None:
        manifest = {
            "format": "agentroll.rollouts",
            "schema_version": SCHEMA_VERSION,
            "complete": complete,
            "records": sum(s["records"] for s in self.shards),
            "executions": sum(s["executions"] for s in self.shards),
            "filtered_groups": self.filtered_groups,
            "shards": self.shards,
            "settings": self.settings,
            "last_run": self.run_info,
        }
        _atomic_write(self.directory / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))

    def close(self, complete: bool) -> None:
        """Finish the open shard and write the final manifest. `complete`: the whole input was processed."""
        try:
            self.finish_shard()
            self._write_manifest(complete=complete)
        except OSError as exc:
            raise OutputError(f"cannot write manifest in {self.directory}: {exc.strerror or exc}") from None
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


class StdoutWriter:
    """`-o -`: each execution's records go out contiguously; a closed pipe ends the run quietly."""

    def __init__(self) -> None:
        self.run_info: dict[str, Any] = {}

    def open(self) -> set[Key]:
        return set()

    def write_group(self, executions: list[list[Sample]]) -> None:
        data = encode_group(executions)
        if not data:
            return
        try:
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            # The consumer (head, a loader) is gone: point stdout at /dev/null so exit is quiet, and stop.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise PipeClosed("stdout was closed by its reader") from None

    def mark_filtered(self, problem_id: str, sample_indexes: list[int]) -> None:
        pass

    def close(self, complete: bool) -> None:
        with contextlib.suppress(BrokenPipeError, ValueError):
            sys.stdout.buffer.flush()
