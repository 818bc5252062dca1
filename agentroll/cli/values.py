"""How our commands read a value: str, int, float, bool, a path, or a list of them, converted here.

typer 0.29 converts every value it parses through a pydantic `TypeAdapter`, built per option on first use: for
`agentroll generate` that is importing pydantic and building some 70 adapters, a tenth to a fifth of a second
before the run starts (docs/performance.md, "Start-up"). Our options are only of the plain types above, so each
gets a converter of typer's own kind (`RuntimeParam`, which typer calls) that does what those adapters do for
them: pydantic's lax rules (`"1.0"` is the whole number 1, `"1.5"` and `"1e3"` are none; `yes` and `off` are
booleans), and a one-line error naming the value. Anything else (a choice, a range, a file, a typer without
this hook) is left to typer. tests/test_cli.py compares the two on the values a user may type.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args, get_origin

import typer

try:
    from typer._coercion import RuntimeParam
except ImportError:  # a typer that converts with click's own types: nothing to replace
    RuntimeParam = None  # type: ignore[assignment,misc]

PLAIN = (str, int, float, bool, Path)
TRUE = {"1", "on", "t", "true", "y", "yes"}
FALSE = {"0", "off", "f", "false", "n", "no"}


def convert(kind: type, value: Any) -> Any:
    """`value` (a string from the command line or the environment, or a default) as `kind`; ValueError if not."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if kind is str:
        return str(value)
    if kind is Path:
        return value if isinstance(value, Path) else Path(value)
    if kind is bool:
        if isinstance(value, bool):
            return value
        word = str(value).strip().lower()
        if word in TRUE or word in FALSE or not word:  # typer reads an empty value as false
            return word in TRUE
        raise ValueError(f"{value!r} is not true or false")
    text = str(value).strip()
    if kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        whole = re.fullmatch(r"([+-]?[\d_]+)(\.0*)?", text)  # pydantic takes 1.0 as 1, not 1.5 nor 1e3
        try:
            if whole is not None:
                return int(whole.group(1))
        except ValueError:  # misplaced underscores
            pass
        raise ValueError(f"{value!r} is not a whole number")
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class Plain(RuntimeParam):
        """typer's converter contract (`coerce` handles None and repeated values; this, one value or a list)."""

        kind: type = str

        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            try:
                if isinstance(value, list | tuple):
                    return [convert(self.kind, v) for v in value]
                return convert(self.kind, value)
            except ValueError as exc:
                raise typer.BadParameter(str(exc), ctx=ctx, param=param) from None


def plain_kind(param: Any) -> type | None:
    """The plain type a parameter converts to (for a list, its items'), or None: typer's own conversion."""
    desc = getattr(param, "type_descriptor", None)
    if desc is None or desc.file_annotation is not None or desc.is_choice or desc.is_tuple or desc.is_ranged:
        return None
    info = desc.parameter_info
    if getattr(info, "parser", None) is not None or getattr(info, "click_type", None) is not None:
        return None
    kind = desc.annotation
    if get_origin(kind) is list:
        (kind,) = get_args(kind)
    return kind if kind in PLAIN else None


def use_plain_values(params: list[Any]) -> None:
    """Give each parameter of a plain type our converter, where typer has not built one of its own yet."""
    if RuntimeParam is None:
        return
    for param in params:
        kind = plain_kind(param)
        if kind is not None and getattr(param, "_runtime_param", "") is None:
            desc = param.type_descriptor
            param._runtime_param = Plain(parameter_info=desc.parameter_info, annotation=desc.annotation, kind=kind)
