"""What `validate` reports: each `Fault` at its shard and line, gathered in a `ValidationReport`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..folder.layout import MANIFEST

MAX_FAULTS = 1000  # kept in the report; more are counted (`faults_total`), so a ruined folder cannot eat memory


@dataclass(frozen=True, slots=True)
class Fault:
    """One thing wrong. `shard` is the shard's path as the manifest names it (None: the manifest itself);
    `line` is 1-based (None: the shard or manifest as a whole)."""

    kind: str  # manifest, missing, bytes, sha256, json, schema, value, lengths, execution, conversation, group,
    #            duplicate, count, keys, zstd, routes
    message: str
    shard: str | None = None
    line: int | None = None

    @property
    def where(self) -> str:
        if self.shard is None:
            return MANIFEST
        return f"{self.shard}:{self.line}" if self.line is not None else self.shard

    def __str__(self) -> str:
        return f"{self.where}: {self.kind}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "line": self.line, "kind": self.kind, "message": self.message}


@dataclass(slots=True)
class ValidationReport:
    """What `validate` found. Counts are of what the shards hold (records: lines that are JSON objects)."""

    folder: str
    merged: bool = False
    shards: int = 0
    records: int = 0
    executions: int = 0
    groups: int = 0
    faults: list[Fault] = field(default_factory=list)  # in reading order, at most MAX_FAULTS
    faults_total: int = 0
    warnings: list[str] = field(default_factory=list)  # worth knowing, not wrong (a run in progress...)

    @property
    def ok(self) -> bool:
        return self.faults_total == 0

    @property
    def first(self) -> Fault | None:
        return self.faults[0] if self.faults else None

    def add(self, fault: Fault) -> None:
        self.faults_total += 1
        if len(self.faults) < MAX_FAULTS:
            self.faults.append(fault)

    def lines(self, limit: int = 20) -> list[str]:
        """The CLI's text: a verdict, the first fault with its shard and line, then up to `limit` others."""
        counts = f"{self.shards} shards, {self.records} records, {self.executions} executions, {self.groups} groups"
        out = [f"warning: {w}" for w in self.warnings]
        if self.ok:
            return [*out, f"{self.folder}: ok ({'merged; ' if self.merged else ''}{counts})"]
        assert self.first is not None
        out.append(f"{self.folder}: {self.faults_total} fault{'s' * (self.faults_total != 1)} ({counts})")
        out.append(f"first fault: {self.first}")
        rest = self.faults[1 : 1 + limit]
        out += [f"  {fault}" for fault in rest]
        more = self.faults_total - 1 - len(rest)
        if more > 0:
            out.append(f"  ... and {more} more")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "ok": self.ok,
            "merged": self.merged,
            "shards": self.shards,
            "records": self.records,
            "executions": self.executions,
            "groups": self.groups,
            "faults_total": self.faults_total,
            "faults": [f.to_dict() for f in self.faults],
            "warnings": list(self.warnings),
        }
