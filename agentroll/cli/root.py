"""The command line's root: the `agentroll` group, its `--version`, and `build`, which adds the commands asked for."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import Annotated

import typer

from .. import __version__
from ..process import heap
from .console import fit_to_terminal
from .help import HELP_OPTIONS, Group

MODULES = (
    "generate",
    "folders",
    "follow",
    "rescore",
    "distill",
    "servers",
    "audit",
)  # in the order `agentroll -h` lists them
RUNS = frozenset({"generate", "demo", "ray-partition", "serve-sim"})  # each settles the heap once it has started


def _version(value: bool) -> None:
    if value:
        typer.echo(f"agentroll {__version__}")
        raise typer.Exit()


def _root(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", help="Show the version and exit.", metavar="", callback=_version, is_eager=True)
    ] = False,
) -> None:
    """Rewarded, token-exact multi-agent rollouts from a vLLM server."""
    fit_to_terminal()
    if ctx.invoked_subcommand not in RUNS:
        heap.settle()  # no run to start: the collector is on again now (agentroll.process.heap)


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
        importlib.import_module(f"agentroll.cli.{module}").register(app)
    return app
