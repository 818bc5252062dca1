"""The viewer's index of a folder: a row per group, with where to read it back, built by a follower.

A thread follows the folder as `read_groups(follow=True)` does (finished shards, then a live run's partial one;
it ends once the manifest is final), turning each group into its row as it comes, so the page lists groups
while the index is still being built and new groups appear while a run writes them. Only rows and places are
kept: a group's records are read again from its shard when it is opened (`Shelf`), and the last few opened are
kept as the page's data. A group read again from a new place (its shard finished and renamed) moves its row;
an overwritten folder (a new `folder_id`) starts the index over.

Search reads the shards: a group matches when the query, case-folded, is in the text of one of its records
(`TEXT`: the response, answer, reward info, label, problem, metadata, tool calls, ids), not in its token ids
or the rendered prompts. The raw JSON text is scanned first (each shard read once), then the lines that hold it
parsed; it stops at `MOST_FOUND` groups (a common word in a large folder), and says so.
"""

from __future__ import annotations

import bisect
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from ...errors import AgentrollError, OutputError, RunEnded
from ...folder import as_group, load_manifest
from ...folder.follow import placed
from ...folder.masks import with_counts
from ...folder.places import Place, Shelf
from .audit import Audit
from .detail import detail
from .rows import Words, broken, row
from .tokens import Decoder

log = logging.getLogger("agentroll")
OPENED = 16  # groups' page data kept (the last opened)
WINDOW = 100_000  # rows the page holds at once (about 1 KiB of its memory each): a larger folder is paged by ranges
MOST_FOUND = 2000  # groups a search lists (it says when more match: a narrower query finds them)
TEXT = ("problem_id", "rollout_id", "response", "content", "reward_info", "label", "problem", "metadata", "tool_calls")


def searchable(record: dict[str, Any]) -> str:
    """A record's text a search looks in, case-folded."""
    parts = []
    for name in TEXT:
        value = record.get(name)
        if value is not None:
            parts.append(value if isinstance(value, str) else orjson.dumps(value).decode())
    return "\n".join(parts).casefold()


def prefilter(query: str) -> bytes | None:
    """What the query looks like in a shard's JSON text, lowered (None: not ASCII, so the raw text cannot be
    lowered alike: every group is a candidate)."""
    if not query.isascii():
        return None
    return orjson.dumps(query)[1:-1].lower()


