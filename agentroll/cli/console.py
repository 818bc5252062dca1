"""Where the command writes: stderr for people (logs, progress, summaries, errors), stdout for data.

Nothing that comes from data, paths or servers is read as markup or emoji: the consoles are made with both off,
and our own styling is applied to `Text` objects. An error is one line and its exit code.
"""

from __future__ import annotations

import asyncio
import logging
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console
from rich.highlighter import NullHighlighter
from rich.logging import RichHandler
from rich.text import Text

from ..errors import AgentrollError

err = Console(stderr=True, width=None if sys.stderr.isatty() else 160, markup=False, emoji=False, highlight=False)
log = logging.getLogger("agentroll")
T = TypeVar("T")


def out() -> Console:
    """Standard output for a report: as wide as the terminal, or 200 columns for a file or a pipe."""
    return Console(width=None if sys.stdout.isatty() else 200, markup=False, emoji=False, highlight=False)


def error(message: str) -> None:
    line = Text("error: ", style="red")
    line.append(message)
    err.print(line, soft_wrap=True)


def folder_tool(run: Callable[[], T]) -> T:
    """A command's result, or its error as one line and its exit code."""
    try:
        return run()
    except AgentrollError as exc:
        error(str(exc))
        raise typer.Exit(exc.exit_code) from None


def run_async(coroutine: Any) -> Any:
    """On uvloop when it is installed (`pip install agentroll[fast]`), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coroutine)
    return uvloop.run(coroutine)


class Repeats(logging.Filter):
    """A warning said again is said once more at 10, 100, 1000... times, with its count, and summed up at the end:
    one line per event, never a screenful of the same line."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        text = record.getMessage()
        n = self.counts[text] = self.counts.get(text, 0) + 1
        if n == 1:
            return True
        if math.log10(n).is_integer():
            record.msg, record.args = f"{text} (said {n} times so far)", ()
            return True
        return False

    def said(self) -> list[str]:
        return [f"said {n} times in all: {text}" for text, n in self.counts.items() if n > 1]


REPEATS = Repeats()


def setup_logging(quiet: bool, debug: bool) -> Callable[[], None]:
    """Our handler on the `agentroll` logger; returns what puts the caller's logging back (in-process runs)."""
    before = log.handlers[:], log.level, log.propagate
    level = logging.DEBUG if debug else logging.ERROR if quiet else logging.INFO
    if err.is_terminal:
        handler: logging.Handler = RichHandler(
            console=err, show_path=False, show_time=False, markup=False, highlighter=NullHighlighter()
        )
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s agentroll %(levelname)s %(message)s"))
    REPEATS.counts.clear()
    handler.addFilter(REPEATS)
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False

    def restore() -> None:
        log.handlers[:], log.level, log.propagate = before[0], before[1], before[2]

    return restore
