"""How an option is declared and checked, for every options dataclass (`GenerateOptions`, `RunOptions`,
`RewardOptions`): a field carries its CLI help, and a few checks say what is wrong in one line naming the flag."""

from __future__ import annotations

import math
from dataclasses import MISSING, field, fields
from typing import Any

from agentroll.errors import UsageError


def option(default: Any, help: str, **cli: Any) -> Any:
    """A dataclass field carrying its CLI help (and `envvar`, `short` or `cli_type` where the CLI needs them)."""
    if isinstance(default, list | dict):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **cli})
    return field(default=default, metadata={"help": help, **cli})


def default_of(spec: Any) -> Any:
    """A dataclass field's default, made fresh when it comes from a factory."""
    return spec.default_factory() if spec.default_factory is not MISSING else spec.default


SCALARS: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "bool": (bool,), "str": (str,)}
KIND_NAMES = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "a string"}


def check_types(options: Any) -> None:
    """Each scalar option has its declared type (`True` is no number, 2.5 is no count): a float max_tokens
    would only surface as a 400 on every call."""
    for spec in fields(options):
        annotation = str(spec.type).replace(" ", "")
        optional = annotation.endswith("|None")
        kinds = SCALARS.get(annotation.removesuffix("|None"))
        value = getattr(options, spec.name)
        if kinds is None or (optional and value is None):
            continue
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            kind = KIND_NAMES[annotation.removesuffix("|None")]
            raise UsageError(f"--{flag(spec.name)} must be {kind}, got {value!r}")


def flag(name: str) -> str:
    return name.replace("_", "-")


def at_least(options: Any, low: int, *names: str) -> None:
    for name in names:
        value = getattr(options, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise UsageError(f"--{flag(name)} must be a whole number of at least {low}, got {value!r}")


def positive(options: Any, *names: str) -> None:
    for name in names:
        value = getattr(options, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not (math.isfinite(value) and value > 0):
            raise UsageError(f"--{flag(name)} must be a number of seconds above 0, got {value!r}")
