"""The `agentroll` command: the only package that knows typer and rich's console. Errors become one line and an
exit code (agentroll.errors); the library below never exits the process.

`agentroll NAME ...` imports and builds only the module of command NAME (`main`): a run does not pay for the
others' imports, nor typer's reading of their signatures. `app`, the whole command line, is built when asked for
(help, tests). Importing this package loads nothing else: `main` sets the process's garbage collector
(agentroll.process.heap) before typer, rich and the command's modules are imported.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import typer

    from .console import REPEATS, err
    from .generate import run_generate
    from .progress import LogLines, RichBar
    from .root import MODULES, build

    app: typer.Typer

COMMANDS = {
    "generate": "generate",
    **dict.fromkeys(("merge", "validate", "stats", "convert", "report", "inspect", "view"), "folders"),
    "follow": "follow",
    "rescore": "rescore",  # its own: it takes generate's reward options, and with them the rewards' imports
    "distill": "distill",  # its own: it takes generate's teacher options
    **dict.fromkeys(("doctor", "demo", "serve-sim", "ray-partition"), "servers"),
    "audit": "audit",
}


def main() -> Any:
    from ..process.heap import own

    own()  # this process is the command's: its collector is set before the imports (agentroll.process.heap)
    from .console import hush_transformers
    from .root import MODULES, build

    hush_transformers()

    module = COMMANDS.get(sys.argv[1] if len(sys.argv) > 1 else "")
    return build((module,) if module else MODULES)()


_LAZY = {
    "run_generate": "generate",
    "LogLines": "progress",
    "RichBar": "progress",
    "REPEATS": "console",
    "err": "console",
    "MODULES": "root",
    "build": "root",
}


def __getattr__(name: str) -> Any:
    """`app` (built once) and what the command modules define, imported when first asked for."""
    if name == "app":
        from .root import build

        value: Any = build()
    elif name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    setattr(sys.modules[__name__], name, value)
    return value


__all__ = ["COMMANDS", "MODULES", "REPEATS", "LogLines", "RichBar", "app", "build", "err", "main", "run_generate"]
