"""`manifest.json`: what a folder holds. One type loads it (checking its shape), and saves it atomically.

Every folder tool reads it through `Manifest.load`, so a broken manifest is the same one line (`OutputError`,
exit 6, naming the file) in `stats`, `convert`, `merge` or a reader. Counts of the whole folder are derived from
its shards, never stored apart from them. `folder_id` is made when a folder starts (new, or `--overwrite`) and
kept by resumes: a follower or a consumer position of an earlier dataset in the same place is told apart by it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import OutputError, json_kind
from ..record.schema import SCHEMA_VERSION
from .files import atomic_write
from .layout import MANIFEST, Layout

FORMAT = "agentroll.rollouts"


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(slots=True)
class RoutesEntry:
    file: str
    bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "bytes": self.bytes, "sha256": self.sha256}


@dataclass(slots=True)
class ShardEntry:
    """A finished shard: `file` relative to the folder (a merged view points into other folders)."""

    file: str
    records: int
    executions: int
    groups: int
    bytes: int
    sha256: str
    routes: RoutesEntry | None = None
    source: str | None = None  # a merged view: the folder the shard came from
    finished_at: float | None = None  # when it took its final name (seconds since the epoch): throughput over time

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "file": self.file,
            "records": self.records,
            "executions": self.executions,
            "groups": self.groups,
            "bytes": self.bytes,
            "sha256": self.sha256,
        }
        if self.routes is not None:
            out["routes"] = self.routes.to_dict()
        if self.source is not None:
            out["from"] = self.source
        if self.finished_at is not None:
            out["finished_at"] = self.finished_at
        return out

    @classmethod
    def parse(cls, data: Any, where: str) -> ShardEntry:
        if not isinstance(data, dict) or not isinstance(data.get("file"), str) or not data["file"]:
            raise ValueError(f"{where} has no file name")
        for name in ("records", "executions", "groups", "bytes"):
            if not _int(data.get(name)):
                raise ValueError(f"{where} ({data['file']}): '{name}' is not a count")
        if not isinstance(data.get("sha256"), str):
            raise ValueError(f"{where} ({data['file']}): no sha256")
        routes = data.get("routes")
        side = None
        if routes is not None:
            if not (
                isinstance(routes, dict)
                and isinstance(routes.get("file"), str)
                and _int(routes.get("bytes"))
                and isinstance(routes.get("sha256"), str)
            ):
                raise ValueError(f"{where} ({data['file']}): 'routes' is not a sidecar entry")
            side = RoutesEntry(routes["file"], routes["bytes"], routes["sha256"])
        source, finished = data.get("from"), data.get("finished_at")
        return cls(
            data["file"],
            data["records"],
            data["executions"],
            data["groups"],
            data["bytes"],
            data["sha256"],
            side,
            source if isinstance(source, str) else None,
            float(finished) if isinstance(finished, int | float) and not isinstance(finished, bool) else None,
        )


@dataclass(slots=True)
class Manifest:
    settings: dict[str, Any]
    shards: list[ShardEntry] = field(default_factory=list)
    complete: bool = False
    schema_version: int = SCHEMA_VERSION
    filtered_groups: int = 0
    servers: list[dict[str, Any]] = field(default_factory=list)
    last_run: dict[str, Any] = field(default_factory=dict)
    folder_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    merged_from: list[dict[str, Any]] | None = None
    path: Path | None = None  # where it was read from, for messages

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def executions(self) -> int:
        return sum(s.executions for s in self.shards)

    @property
    def groups(self) -> int:
        return sum(s.groups for s in self.shards)

    @property
    def system(self) -> Any:
        return self.settings.get("system")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "format": FORMAT,
            "schema_version": self.schema_version,
            "folder_id": self.folder_id,
            "complete": self.complete,
            "records": self.records,
            "executions": self.executions,
            "groups": self.groups,
            "filtered_groups": self.filtered_groups,
            "shards": [s.to_dict() for s in self.shards],
            "settings": self.settings,
            "servers": self.servers,
            "last_run": self.last_run,
        }
        if self.merged_from is not None:
            out["merged_from"] = self.merged_from
        return out

    def save(self, folder: Path) -> None:
        atomic_write(Layout(folder).manifest, orjson.dumps(self.to_dict(), option=orjson.OPT_INDENT_2))

    @classmethod
    def load(cls, folder: str | Path) -> Manifest:
        """The folder's manifest, or one `OutputError` line naming the file and what is wrong."""
        path = Layout(Path(folder)).manifest
        if path.is_dir():
            raise in_the_way(path)
        if path.parent.is_file():  # a shard or an input given for the folder: said as generate says it
            raise OutputError(f"{path.parent} is a file, not a folder: give the output folder that holds {MANIFEST}")
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            what = (
                "no such folder"
                if not path.parent.exists()
                else ("not a folder" if not path.parent.is_dir() else f"no {MANIFEST}: not an agentroll output folder")
            )
            raise OutputError(f"{path.parent}: {what}") from None
        except OSError as exc:
            raise OutputError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
        return cls.parse(data, path)

    @classmethod
    def parse(cls, data: bytes, path: Path) -> Manifest:
        try:
            raw = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise OutputError(f"{path}: not a readable agentroll manifest ({exc})") from None
        try:
            return cls.from_dict(raw, path)
        except ValueError as exc:
            raise OutputError(f"{path}: not an agentroll manifest: {exc}") from None

    @classmethod
    def from_dict(cls, raw: Any, path: Path | None = None) -> Manifest:
        if not isinstance(raw, dict):
            raise ValueError(f"{json_kind(raw)}, not an object")
        if raw.get("format") != FORMAT:
            raise ValueError(f"format is {raw.get('format')!r}, not {FORMAT!r}")
        if not _int(raw.get("schema_version")):
            raise ValueError("no schema_version")
        if not isinstance(raw.get("settings"), dict):
            raise ValueError("no settings")
        if not isinstance(raw.get("shards"), list):
            raise ValueError("no shard list")
        shards = [ShardEntry.parse(s, f"shard {i + 1}") for i, s in enumerate(raw["shards"])]
        merged = raw.get("merged_from")
        if merged is not None and not (isinstance(merged, list) and all(isinstance(m, dict) for m in merged)):
            raise ValueError("merged_from is not a list of folders")
        servers = raw.get("servers")
        last_run = raw.get("last_run")
        folder_id = raw.get("folder_id")
        return cls(
            settings=raw["settings"],
            shards=shards,
            complete=raw.get("complete") is True,
            schema_version=raw["schema_version"],
            filtered_groups=raw["filtered_groups"] if _int(raw.get("filtered_groups")) else 0,
            servers=[s for s in servers if isinstance(s, dict)] if isinstance(servers, list) else [],
            last_run=last_run if isinstance(last_run, dict) else {},
            folder_id=folder_id if isinstance(folder_id, str) and folder_id else "",
            merged_from=merged,
            path=path,
        )


