"""The `agentroll` command: the only package that knows typer and rich's console. Errors become one line and an
exit code (agentroll.errors); the library below never exits the process.

`agentroll NAME ...` imports and builds only the module of command NAME (`main`): a run does not pay for the
others' imports, nor typer's reading of their signatures. `app`, the whole command line, is built when asked for
(help, tests).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterable
from typing import Annotated, Any

import typer

from .. import __version__
from .console import REPEATS, err, fit_to_terminal
from .help import HELP_OPTIONS, Group

MODULES = ("generate", "folders", "servers", "audit")  # in the order `agentroll -h` lists their commands
COMMANDS = {
    "generate": "generate",
    **dict.fromkeys(("merge", "validate", "stats", "convert", "report", "rescore", "inspect"), "folders"),
    **dict.fromkeys(("doctor", "demo", "serve-sim", "ray-partition"), "servers"),
    "audit": "audit",
}


def _version(value: bool) -> None:
    if value:
        typer.echo(f"agentroll {__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[
        bool, typer.Option("--version", help="Show the version and exit.", metavar="", callback=_version, is_eager=True)
    ] = False,
) -> None:
    """Rewarded, token-exact multi-agent rollouts from a vLLM server."""
    fit_to_terminal()


def build(modules: Iterable[str] = MODULES) -> typer.Typer:
    """The command line with the commands of `modules` (each has `register(app)`)."""
    app = typer.Typer(
        cls=Group,
        add_completion=False,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        context_settings=HELP_OPTIONS,
        help="Rewarded, token-exact multi-agent rollouts from a vLLM server.",
    )
    app.callback()(_root)
    for module in modules:
        importlib.import_module(f"{__name__}.{module}").register(app)
    return app


def main() -> Any:
    from ..heap import own

    own()  # this process is the command's: a long run may set its garbage collector (agentroll.heap)
    module = COMMANDS.get(sys.argv[1] if len(sys.argv) > 1 else "")
    return build((module,) if module else MODULES)()


_LAZY = {"run_generate": "generate", "LogLines": "progress", "RichBar": "progress"}


def __getattr__(name: str) -> Any:
    """`app` (built once) and what the command modules define, imported when first asked for."""
    if name == "app":
        value: Any = build()
    elif name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    setattr(sys.modules[__name__], name, value)
    return value


__all__ = ["COMMANDS", "REPEATS", "LogLines", "RichBar", "app", "build", "err", "main", "run_generate"]
