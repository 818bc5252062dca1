"""How `--help` reads: options in panels, a value's metavar only where the option takes a value, `-h`, and the
usage line as `agentroll generate [OPTIONS] INPUT`.

typer draws an option's names, its metavar and its help as columns of one rich table that shrinks every column
alike when the terminal is narrow, so at 80 columns a flag read `--reward-concurre…`. `OptionsTable` takes the
place of that table while our commands draw their help: names and metavars are never wrapped or cut (an option's
`--x/--no-x` pair on two lines), the help text alone folds, and an argument shows no Python type (`<path>`).
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections.abc import Callable, Iterator
from typing import Annotated, Any

import typer
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markup import escape
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from typer.core import TyperCommand, TyperGroup

from .values import use_plain_values

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}


def _flag(option: Any, panel: str | None) -> Any:
    if option is not None:
        option.metavar = ""  # a flag takes no value: show none
        option.rich_help_panel = panel  # with the command's first options, not in a panel of its own
        use_plain_values([option])
    return option


def _plain(cell: Any) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


class OptionsTable(Table):
    """typer's table of options (required mark, names, short names, their negative forms, type, help), drawn as
    required mark, names, short names, metavar, help: all but the help at their full width."""

    def _fitted(self) -> Table:
        cells = [list(column.cells) for column in self.columns]
        marked = len(cells) == 7
        required = cells.pop(0) if marked else []
        long, short, negative, negative_short, types, helps = cells
        table = Table(
            highlight=self.highlight,
            show_header=False,
            expand=self.expand,
            box=self.box,
            show_lines=self.show_lines,
            leading=self.leading,
            border_style=self.border_style,
            row_styles=self.row_styles,
            pad_edge=self.pad_edge,
            padding=self.padding,
        )
        rows = []
        for i in range(len(helps)):
            names, shorts, kind = _joined(long[i], negative[i]), _joined(short[i], negative_short[i]), types[i]
            if not names.plain and shorts.plain and not shorts.plain.startswith("-"):  # an argument: its name
                names, shorts, kind = shorts, Text(), Text()
            rows.append([*([required[i]] if marked else []), names, shorts, kind, helps[i]])
        keep = [any(_plain(row[c]) for row in rows) for c in range(len(rows[0]))] if rows else []
        keep[-1] = True
        for c, kept in enumerate(keep):
            if kept:
                last = c == len(keep) - 1
                table.add_column(no_wrap=not last, overflow="fold", ratio=1 if last else None)
        for row in rows:
            table.add_row(*(cell for cell, kept in zip(row, keep, strict=True) if kept))
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if len(self.columns) not in (6, 7):  # not an options table (typer's commands panel)
            yield from super().__rich_console__(console, options)
            return
        yield from self._fitted().__rich_console__(console, options)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        if len(self.columns) not in (6, 7):
            return super().__rich_measure__(console, options)
        return self._fitted().__rich_measure__(console, options)


def _joined(first: Any, second: Any) -> Text:
    """An option's names and their negative forms (`--filter-uniform-groups` over `--keep-uniform-groups`)."""
    out = first.copy() if isinstance(first, Text) else Text(str(first))
    if _plain(second):
        out.append("\n" if out.plain else "")
        out.append(second if isinstance(second, Text) else Text(str(second)))
    return out


@contextlib.contextmanager
def _options_tables() -> Iterator[None]:
    """typer draws with `rich_utils.Table`, looked up when it draws: ours while our help is drawn."""
    import typer.rich_utils as rich_utils

    before, rich_utils.Table = rich_utils.Table, OptionsTable  # type: ignore[misc]
    try:
        yield
    finally:
        rich_utils.Table = before  # type: ignore[misc]


class Group(TyperGroup):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        use_plain_values(self.params)

    def get_help_option(self, ctx: Any) -> Any:  # typer's own click (vendored): its types are private
        return _flag(super().get_help_option(ctx), None)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with _options_tables():
            super().format_help(ctx, formatter)


class Command(TyperCommand):
    help_panel: str | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        use_plain_values(self.params)  # converted without pydantic (values.py)
        if self.short_help is None and self.help:  # `agentroll -h`'s list: the first paragraph, rewrapped there
            first = inspect.cleandoc(self.help).split("\n\n", 1)[0]
            self.short_help = help_text(" ".join(first.split()))

    def get_help_option(self, ctx: Any) -> Any:
        return _flag(super().get_help_option(ctx), self.help_panel)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """typer writes a required argument `{DIR}` and a repeated one `{DIR...}...`: `DIR`, `DIR...`."""
        return [re.sub(r"(\.\.\.)+", "...", re.sub(r"[{}]", "", p)) for p in super().collect_usage_pieces(ctx)]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        with _options_tables():
            super().format_help(ctx, formatter)


def help_text(text: str | None) -> str | None:
    """Our help as typer shows it, its brackets kept (typer reads help as markup: `[default: x]` would vanish)."""
    return None if text is None else escape(text)


def metavar(name: str, annotation: Any, named: dict[str, str]) -> str:
    """The value an option takes, by its name or type; "" for a flag."""
    if name in named:
        return named[name]
    text = str(annotation).replace(" ", "")
    if annotation is bool or text in ("bool", "bool|None"):
        return ""
    if "int" in text:
        return "N"
    if "float" in text:
        return "SECONDS" if name.endswith(("_timeout", "_interval")) else "NUMBER"
    return "TEXT"


def own_option(
    name: str, annotation: Any, default: Any, *decls: str, help: str, metavar: str = ""
) -> inspect.Parameter:
    """A keyword parameter of a command built from a declaration (`rescore`, `distill`): one of its own options."""
    info = typer.Option(*decls, help=help_text(help), metavar=metavar, show_default=default not in (None, ...))
    kind = inspect.Parameter.KEYWORD_ONLY
    return inspect.Parameter(name, kind, default=default, annotation=Annotated[annotation, info])


def signed(command: Callable[..., None], params: list[inspect.Parameter]) -> Callable[..., None]:
    """`command(**kwargs)` with the signature typer reads its options from."""
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    return command