def in_the_way(path: Path) -> OutputError:
    """A directory where the manifest goes: not ours, so nothing (--overwrite neither) removes it."""
    return OutputError(
        f"{path} is a directory, not an agentroll manifest: move it away (--overwrite removes only agentroll's "
        "own files)"
    )


RESUMED = (130, 143)  # a run stopped by a signal is resumed (a supervisor, a requeued job): not an end


def run_exit(last_run: Any) -> tuple[int, str] | None:
    """How the folder's last run ended, as it recorded (`last_run.exit`: code and reason); None while it runs,
    after a kill (it recorded nothing) or in a folder written before runs recorded it."""
    found = last_run.get("exit") if isinstance(last_run, dict) else None
    if not isinstance(found, dict) or type(found.get("code")) is not int:
        return None
    return found["code"], str(found.get("reason") or "")


def unfinished(complete: Any, last_run: Any) -> str | None:
    """What a reader of a folder whose run did not complete should know about it, in one phrase (None: it did)."""
    if complete is True:
        return None
    ended = run_exit(last_run)
    if ended is None:
        return "the manifest says the run is not complete (still running, or stopped or killed before its end)"
    code, reason = ended
    return (
        f"the manifest says the run is not complete: its last run ended with exit {code}"
        f"{f' ({reason})' if reason else ''}; run generate again to finish it"
    )


def load_manifest(folder: str | Path) -> Manifest:
    return Manifest.load(folder)


def changed_settings(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[tuple[str, Any, Any]]:
    """The settings that differ as (name, old, new), nested ones by their dotted name (`sampling.temperature`); a
    list of named settings (a head-to-head run's `policies`) by each one's name (`policies.new.model`), or as its
    names when those differ or come in another order."""
    out: list[tuple[str, Any, Any]] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += changed_settings(a, b, f"{prefix}{key}.")
        elif isinstance(a, list) and isinstance(b, list) and _names(a) is not None and _names(b) is not None:
            if _names(a) != _names(b):
                out.append((prefix + key, _names(a), _names(b)))
            else:
                for x, y in zip(a, b, strict=True):
                    out += changed_settings(x, y, f"{prefix}{key}.{x['name']}.")
        elif a != b:
            out.append((prefix + key, a, b))
    return out


def _names(value: Any) -> list[str] | None:
    """The names of a list of named settings (each a dict with a `name`), else None."""
    if not isinstance(value, list) or not all(isinstance(v, dict) and isinstance(v.get("name"), str) for v in value):
        return None
    return [v["name"] for v in value]
