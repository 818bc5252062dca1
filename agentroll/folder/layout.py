"""Every name in an output folder, spelled once: the rest of the package asks here for paths.

    manifest.json                     what the folder holds (`manifest.Manifest`)
    rollouts-00000.jsonl[.zst]        finished shards: never rewritten once they carry this name
    rollouts-00001.jsonl[.zst].partial  the shard being written (a loader globbing *.jsonl never sees it)
    rollouts-00001.routes[.partial]   routed experts and sampling masks of a shard's records (docs/routed-experts.md)
    .agentroll/lock                   one writer at a time
    .agentroll/keys/NAME.keys         the groups (problem id, content hash) each finished shard holds
    .agentroll/filtered.jsonl         groups left out by --filter-uniform-groups (a rerun skips them too)
    .agentroll/consumers/NAME         a reader's durable position (read_groups(consumer=NAME))
    .agentroll/journal/               finished calls of groups not yet whole (`journal.Journal`)
    .agentroll/demo                   `agentroll demo` made this folder (it overwrites only its own)
    .agentroll/ray/                   a --ray job's plan, driver lock, partition logs; partitions in part-I/

Anything else named `rollouts-*` (a `.tmp` left by a kill during an atomic replace) is a stray: never a shard,
removed by the writer's recovery.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "manifest.json"
STATE_DIR = ".agentroll"
SHARD_PREFIX = "rollouts-"
PARTIAL = ".partial"
TMP = ".tmp"
ZSTD = ".zst"
ROUTES = ".routes"
COMPRESSIONS = ("none", "zstd")
FILTERED = "filtered.jsonl"
CONSUMER_NAME = re.compile(r"[A-Za-z0-9_.-]+")

_SHARD = re.compile(rf"{re.escape(SHARD_PREFIX)}(\d+)\.jsonl({re.escape(ZSTD)})?({re.escape(PARTIAL)})?")
_ROUTES = re.compile(rf"{re.escape(SHARD_PREFIX)}(\d+){re.escape(ROUTES)}({re.escape(PARTIAL)})?")
PART = re.compile(r"part-\d+")


def shard_name(index: int, compression: str = "none") -> str:
    return f"{SHARD_PREFIX}{index:05d}.jsonl" + (ZSTD if compression == "zstd" else "")


def parse_shard(name: str) -> tuple[int, bool, bool] | None:
    """(index, zstd, partial) of a shard file name; None for anything else (a sidecar, a stray temporary)."""
    match = _SHARD.fullmatch(name)
    return None if match is None else (int(match.group(1)), bool(match.group(2)), bool(match.group(3)))


def shard_index(name: str) -> int:
    found = parse_shard(Path(name).name)
    if found is None:
        raise ValueError(f"{name} is not a shard name")
    return found[0]


def is_zstd(name: str | Path) -> bool:
    return str(name).removesuffix(PARTIAL).endswith(ZSTD)


def routes_name(shard: str) -> str:
    """The routes sidecar beside a shard: `rollouts-00003.jsonl[.zst][.partial]` -> `rollouts-00003.routes[.partial]`
    (never compressed)."""
    return shard.split(".")[0] + ROUTES + (PARTIAL if shard.endswith(PARTIAL) else "")


def routes_path(shard: Path) -> Path:
    return shard.with_name(routes_name(shard.name))


def final_name(partial: str) -> str:
    return partial.removesuffix(PARTIAL)


@dataclass(frozen=True, slots=True)
class Layout:
    """The paths of one folder."""

    root: Path

    @property
    def manifest(self) -> Path:
        return self.root / MANIFEST

    @property
    def state(self) -> Path:
        return self.root / STATE_DIR

    @property
    def keys_dir(self) -> Path:
        return self.state / "keys"

    def keys(self, shard: str) -> Path:
        return self.keys_dir / (Path(shard).name.split(".")[0] + ".keys")

    @property
    def filtered(self) -> Path:
        return self.state / FILTERED

    @property
    def lock(self) -> Path:
        return self.state / "lock"

    @property
    def consumers(self) -> Path:
        return self.state / "consumers"

    def consumer(self, name: str) -> Path:
        if not CONSUMER_NAME.fullmatch(name):
            raise ValueError(f"consumer name {name!r}: use letters, digits, '.', '_' and '-'")
        return self.consumers / name

    @property
    def journal(self) -> Path:
        return self.state / "journal"

    @property
    def demo_marker(self) -> Path:
        return self.state / "demo"

    @property
    def ray(self) -> Path:
        return self.state / "ray"

    def part(self, index: int) -> Path:
        return self.root / f"part-{index}"

    def shard(self, index: int, compression: str = "none", partial: bool = False) -> Path:
        return self.root / (shard_name(index, compression) + (PARTIAL if partial else ""))

    def entries(self) -> list[tuple[int, bool, Path]]:
        """Shard files on disk as (index, partial, path), by index, a finished shard before its partial namesake."""
        if not self.root.is_dir():
            return []
        found = []
        for path in self.root.iterdir():
            parsed = parse_shard(path.name)
            if parsed is not None:
                found.append((parsed[0], parsed[2], path))
        return sorted(found)

    def finished(self) -> list[Path]:
        return [path for _, partial, path in self.entries() if not partial]

    def partials(self) -> list[Path]:
        return [path for _, partial, path in self.entries() if partial]

    def strays(self) -> list[Path]:
        """Files named like ours that are neither a shard nor a sidecar: temporaries a kill left behind."""
        if not self.root.is_dir():
            return []
        return sorted(
            p
            for p in self.root.glob(f"{SHARD_PREFIX}*")
            if parse_shard(p.name) is None and _ROUTES.fullmatch(p.name) is None
        )

    def sidecars(self) -> list[Path]:
        """Finished shards' routes sidecars on disk."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob(f"{SHARD_PREFIX}*{ROUTES}") if _ROUTES.fullmatch(p.name))

    def stray_sidecars(self) -> list[Path]:
        """Partial sidecars: their shard held no whole group when the run died (nothing references them)."""
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.glob(f"{SHARD_PREFIX}*{ROUTES}{PARTIAL}"))

    def ours(self) -> list[Path]:
        """Every file of the folder's rollouts (shards, sidecars, strays): what --overwrite removes."""
        if not self.root.is_dir():
            return []
        return sorted(self.root.glob(f"{SHARD_PREFIX}*"))
