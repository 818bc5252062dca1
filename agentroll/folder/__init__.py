"""The output folder: the only code that touches its files.

`layout` spells every name, `manifest` is the folder's table of contents, `writer` and `recovery` make and
repair it, `reader` and `follow` read it back (a merged view too), `merge` joins folders, `journal` keeps the
calls of groups not yet whole, `job` is a --ray job's folder, `lock` the locks. docs/schema.md describes it.
"""

from .follow import consumed, read_groups
from .layout import COMPRESSIONS, Layout
from .manifest import Manifest, ShardEntry, changed_settings, load_manifest
from .merge import merge
from .reader import ShardFile, as_group, read_records, shard_files, shard_paths, shard_records, stored_groups
from .stdout import StdoutWriter
from .writer import ShardWriter

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
