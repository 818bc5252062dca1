"""agentroll: rewarded, token-exact multi-agent rollouts from a vLLM server, for offline RL.

`Generator` is the library a trainer embeds (docs/api.md); `agentroll generate` is built on it. `System` and
`Context` are how a user writes an agent system of their own (docs/systems.md).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .context import Context
    from .engine.generator import Generator
    from .engine.options import GenerateOptions
    from .errors import (
        AgentrollError,
        IncompleteRun,
        InputError,
        OutputError,
        RewardError,
        RunEnded,
        ServerError,
        TooManyFailures,
        UsageError,
    )
    from .folder import read_groups, read_records, shard_paths
    from .process.concurrency import gather_or_cancel
    from .record.group import Group
    from .record.schema import Sample
    from .systems import System
    from .tools.distilling import distill
    from .tools.rescoring import rescore

# Each name is imported from its module when first asked for: `agentroll convert` need not load the HTTP client,
# and the command line starts its run without loading what the run does not use (docs/performance.md).
_HOMES = {
    "gather_or_cancel": "process.concurrency",
    "Context": "context",
    "distill": "tools.distilling",
    **dict.fromkeys(
        (
            "AgentrollError",
            "IncompleteRun",
            "InputError",
            "OutputError",
            "RewardError",
            "RunEnded",
            "ServerError",
            "TooManyFailures",
            "UsageError",
        ),
        "errors",
    ),
    "read_groups": "folder",
    "read_records": "folder",
    "shard_paths": "folder",
    "Generator": "engine.generator",
    "Group": "record.group",
    "GenerateOptions": "engine.options",
    "rescore": "tools.rescoring",
    "Sample": "record.schema",
    "System": "systems",
}


def __getattr__(name: str) -> object:
    """A public name from its module; or a submodule (`import agentroll` then `agentroll.errors.InputError`, as
    when this package imported them all)."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(f".{home}", __name__), name)
        globals()[name] = value  # once
        return value
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


__version__ = "0.1.0"

__all__ = [
    "AgentrollError",
    "Context",
    "GenerateOptions",
    "Generator",
    "Group",
    "IncompleteRun",
    "InputError",
    "OutputError",
    "RewardError",
    "RunEnded",
    "Sample",
    "ServerError",
    "System",
    "TooManyFailures",
    "UsageError",
    "__version__",
    "distill",
    "gather_or_cancel",
    "read_groups",
    "read_records",
    "rescore",
    "shard_paths",
]
