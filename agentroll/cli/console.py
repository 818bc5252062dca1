"""Where the command writes: stderr for people (logs, progress, summaries, errors), stdout for data.

Nothing that comes from data, paths or servers is read as markup or emoji: the consoles are made with both off,
and our own styling is applied to `Text` objects. An error is one line and its exit code.

A console is as wide as `COLUMNS` says, else as the terminal, else (a file, a pipe) wide enough for a log line.
Tables are built by the tools as plain rich tables of data; fitting them to the width is the console's business
(`fit`): a figure is never cut or folded, whatever the table's own overflow setting.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import math
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

import typer
from rich.console import Console, Group, RenderableType
from rich.highlighter import NullHighlighter
from rich.logging import RichHandler
from rich.measure import Measurement
from rich.table import Column, Table
from rich.text import Text

from ..errors import AgentrollError

log = logging.getLogger("agentroll")
T = TypeVar("T")


def columns(tty: bool, fallback: int) -> int | None:
    """The width to draw at: `COLUMNS` when set, else the terminal's (None: rich asks it), else `fallback`."""
    given = os.environ.get("COLUMNS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given)
    return None if tty else fallback


class Terminal(Console):
    """A console that prints a table of figures (boxed, with a header) fitted to its width (`fit`); rich's own
    layout grids (a log line, a progress bar) are left as they are. A line printed `soft_wrap=True` (an error,
    a warning, a verdict) stays one line in a file or a pipe, for grep; on a terminal it is wrapped between words
    (the terminal would break it inside one)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if kwargs.get("soft_wrap") and self.is_terminal:
            kwargs["soft_wrap"] = False
        super().print(*(fit(o, self) if _figures(o) else o for o in objects), **kwargs)


def _figures(renderable: Any) -> bool:
    return isinstance(renderable, Table) and renderable.box is not None and renderable.show_header


def fit(table: Table, console: Console) -> RenderableType:
    """`table` drawn within the console's width with every figure whole. Its first column (the labels) may fold;
    every other column (figures) gets the width of its widest cell, its header folding on words, and columns that
    do not fit beside the labels go on in another table below (the labels repeated), never cut."""
    if len(table.columns) < 2:
        return table
    options = console.options
    label, *figures = table.columns
    label = dataclasses.replace(label, overflow="fold", no_wrap=False)
    fixed = []
    for column in figures:
        widest = max((Measurement.get(console, options, cell).maximum for cell in column.cells), default=1)
        header = Measurement.get(console, options, column.header).minimum if table.show_header else 1
        fixed.append(dataclasses.replace(column, width=max(widest, header, 1), overflow="fold", no_wrap=False))
    _, right, _, left = table.padding
    room = options.max_width - (2 if table.box and table.show_edge else 0)  # the outer edges
    words = max((Measurement.get(console, options, cell).minimum for cell in label.cells), default=1)
    room -= min(words, options.max_width // 3) + left + right  # the labels, folded at most to a third
    chunks: list[list[Column]] = [[]]
    used = 0
    for column in fixed:
        need = (column.width or 1) + left + right + (1 if table.box else 0)  # its cell and the rule before it
        if chunks[-1] and used + need > room:
            chunks.append([])
            used = 0
        chunks[-1].append(column)
        used += need
    parts = [_part(table, [label, *chunk], first=i == 0, last=i == len(chunks) - 1) for i, chunk in enumerate(chunks)]
    return parts[0] if len(parts) == 1 else Group(*parts)


def _part(table: Table, chosen: list[Column], first: bool = True, last: bool = True) -> Table:
    part = copy.copy(table)
    part.columns = [dataclasses.replace(c, _index=i) for i, c in enumerate(chosen)]
    part.title = table.title if first else None
    part.caption = table.caption if last else None
    return part


err = Terminal(stderr=True, width=columns(sys.stderr.isatty(), 160), markup=False, emoji=False, highlight=False)


def fit_to_terminal() -> None:
    """Take `COLUMNS` as it is now (a command run in-process, or in a shell that set it after import)."""
    width = columns(err.is_terminal, 160)
    if width is not None:  # None: a terminal without COLUMNS, which rich asks itself
        err.width = width


def out() -> Terminal:
    """Standard output for a report: as wide as `COLUMNS` or the terminal, or 200 columns for a file or a pipe."""
    return Terminal(width=columns(sys.stdout.isatty(), 200), markup=False, emoji=False, highlight=False)


def packed(phrases: list[str], width: int, indent: str = "  ") -> str:
    """Phrases joined by "; " on lines of at most `width` columns, broken only between two phrases or after a
    ", " inside one (a figure never parts from its name), each line after the first indented. A phrase wider
    than a line stays whole: the console folds it at a space."""
    pieces = [piece for phrase in phrases for piece in _pieces(phrase)]
    lines: list[str] = []
    line = ""
    for at, piece in enumerate(pieces):
        text = piece + ("" if at == len(pieces) - 1 or piece.endswith(",") else ";")
        if line and len(line) + 1 + len(text) > width:
            lines.append(line)
            line = indent + text
        else:
            line = f"{line} {text}" if line else text
    return "\n".join([*lines, line])


def _pieces(phrase: str) -> list[str]:
    parts = phrase.split(", ")
    return [part + ("," if i < len(parts) - 1 else "") for i, part in enumerate(parts)]


def error(message: str) -> None:
    line = Text("error: ", style="red")
    line.append(message)
    err.print(line, soft_wrap=True)


def failed(exc: AgentrollError, debug: bool = False) -> int:
    """An error said as one line, its traceback above it under `--debug`; its exit code, debug or not (scripts
    and cron jobs branch on it)."""
    if debug:
        err.print(Text("".join(traceback.format_exception(exc)).rstrip()), soft_wrap=True)
    error(str(exc))
    return exc.exit_code


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
DETAIL = {"detail": True}  # `log.info(..., extra=DETAIL)`: a line that needs no action, said with --verbose


class Details(logging.Filter):
    """Lines marked `DETAIL` are said only with --verbose (or --debug): a run's log keeps to what asks for a
    look."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "detail", False)


TRANSFORMERS = "TRANSFORMERS_VERBOSITY"
_hushed: list[bool] = []  # set when the command, not the user, silenced transformers' notices


def hush_transformers() -> None:
    """transformers' notices (its "PyTorch was not found" banner at import, from the simulator, a tokenizer or a
    user's tool file) are not ours to say: off for the command, unless the user set `TRANSFORMERS_VERBOSITY`."""
    if TRANSFORMERS not in os.environ:
        os.environ[TRANSFORMERS] = "error"
        _hushed.append(True)


def unhush_transformers() -> None:
    """--verbose: transformers says what it would say by itself (warnings)."""
    if _hushed:
        os.environ[TRANSFORMERS] = "warning"
        if "transformers" in sys.modules:
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_warning()


def setup_logging(quiet: bool, debug: bool, verbose: bool = False) -> Callable[[], None]:
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
    if verbose or debug:
        unhush_transformers()
    else:
        handler.addFilter(Details())
    log.handlers[:] = [handler]
    log.setLevel(level)
    log.propagate = False

    def restore() -> None:
        log.handlers[:], log.level, log.propagate = before[0], before[1], before[2]

    return restore
