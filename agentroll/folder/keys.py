"""Keys files (`.agentroll/keys/NAME.keys`): the groups, as (problem id, content hash), a finished shard holds.

They are derived data, written before the shard takes its final name: a resume reads them instead of every
shard, merge to find problems in two parts. A missing or damaged one is rebuilt from its shard
(`recovery.rebuild_keys`), never trusted.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import orjson

from .files import atomic_write
from .layout import Layout
from .shards import GroupKey


def write_keys(layout: Layout, shard: str, keys: Iterable[GroupKey]) -> None:
    atomic_write(layout.keys(shard), orjson.dumps([list(k) for k in keys]))


def read_keys(path: Path) -> list[GroupKey] | None:
    """A keys file's (problem id, content hash) pairs; None when it is missing or not such a list (it is derived
    data: the caller rebuilds it from its shard)."""
    try:
        keys = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    if not isinstance(keys, list) or not all(
        isinstance(k, list) and len(k) == 2 and all(isinstance(x, str) for x in k) for k in keys
    ):
        return None
    return [(k[0], k[1]) for k in keys]
