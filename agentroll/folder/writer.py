"""Writing a folder: whole groups appended to rotating shards, the manifest and the done set kept current.

`commit(group)` appends a group's records (its K executions, each execution's records together) in one write;
a group is never split across shards. Manifest and keys are replaced atomically. Routes: a group's sidecar
blobs are written before its records, so every whole group's references are on disk. Recovery of whatever a
stop left is `recovery`'s.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from ..errors import OutputError
from ..record.group import Group
from ..record.schema import SCHEMA_VERSION
from . import lock
from .files import prepare, write_all
from .layout import PARTIAL, Layout, routes_path
from .manifest import Manifest, ShardEntry, changed_settings, in_the_way
from .recovery import finish_file, next_index, recover
from .routes import Packer
from .shards import GroupKey, encode

log = logging.getLogger("agentroll")


def clear(layout: Layout) -> None:
    """What --overwrite removes: every rollout file, the manifest, and all the folder's state but its lock (which
    the caller holds): keys, filtered groups, consumer positions, the call journal, the demo marker."""
    with contextlib.suppress(FileNotFoundError):
        layout.manifest.unlink()  # first: no manifest outlives the shards it lists
    for path in layout.ours():
        path.unlink()
    for directory in (layout.keys_dir, layout.consumers, layout.journal):
        shutil.rmtree(directory, ignore_errors=True)
    for path in (layout.filtered, layout.demo_marker):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


class ShardWriter:
    """Appends whole groups to rotating shards and keeps the manifest and the done set current."""

    def __init__(
        self,
        directory: Path,
        settings: dict[str, Any],
        shard_size: int = 1000,
        overwrite: bool = False,
        compression: str = "none",
        demo: bool = False,
    ) -> None:
        self.directory = Path(directory)
        self.layout = Layout(self.directory)
        self.compression = compression
        self.settings = settings
        self.shard_size = shard_size
        self.overwrite = overwrite
        self.demo = demo  # `agentroll demo`: the folder is marked as the demo's own
        self.manifest = Manifest(settings=settings)
        self.done: dict[str, str] = {}  # problem id -> content hash, committed or filtered
        self.run_info: dict[str, Any] = {}
        self.server: dict[str, Any] = {}  # this run's provenance (Generator.server): added to `servers`
        self._file: Any = None
        self._hash = hashlib.sha256()
        self._records = self._executions = self._good_size = 0
        self._keys: list[GroupKey] = []
        self._lock_fd: int | None = None
        self._routes_file: Any = None  # the partial shard's sidecar, opened at its first blob
        self._packer = Packer()

    @property
    def shards(self) -> list[ShardEntry]:
        return self.manifest.shards

    @property
    def filtered_groups(self) -> int:
        return self.manifest.filtered_groups

    @property
    def folder_id(self) -> str:
        return self.manifest.folder_id

    # -- opening ----------------------------------------------------------------------------------------------
    def open(self, check: Callable[[dict[str, str]], None] | None = None) -> dict[str, str]:
        """Prepare the folder (recovering a stopped run); return the problems already done: id -> content hash.
        `check(done)` is the caller's last word before the manifest is rewritten as this run's: what it raises
        leaves a complete folder complete (a first row that clashes with a done id, say)."""
        layout = prepare(self.directory)
        try:
            self._lock_fd = lock.take(layout.lock, f"{self.directory} is being written by another agentroll process")
            if layout.manifest.is_dir():
                raise in_the_way(layout.manifest)
            earlier = None if self.overwrite else self._earlier()
            if earlier is None and not self.overwrite and (layout.finished() or layout.partials()):
                raise OutputError(
                    f"{self.directory} holds rollout shards but no {layout.manifest.name}: the settings they were "
                    "made with are unknown, so this run cannot take them as its own; restore the manifest, move "
                    "the shards away, or pass --overwrite to start over"
                )
            if self.overwrite:
                clear(layout)
            self._note_server(earlier)
            found = recover(layout, earlier)
            if check is not None:
                check(dict(found.done))
            self.done = found.done
            self.manifest = Manifest(
                settings=self.settings,
                shards=found.shards,
                filtered_groups=found.filtered_groups,
                servers=self.manifest.servers,
            )
            if earlier is not None and earlier.folder_id:
                self.manifest.folder_id = earlier.folder_id
            if self.demo:
                layout.demo_marker.write_bytes(b"made by agentroll demo\n")
            else:
                with contextlib.suppress(FileNotFoundError):
                    layout.demo_marker.unlink()  # generate made it its own
            self._write_manifest(complete=False)
        except BaseException as exc:
            self._unlock()
            if isinstance(exc, OSError):
                raise OutputError(f"output folder {self.directory}: {exc.strerror or exc}") from exc
            raise
        return dict(self.done)

    def _earlier(self) -> Manifest | None:
        """The manifest of the run this one resumes, checked: ours, of this schema, made with these settings."""
        if not self.layout.manifest.exists():
            return None
        try:
            manifest = Manifest.load(self.directory)
        except OutputError as exc:
            raise OutputError(f"{exc}; fix it, or pass --overwrite to start over") from None
        if manifest.merged_from is not None:
            raise OutputError(f"{self.directory} is a merged view (agentroll merge); generate into another folder")
        if manifest.schema_version != SCHEMA_VERSION:
            raise OutputError(
                f"{self.directory} holds rollouts of schema {manifest.schema_version} "
                f"(this agentroll writes {SCHEMA_VERSION}); use another --output, or --overwrite"
            )
        if manifest.settings != self.settings:
            detail = ", ".join(
                f"{k}: {a!r} -> {b!r}" for k, a, b in changed_settings(manifest.settings, self.settings)[:6]
            )
            raise OutputError(
                f"{self.directory} holds rollouts made with other settings ({detail}); "
                "use another --output, or --overwrite to start over"
            )
        return manifest

    def _note_server(self, manifest: Manifest | None) -> None:
        """Add this run's server provenance to the folder's list, warning when it differs from the last run's
        (say, another logprobs mode: the folder's records then mean two things)."""
        known = manifest.servers if manifest is not None else []
        if self.server and known and known[-1] != self.server:
            changed = ", ".join(
                f"{k}: {known[-1].get(k)!r} -> {v!r}" for k, v in self.server.items() if known[-1].get(k) != v
            )
            log.warning(
                "%s: this run's server differs from the last one's (%s); manifest `servers` lists both",
                self.directory,
                changed,
            )
        self.manifest.servers = known + ([self.server] if self.server and self.server not in known else [])

    def _unlock(self) -> None:
        lock.release(self._lock_fd)
        self._lock_fd = None

    @property
    def groups_committed(self) -> int:
        """Groups on disk: in finished shards, and in the partial one."""
        return self.manifest.groups + (len(self._keys) if self._file is not None else 0)

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
                write_all(self._routes_file, placed.data)
            write_all(self._file, data)
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
            with open(self.layout.filtered, "ab") as f:
                f.write(orjson.dumps(entry) + b"\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise OutputError(f"cannot write to {self.directory}: {exc.strerror or exc}") from exc
        self.manifest.filtered_groups += 1
        self.done[group.problem.id] = group.problem.content_hash

    def _start_shard(self) -> None:
        self._index = next_index(self.shards)
        self._partial = self.layout.shard(self._index, self.compression, partial=True)
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
            final = self.layout.root / self._partial.name.removesuffix(PARTIAL)
            self.shards.append(
                finish_file(
                    self.layout,
                    self._partial,
                    final,
                    self._records,
                    self._executions,
                    self._keys,
                    self._hash.hexdigest(),
                    routes,
                )
            )
            self._write_manifest(complete=False)
        except OSError as exc:
            raise OutputError(f"cannot finish shard in {self.directory}: {exc.strerror or exc}") from exc

    def _write_manifest(self, complete: bool) -> None:
        self.manifest.complete = complete
        self.manifest.last_run = self.run_info
        self.manifest.save(self.directory)

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
