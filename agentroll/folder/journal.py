"""The call journal: finished calls of groups not yet whole, kept so that a stop loses only the calls in flight.

A group is written whole or not at all, so without a journal every call of an unfinished group is paid again
after a stop. Each finished call is appended here as one JSON line (`.agentroll/journal/calls-NNNNN.jsonl`),
keyed by the call's identity (problem, content hash, execution, attempt, stage, worker) and a digest of what was
sent (prompt ids, sampling, model). A rerun replays a call whose key and digest match instead of asking the
server again. A line holds the answer as parsed, without the prompt's ids (the request's: the caller has them).
Readers of the folder never see it; no group is ever partly on disk because of it.

Crash safety: a line is one `write` of whole bytes, so a kill -9 or the OOM killer leaves at most a torn last
line, which `open` cuts off. Appends are not fsynced: after a power cut the last moment of calls may be asked
again, never read wrong. A journal made against another server set-up (`fingerprint`: what an answer depends on
beyond the request, `engine.handshake.journal_fingerprint`) is discarded whole; `--overwrite` and changed settings never
reach it (the writer clears the folder, or refuses it).

Size: entries of a group are dropped once it is committed (`settle`, which also appends a tombstone line);
segments are deleted oldest first once they hold no live entry, and live entries are copied forward when the
files pass twice the live bytes: the journal stays within about twice what groups in flight need. Entries of
failed groups stay for the rerun, the oldest dropped first past `max_bytes`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from .files import atomic_write, truncate

log = logging.getLogger("agentroll")

SEGMENT = re.compile(r"calls-(\d+)\.jsonl")
HEADER = "header.json"


@dataclass(slots=True)
class _Entry:
    segment: int
    offset: int
    size: int
    digest: str
    group: tuple[str, str]


class Journal:
    """`get` a finished call of an earlier run, `put` one of this run, `settle` a group once it is stored.

    Segments are deleted oldest first, and only once they hold no live entry: a settled group's tombstone line
    then never outlives the entries it buries, so nothing dead comes back on the next `open`."""

    def __init__(
        self,
        directory: Path,
        fingerprint: dict[str, Any] | None = None,
        segment_bytes: int = 8 << 20,
        max_bytes: int = 1 << 30,
    ) -> None:
        self.directory = Path(directory)
        self.fingerprint = orjson.loads(orjson.dumps(fingerprint or {}, option=orjson.OPT_SORT_KEYS))
        self.segment_bytes, self.max_bytes = segment_bytes, max_bytes
        self.replayed = 0  # calls answered from the journal this run
        self._entries: dict[str, _Entry] = {}
        self._groups: dict[tuple[str, str], list[str]] = {}  # live keys per group
        self._failed: OrderedDict[tuple[str, str], None] = OrderedDict()  # oldest first
        self._sizes: dict[int, int] = {}  # segment -> bytes on disk, oldest first
        self._live: dict[int, int] = {}  # segment -> bytes of live entries
        self._live_bytes = 0  # their sum, kept as they change (not summed per call)
        self._current = 0
        self._file: Any = None
        self._readers: dict[int, int] = {}

    # -- opening ----------------------------------------------------------------------------------------------
    def open(self, done: dict[str, str] | None = None) -> int:
        """Load what earlier runs left (cutting a torn tail); drop the entries of groups in `done` (problem id
        -> content hash, already on disk); return how many calls can be replayed."""
        self.directory.mkdir(parents=True, exist_ok=True)
        header = self.directory / HEADER
        try:
            earlier = orjson.loads(header.read_bytes()) if header.exists() else None
        except orjson.JSONDecodeError:
            earlier = None
        segments = sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := SEGMENT.fullmatch(p.name)))
        if segments and earlier != self.fingerprint:
            log.warning(
                "%s: made against another server set-up; its %d segment(s) are discarded (their calls are asked again)",
                self.directory,
                len(segments),
            )
            for index in segments:
                self._path(index).unlink()
            segments = []
        atomic_write(header, orjson.dumps(self.fingerprint))
        for index in segments:
            self._load(index, done or {})
        self._current = max(segments, default=-1) + 1
        self._sweep()
        return len(self._entries)

    def _path(self, index: int) -> Path:
        return self.directory / f"calls-{index:05d}.jsonl"

    def _load(self, index: int, done: dict[str, str]) -> None:
        path = self._path(index)
        data = path.read_bytes()
        offset = 0
        for line in data.split(b"\n")[:-1]:  # the element after the last newline: empty, or a torn line
            try:
                head = orjson.loads(line)
                group = (str(head["g"][0]), str(head["g"][1]))
                if head.get("settled"):
                    self._forget(group)
                elif done.get(group[0]) != group[1]:
                    self._add(str(head["k"]), _Entry(index, offset, len(line) + 1, str(head["d"]), group))
            except (orjson.JSONDecodeError, KeyError, TypeError, IndexError):
                break  # torn (or damaged): nothing after it is trusted
            offset += len(line) + 1
        if offset != len(data):
            truncate(path, offset)
        self._sizes[index] = offset
        self._live.setdefault(index, 0)

    def _add(self, key: str, entry: _Entry) -> None:
        old = self._entries.get(key)
        if old is not None:
            self._live[old.segment] -= old.size
            self._live_bytes -= old.size
        else:
            self._groups.setdefault(entry.group, []).append(key)
        self._entries[key] = entry
        self._live[entry.segment] = self._live.get(entry.segment, 0) + entry.size
        self._live_bytes += entry.size

    def _forget(self, group: tuple[str, str]) -> None:
        for key in self._groups.pop(group, []):
            entry = self._entries.pop(key, None)
            if entry is not None:
                self._live[entry.segment] -= entry.size
                self._live_bytes -= entry.size

    # -- use --------------------------------------------------------------------------------------------------
    def get(self, key: str, digest: str) -> dict[str, Any] | None:
        """The journaled answer to this call (as `put` was given it), if one was made for exactly this request."""
        entry = self._entries.get(key)
        if entry is None or entry.digest != digest:
            return None
        try:
            answer = orjson.loads(os.pread(self._reader(entry.segment), entry.size, entry.offset))["c"]
            if not isinstance(answer, dict):
                raise ValueError("not an answer")
        except (OSError, orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            log.warning("%s: an entry could not be read back (%s); the call is asked again", self.directory, exc)
            return None
        self.replayed += 1
        return answer

    def put(self, key: str, digest: str, group: tuple[str, str], answer: dict[str, Any]) -> None:
        """Keep a finished call's answer (JSON-able). A failure to write (disk full) costs only the journal: the
        run goes on."""
        line = orjson.dumps({"k": key, "d": digest, "g": list(group), "c": answer}) + b"\n"
        try:
            offset = self._write(line)
        except OSError as exc:
            log.warning(
                "%s: cannot write the call journal (%s); a stop now loses the calls of unfinished groups",
                self.directory,
                exc.strerror or exc,
            )
            return
        self._failed.pop(group, None)  # a failed group that runs again is in flight again
        self._add(key, _Entry(self._current, offset, len(line), digest, group))
        if self._live_bytes > self.max_bytes:
            self._shed()

    def settle(self, problem_id: str, content_hash: str, failed: bool = False) -> None:
        """The group is on disk (or filtered, or cannot run): its entries are dead. A `failed` group's stay for
        the rerun, until `max_bytes` sheds the oldest."""
        group = (problem_id, content_hash)
        if group not in self._groups:
            return
        if failed:
            self._failed[group] = None
            return
        self._forget(group)
        self._failed.pop(group, None)
        with contextlib.suppress(OSError):  # a tombstone: the entries may live on in a segment still kept
            self._write(orjson.dumps({"g": list(group), "settled": True}) + b"\n")
        self._sweep()

    @property
    def live(self) -> int:
        """Calls kept for groups not yet on disk."""
        return len(self._entries)

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        self._sweep(including_current=True)
        for fd in self._readers.values():
            os.close(fd)
        self._readers.clear()

    # -- segments ---------------------------------------------------------------------------------------------
    def _write(self, line: bytes) -> int:
        """Append one whole line to the current segment; return its offset."""
        if self._file is None or self._sizes.get(self._current, 0) >= self.segment_bytes:
            self._rotate()
        offset = self._sizes[self._current]
        view = memoryview(line)
        while view:
            view = view[self._file.write(view) :]
        self._sizes[self._current] = offset + len(line)
        return offset

    def _rotate(self) -> None:
        if self._file is not None:
            self._file.close()
            self._current += 1
        self._file = open(self._path(self._current), "ab", buffering=0)  # noqa: SIM115 - kept open across calls
        self._sizes[self._current] = self._file.tell()
        self._live.setdefault(self._current, 0)
        self._compact()
        self._sweep()

    def _compact(self) -> None:
        """When the segments on disk pass twice the live bytes (plus two segments' room), copy every live entry of
        the older segments into the current one: they all die, and `_sweep` deletes them. Each copy follows at
        least as many new bytes as it moves, so compaction costs O(1) per byte written."""
        if sum(self._sizes.values()) <= 2 * self._live_bytes + 2 * self.segment_bytes:
            return
        for key, entry in [(k, e) for k, e in self._entries.items() if e.segment != self._current]:
            line = os.pread(self._reader(entry.segment), entry.size, entry.offset)
            offset = self._sizes[self._current]
            view = memoryview(line)
            while view:
                view = view[self._file.write(view) :]
            self._sizes[self._current] = offset + len(line)
            self._live[entry.segment] -= entry.size
            self._entries[key] = _Entry(self._current, offset, entry.size, entry.digest, entry.group)
            self._live[self._current] += entry.size

    def _sweep(self, including_current: bool = False) -> None:
        """Delete dead segments from the oldest on, stopping at the first one still holding a live entry."""
        for index in sorted(self._sizes):
            if self._live.get(index, 0) > 0 or (index == self._current and not including_current):
                return
            reader = self._readers.pop(index, None)
            if reader is not None:
                os.close(reader)
            with contextlib.suppress(FileNotFoundError):
                self._path(index).unlink()
            del self._sizes[index]
            self._live.pop(index, None)

    def _shed(self) -> None:
        """Past `max_bytes`: forget failed groups' entries, oldest first (their reruns ask again)."""
        while self._failed and self._live_bytes > self.max_bytes:
            group, _ = self._failed.popitem(last=False)
            self.settle(*group)

    def _reader(self, index: int) -> int:
        fd = self._readers.get(index)
        if fd is None:
            fd = self._readers[index] = os.open(self._path(index), os.O_RDONLY)
        return fd