class Index:
    """See the module's docstring. `follow`: keep following a live run (False: one pass over what is there)."""

    def __init__(
        self, folder: Path, decoder: Decoder, audit: Audit | None = None, follow: bool = True, poll_s: float = 1.0
    ) -> None:
        self.folder, self.decoder, self.audit = folder, decoder, audit
        self.follow, self.poll_s = follow, poll_s
        self.window = WINDOW
        self.records = 0  # in the rows
        self.lines: list[bytes] = []  # each row as its JSON: a third of the memory of the dict, sent as it is
        self.places: list[Place] = []
        self.numbers: dict[str, int] = {}
        self.shards: list[str] = []
        self.moved: list[int] = []  # rows whose place changed, in order: the page asks for those after its last
        self.generation = 0  # starts over when the folder is overwritten
        self.identity: str | None = None
        self.words: Words | None = None
        self.error: str | None = None
        self.ended: str | None = None  # the run ended without completing, and nothing writes the folder now
        self.done = threading.Event()
        self.stop = threading.Event()
        self.lock = threading.RLock()  # `rows` may be read under it (a `wait_for` condition)
        self.changed = threading.Condition(self.lock)  # notified as rows come, move, or the follower ends
        self.shelf = Shelf()
        self.shelf_lock = threading.Lock()
        self.opened: OrderedDict[int, tuple[Place, dict[str, Any]]] = OrderedDict()

    def start(self) -> Index:
        threading.Thread(target=self.run, name="agentroll-view-index", daemon=True).start()
        return self

    def run(self) -> None:
        try:
            for identity, place, records, fresh in placed(self.folder, self.follow, self.poll_s, self.stop):
                self.add(identity, place, records, fresh)
        except RunEnded as exc:  # not a fault of the folder: what it holds is shown, and why no more will come
            self.ended = str(exc)
            log.warning("%s", exc)
        except AgentrollError as exc:
            self.error = str(exc)
            log.error("%s", exc)
        except Exception as exc:  # a bug: said on the page and in the log, the page keeps what it has
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("the viewer's index stopped")
        finally:
            self.done.set()
            with self.changed:
                self.changed.notify_all()

    def wait_for(self, condition: Callable[[Index], bool], timeout: float) -> bool:
        """Block until `condition(self)` holds (re-checked as rows come and move); False after `timeout`."""
        with self.changed:
            return self.changed.wait_for(lambda: condition(self), timeout)

    def system(self) -> Words:
        if self.words is None:
            try:
                self.words = Words.of(load_manifest(self.folder))
            except OutputError:
                return Words.of(None)  # no manifest yet: asked again with the first group
        return self.words

    def shard(self, place: Place) -> int:
        name = os.path.relpath(place.path, self.folder)
        if name not in self.shards:
            self.shards.append(name)
        return self.shards.index(name)

    def add(self, identity: str, place: Place, records: list[dict[str, Any]], fresh: bool) -> None:
        with self.lock:
            if identity != self.identity:
                if self.identity:  # overwritten: another dataset in the same place
                    self.lines, self.places, self.numbers, self.moved, self.shards = [], [], {}, [], []
                    self.records = 0
                    self.opened.clear()
                    self.generation += 1
                    self.words = None
                self.identity = identity
            pid = str(records[0].get("problem_id"))
            number = self.numbers.get(pid)
            if number is not None:  # read again from its new place
                if not fresh:
                    self.places[number] = place
                    moved = orjson.loads(self.lines[number])
                    moved.update(shard=self.shard(place), line=place.line, live=not place.finished)
                    self.lines[number] = _kept(moved)
                    self.moved.append(number)
                    self.changed.notify_all()
                return
            number = len(self.lines)
            made = entry(number, place, self.shard(place), records, self.system(), self.audit)
            made["live"] = not place.finished
            self.lines.append(_kept(made))
            self.records += len(records)
            self.places.append(place)
            self.numbers[pid] = number
            self.changed.notify_all()

    def group(self, number: int) -> dict[str, Any]:
        """The page's data for a group (`IndexError`: no such row)."""
        with self.lock:
            place = self.places[number]
            kept = self.opened.get(number)
        if kept is not None and kept[0] == place:
            return kept[1]
        with self.shelf_lock:
            records = self.shelf.records(place)
        records = with_counts(place.path, records)  # a sampling mask: how many tokens survived at each step
        made = page_data(number, place, records, self.system(), self.decoder, self.audit)
        with self.lock:
            self.opened[number] = (place, made)
            while len(self.opened) > OPENED:
                self.opened.popitem(last=False)
        return made

    def raw(self, number: int, at: int) -> dict[str, Any]:
        """A group's record as it is on disk, with its file and line."""
        with self.lock:
            place = self.places[number]
        with self.shelf_lock:
            records = self.shelf.records(place)
        return {"file": place.path.name, "line": place.line + at, "record": records[at]}

    def search(self, query: str, most: int = MOST_FOUND) -> tuple[list[int], bool]:
        """The rows whose records hold `query` (see the module's docstring), in folder order, the first `most`
        of them; and whether more match. Its own shelf: a group opened meanwhile does not wait for it."""
        needle = query.casefold()
        raw = prefilter(query)
        with self.lock:
            numbers = {id(place): n for n, place in enumerate(self.places)}
            places = sorted(self.places, key=lambda p: (str(p.path), p.frame_start, p.start))
        found: list[int] = []
        for text, spans in Shelf().regions(places):
            low = text.lower() if raw is not None else b""
            starts = [start for _, start, _ in spans]
            hits: list[int] = []  # the spans the raw text holds the query in, in order
            at = low.find(raw) if raw is not None else -1
            while at >= 0:
                hit = bisect.bisect_right(starts, at) - 1
                inside = hit >= 0 and at < spans[hit][2]  # else in bytes no listed group holds (a torn tail)
                if inside:
                    hits.append(hit)
                at = low.find(raw, max(spans[hit][2] if inside else 0, at + 1)) if raw is not None else -1
            for i in hits if raw is not None else range(len(spans)):
                place, start, end = spans[i]
                lines = text[start:end].split(b"\n")[: place.records]
                candidates = [line for line in lines if raw is None or raw in line.lower()]
                if any(needle in searchable(orjson.loads(line)) for line in candidates):
                    if len(found) == most:
                        return sorted(found), True
                    found.append(numbers[id(place)])
        return sorted(found), False

    def final(self) -> bool:
        """The manifest says the folder is done (complete, or a merged view): what is listed is all there is."""
        try:
            manifest = load_manifest(self.folder)
        except OutputError:
            return False
        return bool(manifest.complete or manifest.merged_from is not None)

    def status(self) -> dict[str, Any]:
        w = self.system()
        return {
            "final": self.final(),
            "folder": str(self.folder),
            "system": w.to_dict(),
            "generation": self.generation,
            "groups": len(self.lines),
            "records": self.records,
            "window": self.window,
            "moved": len(self.moved),
            "shards": list(self.shards),
            "live": not self.done.is_set(),
            "following": self.follow,
            "error": self.error,
            "ended": self.ended,
            "tokenizer": self.decoder.status(),
            "audit": self.audit.summary if self.audit is not None else None,
        }

    @property
    def rows(self) -> list[dict[str, Any]]:
        """Every row, as dicts (a copy: decoded from their JSON)."""
        with self.lock:
            return [orjson.loads(line) for line in self.lines]

    def rows_after(self, start: int, moved: int, most: int) -> bytes:
        """The page's next rows (`most` from `start`) and the rows moved since its `moved`-th, as JSON."""
        with self.lock:
            head = orjson.dumps(
                {
                    "generation": self.generation,
                    "start": start,
                    "groups": len(self.lines),
                    "moved_count": len(self.moved),
                    "shards": self.shards,
                }
            )
            rows = b",".join(self.lines[start : start + most])
            changed = b",".join(self.lines[n] for n in self.moved[moved:])
        return head[:-1] + b',"rows":[' + rows + b'],"moved":[' + changed + b"]}"


def _kept(row: dict[str, Any]) -> bytes:
    """A row's JSON to keep: a copy of its exact size (orjson's own bytes keep the 4 KiB it wrote them in)."""
    return bytes(memoryview(orjson.dumps(row)))


def entry(
    number: int, place: Place, shard: int, records: list[dict[str, Any]], w: Words, audit: Audit | None
) -> dict[str, Any]:
    """A group's row (`rows.row`), or a flagged one when its records are not of the schema."""
    try:
        made = row(number, place, shard, records, as_group(records), w)
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError) as exc:
        made = broken(number, place, shard, records, f"{type(exc).__name__}: {exc}")
    if audit is not None:
        named, failed = audit.count(records)
        if named:
            made["audit"] = [named, failed]
    return made


def page_data(
    number: int, place: Place, records: list[dict[str, Any]], w: Words, decoder: Decoder, audit: Audit | None
) -> dict[str, Any]:
    """A group's data for the page; a group whose records are not of the schema shows them raw."""
    try:
        group = as_group(records)
    except (TypeError, ValueError, KeyError) as exc:
        return {"n": number, "id": str(records[0].get("problem_id")), "broken": str(exc), "records": records}
    return detail(number, place, records, group, w, decoder, audit)
