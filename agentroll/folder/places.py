"""Where each group of a folder lies, and reading it back from there: `agentroll view` lists a folder's groups
once, then opens any of them on demand, without holding the records in memory.

A `Place` is a group's shard, its first record's line (1-based, as `validate` counts them: in the decompressed
text of a zstd shard) and its bytes: for a plain shard the group's own; for a zstd shard the frame that holds it
(the group's own frame while the shard is written, the whole shard once it is finished) and the group's text
within it. A `Shelf` reads places back, keeping the last few decompressed frames so that the groups of a
finished zstd shard do not each decompress it all. A place read back is checked to be its group still (the
folder may have been overwritten, the partial shard finished and renamed): else `Moved`, one line.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..errors import OutputError
from .layout import PARTIAL

KEPT_FRAMES = 4  # decompressed zstd frames a shelf keeps (a finished shard is one frame)


class Moved(OutputError):
    """A place that no longer holds its group: its shard was renamed, recovered or overwritten since it was read."""


@dataclass(frozen=True, slots=True)
class Place:
    path: Path
    problem_id: str
    line: int  # the group's first record's line in its shard, 1-based
    records: int
    frame_start: int  # file bytes to read
    frame_end: int
    start: int  # the group's text within those bytes, once decompressed
    end: int
    zstd: bool

    @property
    def finished(self) -> bool:
        """In a finished shard (False: in the shard a run is writing, or a crashed run left)."""
        return not self.path.name.endswith(PARTIAL)

    @property
    def where(self) -> str:
        """FILE:LINE of the group's first record, as an editor or `sed -n LINEp` takes it."""
        return f"{self.path.name}:{self.line}"


class Shelf:
    """Reads groups back from their places (see the module's docstring)."""

    def __init__(self) -> None:
        self.frames: OrderedDict[tuple[str, int, int, int], bytes] = OrderedDict()

    def _frame(self, path: Path, start: int, end: int, zstd: bool) -> bytes:
        try:
            with open(path, "rb") as f:
                size = f.seek(0, 2)
                if size < end:
                    raise Moved(f"{path} is shorter than when it was read: its folder changed (reload the page)")
                key = (str(path), start, end, size)
                if zstd and key in self.frames:
                    self.frames.move_to_end(key)
                    return self.frames[key]
                f.seek(start)
                data = f.read(end - start)
        except FileNotFoundError:
            raise Moved(f"{path} is not there any more (the run finished or recovered it): reload") from None
        except OSError as exc:
            raise OutputError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
        if not zstd:
            return data
        import zstandard

        try:
            text = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True).read()
        except zstandard.ZstdError as exc:
            raise Moved(f"{path}: the frame read before does not decompress now ({exc})") from None
        self.frames[key] = text
        while len(self.frames) > KEPT_FRAMES:
            self.frames.popitem(last=False)
        return text

    def block(self, place: Place) -> bytes:
        """The group's JSONL text."""
        return self._frame(place.path, place.frame_start, place.frame_end, place.zstd)[place.start : place.end]

    def records(self, place: Place) -> list[dict[str, Any]]:
        """The group's records, checked to be its group still."""
        lines = self.block(place).split(b"\n")[: place.records]
        try:
            records = [orjson.loads(line) for line in lines]
        except orjson.JSONDecodeError:
            records = []
        if (
            len(records) != place.records
            or not all(isinstance(r, dict) for r in records)
            or str(records[0].get("problem_id")) != place.problem_id
        ):
            raise Moved(f"{place.where} no longer holds problem {place.problem_id!r}: its folder changed (reload)")
        return records

    def regions(self, places: Iterable[Place]) -> Iterator[tuple[bytes, list[tuple[Place, int, int]]]]:
        """The text the places lie in, each read once (a plain shard whole, a zstd frame decompressed), with each
        place's (start, end) in it: for a search, which scans a shard's text at once. Places in shard order."""

        def key(place: Place) -> tuple[Path, int]:
            return place.path, place.frame_start if place.zstd else -1

        pending: list[Place] = []
        for place in [*places, None]:
            if pending and (place is None or key(place) != key(pending[0])):
                yield self._region(pending)
                pending = []
            if place is not None:
                pending.append(place)

    def _region(self, places: list[Place]) -> tuple[bytes, list[tuple[Place, int, int]]]:
        head = places[0]
        if head.zstd:
            return self._frame(head.path, head.frame_start, head.frame_end, True), [(p, p.start, p.end) for p in places]
        try:
            text = head.path.read_bytes()
        except FileNotFoundError:
            raise Moved(f"{head.path} is not there any more (the run finished or recovered it)") from None
        except OSError as exc:
            raise OutputError(f"{head.path}: cannot read it ({exc.strerror or exc})") from exc
        return text, [(p, p.frame_start, p.frame_end) for p in places]
