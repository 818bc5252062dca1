"""Rollout output: JSONL shards with a manifest, a group at a time, safe to kill at any moment, resumed by rerunning.

Layout of an output folder::

    rollouts-00000.jsonl            finished shards: never rewritten once they carry this name
    rollouts-00001.jsonl.partial    the shard being written (a loader globbing *.jsonl never sees it)
    manifest.json                   shards with record, execution and group counts, sha256, settings, last run
    .agentroll/keys/*.keys          the groups (problem id, content hash) each finished shard holds
    .agentroll/filtered.jsonl       groups left out by --filter-uniform-groups (so a rerun skips them too)
    .agentroll/lock                 one writer at a time

`commit(group)` appends a group's records (its K executions, each execution's records together) in one write;
a group is never split across shards. A group is on disk whole or not at all: recovery keeps the partial
shard's whole groups, drops a torn or short one at its tail (it is redone), and finishes the shard. Manifest and
keys are replaced atomically (temp, fsync, rename); the manifest is rebuilt from what is on disk.
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
from .group import Group
from .schema import SCHEMA_VERSION
from .shards import (
    PARTIAL,
    SHARD_PREFIX,
    GroupKey,
    encode,
    is_zstd,
    join_frames,
    scan_groups,
    shard_index,
    shard_name,
)

MANIFEST = "manifest.json"
STATE_DIR = ".agentroll"
FILTERED = "filtered.jsonl"



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


class ShardWriter:
    """Appends whole groups to rotating shards and keeps the manifest and the done set current."""

    def __init__(self, directory: Path, settings: dict[str, Any], shard_size: int = 1000,
                 overwrite: bool = False, compression: str = "none") -> None:
        self.directory = Path(directory)
        self.compression = compression
        self.settings = settings
        self.shard_size = shard_size
        self.overwrite = overwrite
        self.shards: list[dict[str, Any]] = []
        self.done: dict[str, str] = {}  # problem id -> content hash, committed or filtered
        self.filtered_groups = 0
        self.run_info: dict[str, Any] = {}
        self._file: Any = None
        self._hash = hashlib.sha256()
        self._records = self._executions = self._good_size = 0
        self._keys: list[GroupKey] = []
        self._lock_fd: int | None = None

    # -- opening and recovery -------------------------------------------------------------------------------
    def open(self) -> dict[str, str]:
        """Prepare the folder (recovering a crashed run); return the problems already done: id -> content hash."""
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
            elif manifest is not None and manifest.get("schema_version") != SCHEMA_VERSION:
                raise OutputError(f"{self.directory} holds rollouts of schema {manifest.get('schema_version')} "
                                  f"(this agentroll writes {SCHEMA_VERSION}); use another --output, or --overwrite")
            elif manifest is not None and manifest.get("settings") != self.settings:
                raise OutputError(self._settings_diff(manifest.get("settings") or {}))
            self._recover(manifest)
            self._write_manifest(complete=False)
        except BaseException as exc:
            self._unlock()
            if isinstance(exc, OSError):
                raise OutputError(f"output folder {self.directory}: {exc.strerror or exc}") from exc
            raise
        return dict(self.done)

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

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
            manifest = orjson.loads(path.read_bytes())
        except orjson.JSONDecodeError:
            manifest = None
        if not isinstance(manifest, dict):
            raise OutputError(f"{path} is not a valid manifest; fix or remove it, or pass --overwrite")
        return manifest

    def _settings_diff(self, old: dict[str, Any]) -> str:
        changed = sorted(k for k in set(old) | set(self.settings) if old.get(k) != self.settings.get(k))
        detail = ", ".join(f"{k}: {old.get(k)!r} -> {self.settings.get(k)!r}" for k in changed[:6])
        return (f"{self.directory} holds rollouts made with other settings ({detail}); "
                "use another --output, or --overwrite to start over")

    def _clear(self) -> None:
        for path in self.directory.glob(f"{SHARD_PREFIX}*"):
            path.unlink()
        shutil.rmtree(self.directory / STATE_DIR / "keys", ignore_errors=True)
        for name in (STATE_DIR + "/" + FILTERED, MANIFEST):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / name).unlink()

    def _keys_path(self, shard: str) -> Path:
        return self.directory / STATE_DIR / "keys" / (shard.split(".")[0] + ".keys")

    def _recover(self, manifest: dict[str, Any] | None) -> None:
        filtered = self.directory / STATE_DIR / FILTERED
        if filtered.exists():
            for line in filtered.read_bytes().splitlines():
                try:
                    entry = orjson.loads(line)
                    self.done[str(entry["problem_id"])] = str(entry["problem_hash"])
                except (orjson.JSONDecodeError, KeyError, TypeError):
                    continue  # a line torn by a crash: that group is simply generated again
                self.filtered_groups += 1
        known = {s.get("file"): s for s in (manifest or {}).get("shards", []) if isinstance(s, dict)}
        keys_dir = self.directory / STATE_DIR / "keys"
        keys_dir.mkdir(exist_ok=True)
        shards = sorted(p for p in self.directory.glob(f"{SHARD_PREFIX}*") if not p.name.endswith(PARTIAL))
        for stale in set(keys_dir.glob("*.keys")) - {self._keys_path(p.name) for p in shards}:
            stale.unlink()  # its shard was moved away: those groups are redone
        for path in shards:
            entry = known.get(path.name)
            keys_path = self._keys_path(path.name)
            if entry is None or not keys_path.exists():
                entry = self._adopt(path)  # finished but not yet in the manifest when the run died
            else:
                size = path.stat().st_size
                if size != entry.get("bytes"):
                    raise OutputError(f"{path} is damaged: {size} bytes where the manifest says {entry.get('bytes')}; "
                                      "move it away and rerun (its groups are generated again)")
                self.done.update((str(k), str(h)) for k, h in orjson.loads(keys_path.read_bytes()))
            self.shards.append(entry)
        for partial in sorted(self.directory.glob(f"{SHARD_PREFIX}*{PARTIAL}")):
            data = partial.read_bytes()
            kept, records, executions, keys = scan_groups(data, is_zstd(partial))
            if records == 0:
                partial.unlink()
                continue
            with open(partial, "r+b") as f:
                f.truncate(kept)
                f.flush()
                os.fsync(f.fileno())
            final = self.directory / shard_name(self._next_index(), "zstd" if is_zstd(partial) else "none")
            self._finish_file(partial, final, records, executions, keys, hashlib.sha256(data[:kept]).hexdigest())

    def _adopt(self, path: Path) -> dict[str, Any]:
        data = path.read_bytes()
        kept, records, executions, keys = scan_groups(data, is_zstd(path))
        if kept != len(data):
            raise OutputError(f"{path} is damaged after byte {kept} (not whole groups); move it away and rerun "
                              "(its groups are generated again)")
        self._write_keys(path.name, keys)
        self.done.update(keys)
        return {"file": path.name, "records": records, "executions": executions, "groups": len(keys),
                "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    def _next_index(self) -> int:
        used = [shard_index(s["file"]) for s in self.shards]
        return max(used, default=-1) + 1

    @property
    def groups_committed(self) -> int:
        """Groups on disk: in finished shards, and in the partial one."""
        return sum(s.get("groups", 0) for s in self.shards) + (len(self._keys) if self._file is not None else 0)

    # -- writing ----------------------------------------------------------------------------------------------
    def commit(self, group: Group) -> None:
        """Put a finished group on disk: a complete one is appended whole, a filtered one is remembered."""
        if group.status == "filtered":
            self.mark_filtered(group)
        elif group.status == "complete":
            self._append(group)
        else:
            raise ValueError(f"a {group.status} group is not committed")

    def _append(self, group: Group) -> None:
        data = encode(group.encode(), self.compression)
        try:
            if self._file is None:
                self._start_shard()
            view = memoryview(data)
            while view:  # unbuffered: after a failure nothing half-written waits in a buffer
                view = view[self._file.write(view):]
        except OSError as exc:
            self._rollback()
            raise OutputError(f"cannot write to {self.directory}: {exc.strerror or exc}") from exc
        self._good_size += len(data)
        self._hash.update(data)
        self._records += group.num_records
        self._executions += len(group.executions)
        key = (group.problem.id, group.problem.content_hash)
        self._keys.append(key)
        self.done[key[0]] = key[1]
        if self._records >= self.shard_size:
            self.finish_shard()

    def mark_filtered(self, group: Group) -> None:
        """Remember a group left out as uniform, durably, so a rerun does not generate it again."""
        entry = {"problem_id": group.problem.id, "problem_hash": group.problem.content_hash}
        try:
            with open(self.directory / STATE_DIR / FILTERED, "ab") as f:
                f.write(orjson.dumps(entry) + b"\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise OutputError(f"cannot write to {self.directory}: {exc.strerror or exc}") from exc
        self.filtered_groups += 1
        self.done[group.problem.id] = group.problem.content_hash

    def _start_shard(self) -> None:
        self._index = self._next_index()
        self._partial = self.directory / (shard_name(self._index, self.compression) + PARTIAL)
        self._file = open(self._partial, "wb", buffering=0)  # noqa: SIM115 - open across calls; see finish_shard
        self._hash, self._keys = hashlib.sha256(), []
        self._records = self._executions = self._good_size = 0

    def _rollback(self) -> None:
        """After a failed write (disk full), cut the partial shard back to its last whole group."""
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
            final = self.directory / shard_name(self._index, self.compression)
            self._finish_file(self._partial, final, self._records, self._executions, self._keys,
                              self._hash.hexdigest())
            self._write_manifest(complete=False)
        except OSError as exc:
            raise OutputError(f"cannot finish shard in {self.directory}: {exc.strerror or exc}") from exc

    def _finish_file(self, partial: Path, final: Path, records: int, executions: int, keys: list[GroupKey],
                     sha256: str) -> None:
        if is_zstd(final):  # one frame per group while written, one frame once finished (shards.py says why)
            joined = join_frames(partial.read_bytes())
            _atomic_write(partial, joined)  # still the partial: a crash here leaves one shard, recoverable
            sha256 = hashlib.sha256(joined).hexdigest()
        self._write_keys(final.name, keys)  # keys first: a shard on disk always has its keys after a crash
        os.replace(partial, final)
        _fsync_dir(self.directory)
        self.shards.append({"file": final.name, "records": records, "executions": executions, "groups": len(keys),
                            "bytes": final.stat().st_size, "sha256": sha256})
        self.done.update(keys)

    def _write_keys(self, shard: str, keys: Iterable[GroupKey]) -> None:
        _atomic_write(self._keys_path(shard), orjson.dumps([list(k) for k in keys]))

    def _write_manifest(self, complete: bool) -> None:
        manifest = {
            "format": "agentroll.rollouts",
            "schema_version": SCHEMA_VERSION,
            "complete": complete,
            "records": sum(s["records"] for s in self.shards),
            "executions": sum(s["executions"] for s in self.shards),
            "groups": sum(s["groups"] for s in self.shards),
            "filtered_groups": self.filtered_groups,
            "shards": self.shards,
            "settings": self.settings,
            "last_run": self.run_info,
        }
        _atomic_write(self.directory / MANIFEST, orjson.dumps(manifest, option=orjson.OPT_INDENT_2))

    def close(self, complete: bool) -> None:
        """Finish the open shard and write the final manifest. `complete`: every problem read is done."""
        try:
            self.finish_shard()
            self._write_manifest(complete=complete)
        except OSError as exc:
            raise OutputError(f"cannot write manifest in {self.directory}: {exc.strerror or exc}") from exc
        finally:
            if self._file is not None:  # finishing failed: leave the partial shard for the next run to repair
                with contextlib.suppress(OSError):
                    self._file.close()
                self._file = None
            self._unlock()


class StdoutWriter:
    """`-o -`: each group's records go out contiguously; a closed pipe ends the run (exit 141, like SIGPIPE)."""

    def __init__(self) -> None:
        self.run_info: dict[str, Any] = {}

    def open(self) -> dict[str, str]:
        return {}

    def commit(self, group: Group) -> None:
        if group.status != "complete":
            return
        try:
            sys.stdout.buffer.write(group.encode())
            sys.stdout.buffer.flush()
        except BrokenPipeError:
            # The consumer (head, a loader) is gone: point stdout at /dev/null so exit is quiet, and stop.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise PipeClosed("stdout was closed by its reader") from None
        except OSError as exc:  # disk full behind a redirect, a closed terminal...
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing half-flushed at exit
            raise OutputError(f"cannot write to stdout: {exc.strerror or exc}") from exc

    def close(self, complete: bool) -> None:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.buffer.flush()
