"""The output folder: the only code that touches its files.

`layout` spells every name, `manifest` is the folder's table of contents, `writer` and `recovery` make and
repair it, `reader` and `follow` read it back (a merged view too), `keys` keeps what each shard holds, `merge`
joins folders, `journal` keeps the calls of groups not yet whole, `job` is a --ray job's folder, `lock` the
locks. docs/schema.md describes it. Data flows one way: no reader imports the writer, and importing this
package does not load it either (`ShardWriter` is imported when first asked for).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .follow import consumed, read_groups
from .layout import COMPRESSIONS, Layout
from .manifest import Manifest, ShardEntry, changed_settings, load_manifest
from .merge import merge
from .reader import ShardFile, as_group, read_records, shard_files, shard_paths, shard_records, stored_groups
from .stdout import StdoutWriter

if TYPE_CHECKING:
    from .writer import ShardWriter


def __getattr__(name: str) -> Any:
    if name == "ShardWriter":
        return importlib.import_module(".writer", __name__).ShardWriter
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "COMPRESSIONS",
    "Layout",
    "Manifest",
    "ShardEntry",
    "ShardFile",
    "ShardWriter",
    "StdoutWriter",
    "as_group",
    "changed_settings",
    "consumed",
    "load_manifest",
    "merge",
    "read_groups",
    "read_records",
    "shard_files",
    "shard_paths",
    "shard_records",
    "stored_groups",
]
