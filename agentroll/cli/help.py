"""How `--help` reads: options in panels, a value's metavar only where the option takes a value, `-h`, and the
usage line as `agentroll generate [OPTIONS] INPUT`."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}


def _flag(option: Any, panel: str | None) -> Any:
    if option is not None:
        option.metavar = ""  # a flag takes no value: show none
        option.rich_help_panel = panel  # with the command's first options, not in a panel of its own
    return option


class Group(TyperGroup):
    def get_help_option(self, ctx: Any) -> Any:  # typer's own click (vendored): its types are private
        return _flag(super().get_help_option(ctx), None)


class Command(TyperCommand):
    help_panel: str | None = None

    def get_help_option(self, ctx: Any) -> Any:
        return _flag(super().get_help_option(ctx), self.help_panel)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [piece.strip("{}") for piece in super().collect_usage_pieces(ctx)]


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
