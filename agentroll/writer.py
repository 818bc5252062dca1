"""Rollout output: JSONL shards with a manifest, a group at a time, safe to kill at any moment, resumed by rerunning.

Layout of an output folder::

    rollouts-00000.jsonl            finished shards: never rewritten once they carry this name
    rollouts-00001.jsonl.partial    the shard being written (a loader globbing *.jsonl never sees it)
    rollouts-00001.routes[.partial] routed experts of the shard's records, when they carry them (docs/routed-experts.md)
    manifest.json                   shards with record, execution and group counts, sha256, settings, last run
    .agentroll/keys/*.keys          the groups (problem id, content hash) each finished shard holds
    .agentroll/filtered.jsonl       groups left out by --filter-uniform-groups (so a rerun skips them too)
    .agentroll/lock                 one writer at a time

`commit(group)` appends a group's records (its K executions, each execution's records together) in one write;
a group is never split across shards. A group is on disk whole or not at all: recovery keeps the partial
shard's whole groups, drops a torn or short one at its tail (it is redone), and finishes the shard. Manifest and
keys are replaced atomically (temp, fsync, rename); the manifest is rebuilt from what is on disk.

Routes: a group's sidecar blobs are written before its records, so every whole group's references are on disk;
recovery also drops a tail group whose references reach past the sidecar, and cuts the sidecar to the largest
end the kept records reference. A finished shard's sidecar is renamed before the shard itself, so a partial
shard whose `.routes.partial` is gone finds it under its final name.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson

from .errors import OutputError, PipeClosed, UsageError
from .group import Group
from .routes import Packer
from .schema import SCHEMA_VERSION
from .shards import (
    PARTIAL,
    ROUTES,
    SHARD_GLOB,
    SHARD_PREFIX,
    GroupKey,
    encode,
    is_zstd,
    join_frames,
    routes_path,
    scan_routed,
    shard_index,
    shard_name,
)

log = logging.getLogger("agentroll")

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


def _write_all(f: Any, data: bytes) -> None:
    view = memoryview(data)
    while view:  # unbuffered: after a failure nothing half-written waits in a buffer
        view = view[f.write(view):]


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def changed_settings(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """The settings that differ as (name, old, new), nested ones by their dotted name (`sampling.temperature`)."""
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_settings(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append((prefix + key, a, b))
    return out


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
        self.server: dict[str, Any] = {}  # this run's provenance (Generator.server): added to `servers`
        self.servers: list[dict[str, Any]] = []
        self._file: Any = None
        self._hash = hashlib.sha256()
        self._records = self._executions = self._good_size = 0
        self._keys: list[GroupKey] = []
        self._lock_fd: int | None = None
        self._routes_file: Any = None  # the partial shard's sidecar, opened at its first blob
        self._packer = Packer()

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
            self._note_server(manifest)
            self._recover(manifest)
            self._write_manifest(complete=False)
        except BaseException as exc:
            self._unlock()
            if isinstance(exc, OSError):
                raise OutputError(f"output folder {self.directory}: {exc.strerror or exc}") from exc
            raise
        return dict(self.done)

    def _note_server(self, manifest: dict[str, Any] | None) -> None:
        """Add this run's server provenance to the folder's list, warning when it differs from the last run's
        (say, another logprobs mode: the folder's records then mean two things)."""
        known = [x for x in (manifest or {}).get("servers") or [] if isinstance(x, dict)]
        if self.server and known and known[-1] != self.server:
            changed = ", ".join(f"{k}: {known[-1].get(k)!r} -> {v!r}" for k, v in self.server.items()
                                if known[-1].get(k) != v)
            log.warning("%s: this run's server differs from the last one's (%s); manifest `servers` lists both",
                        self.directory, changed)
        self.servers = known + ([self.server] if self.server and self.server not in known else [])

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
        detail = ", ".join(f"{k}: {a!r} -> {b!r}" for k, a, b in changed_settings(old, self.settings)[:6])
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
        shards = sorted(p for p in self.directory.glob(SHARD_GLOB) if not p.name.endswith(PARTIAL))
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
                self._check_routes(path, entry)
                self.done.update((str(k), str(h)) for k, h in orjson.loads(keys_path.read_bytes()))
            self.shards.append(entry)
        for partial in sorted(self.directory.glob(SHARD_GLOB + PARTIAL)):
            self._recover_partial(partial)
        for stray in self.directory.glob(f"{SHARD_PREFIX}*{ROUTES}{PARTIAL}"):
            stray.unlink()  # the sidecar of a partial shard that held no whole group: nothing references it

    def _recover_partial(self, partial: Path) -> None:
        """Keep the partial shard's whole groups (whose routes are on disk), cut its sidecar to what they
        reference, and finish it."""
        data = partial.read_bytes()
        final = self.directory / shard_name(self._next_index(), "zstd" if is_zstd(partial) else "none")
        side = routes_path(partial)
        if not side.exists():
            side = routes_path(final)  # renamed before its shard when the run died (_finish_file)
        side_size = side.stat().st_size if side.exists() else 0
        kept, records, executions, keys, needed = scan_routed(data, is_zstd(partial), side_size)
        if needed == 0 and side.exists():
            side.unlink()
        if records == 0:
            partial.unlink()
            return
        for path, size in ((partial, kept), (side, needed)):
            if size:
                with open(path, "r+b") as f:
                    f.truncate(size)
                    f.flush()
                    os.fsync(f.fileno())
        routes = (side, _file_sha256(side)) if needed else None
        self._finish_file(partial, final, records, executions, keys, hashlib.sha256(data[:kept]).hexdigest(), routes)

    def _check_routes(self, path: Path, entry: dict[str, Any]) -> None:
        info = entry.get("routes")
        if not isinstance(info, dict):
            return
        side = self.directory / str(info.get("file"))
        size = side.stat().st_size if side.exists() else None
        if size != info.get("bytes"):
            have = "missing" if size is None else f"{size} bytes"
            raise OutputError(f"{side} (routes of {path.name}) is damaged: {have} where the manifest says "
                              f"{info.get('bytes')}; move both away and rerun (their groups are generated again)")

    def _adopt(self, path: Path) -> dict[str, Any]:
        data = path.read_bytes()
        side = routes_path(path)
        side_size = side.stat().st_size if side.exists() else 0
        kept, records, executions, keys, needed = scan_routed(data, is_zstd(path), side_size)
        if kept != len(data):
            raise OutputError(f"{path} is damaged after byte {kept} (not whole groups, or routes past the end of "
                              f"{side.name}); move it away and rerun (its groups are generated again)")
        self._write_keys(path.name, keys)
        self.done.update(keys)
        entry = {"file": path.name, "records": records, "executions": executions, "groups": len(keys),
                 "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        if needed:
            entry["routes"] = {"file": side.name, "bytes": side_size, "sha256": _file_sha256(side)}
        return entry

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
        try:
            if self._file is None:
                self._start_shard()
        except OSError as exc:
            raise OutputError(f"cannot write to {self.directory}: {exc.strerror or exc}") from exc
        placed = self._packer.place(group)  # ValueError for routes that are not an array: nothing written yet
        data = encode(group.encode() if placed is None else placed.block(group), self.compression)
        try:
            if placed is not None:  # a group's routes go on disk before its records: every whole group has them
                if self._routes_file is None:
                    self._routes_file = open(routes_path(self._partial), "wb", buffering=0)  # noqa: SIM115
                _write_all(self._routes_file, placed.data)
            _write_all(self._file, data)
        except BaseException as exc:  # disk full, or interrupted between the two writes: both files cut back
            self._rollback()
            if isinstance(exc, OSError):
                raise OutputError(f"cannot write to {self.directory}: {exc.strerror or exc}") from exc
            raise
        if placed is not None:
            self._packer.accept(placed)
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
        self._routes_file, self._packer = None, Packer()  # a prompt's routes are stored once per shard

    def _rollback(self) -> None:
        """After a failed write (disk full), cut the partial shard and its sidecar back to the last whole group."""
        for f, size in ((self._file, self._good_size), (self._routes_file, self._packer.size)):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.truncate(size)
                    f.seek(size)

    def _close_routes(self) -> tuple[Path, str] | None:
        """Close the partial shard's sidecar: (its path, sha256) when it holds routes, else None (removed)."""
        if self._routes_file is None:
            return None
        f, self._routes_file = self._routes_file, None
        path = routes_path(self._partial)
        try:
            f.flush()
            os.fsync(f.fileno())
        finally:
            f.close()
        if self._packer.size == 0:  # its only group's write failed and was cut back
            path.unlink()
            return None
        return path, self._packer.sha256.hexdigest()

    def finish_shard(self) -> None:
        if self._file is None:
            return
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            routes = self._close_routes()
            if self._records == 0:
                self._partial.unlink()
                if routes is not None:
                    routes[0].unlink()
                return
            final = self.directory / shard_name(self._index, self.compression)
            self._finish_file(self._partial, final, self._records, self._executions, self._keys,
                              self._hash.hexdigest(), routes)
            self._write_manifest(complete=False)
        except OSError as exc:
            raise OutputError(f"cannot finish shard in {self.directory}: {exc.strerror or exc}") from exc

    def _finish_file(self, partial: Path, final: Path, records: int, executions: int, keys: list[GroupKey],
                     sha256: str, routes: tuple[Path, str] | None = None) -> None:
        if is_zstd(final):  # one frame per group while written, one frame once finished (shards.py says why)
            joined = join_frames(partial.read_bytes())
            _atomic_write(partial, joined)  # still the partial: a crash here leaves one shard, recoverable
            sha256 = hashlib.sha256(joined).hexdigest()
        self._write_keys(final.name, keys)  # keys first: a shard on disk always has its keys after a crash
        side = routes_path(final)
        if routes is not None:
            os.replace(routes[0], side)  # before the shard: a partial shard finds it there (_recover_partial)
        else:
            with contextlib.suppress(FileNotFoundError):
                side.unlink()  # a stale sidecar of a shard that was moved away
        os.replace(partial, final)
        _fsync_dir(self.directory)
        entry = {"file": final.name, "records": records, "executions": executions, "groups": len(keys),
                 "bytes": final.stat().st_size, "sha256": sha256}
        if routes is not None:
            entry["routes"] = {"file": side.name, "bytes": side.stat().st_size, "sha256": routes[1]}
        self.shards.append(entry)
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
            "servers": self.servers,
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
            for f in (self._file, self._routes_file):  # finishing failed: the next run repairs the partial shard
                if f is not None:
                    with contextlib.suppress(OSError):
                        f.close()
            self._file = self._routes_file = None
            self._unlock()


class StdoutWriter:
    """`-o -`: each group's records go out contiguously; a closed pipe ends the run (exit 141, like SIGPIPE)."""

    def __init__(self) -> None:
        self.run_info: dict[str, Any] = {}
        self.server: dict[str, Any] = {}

    def open(self) -> dict[str, str]:
        return {}

    def commit(self, group: Group) -> None:
        if group.status != "complete":
            return
        if any(s.routed_experts is not None for samples in group.executions for s in samples):
            raise UsageError("routed experts cannot be streamed to stdout (-o -): they go to a sidecar file beside "
                             "each shard; write to a folder")
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
