"""The `agentroll` command: the only package that knows typer and rich's console. Errors become one line and an
exit code (agentroll.errors); the library below never exits the process."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from .. import __version__
from . import audit, folders, generate, servers
from .console import REPEATS, err, fit_to_terminal
from .generate import run_generate
from .help import HELP_OPTIONS, Group
from .progress import LogLines, RichBar

app = typer.Typer(
    cls=Group,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings=HELP_OPTIONS,
    help="Rewarded, token-exact multi-agent rollouts from a vLLM server.",
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"agentroll {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", help="Show the version and exit.", metavar="", callback=_version, is_eager=True)
    ] = False,
) -> None:
    """Rewarded, token-exact multi-agent rollouts from a vLLM server."""
    fit_to_terminal()


generate.register(app)
folders.register(app)
servers.register(app)
audit.register(app)


def main() -> Any:
    return app()


__all__ = ["REPEATS", "LogLines", "RichBar", "app", "err", "main", "run_generate"]
