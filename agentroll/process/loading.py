"""User code named on the command line: `path/to/file.py:NAME` or `package.module:NAME`."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from typing import Any


def load_object(spec: str, what: str, error: type[Exception], kind: str = "object") -> Any:
    """The object `NAME` of the file or module; `error` (one line naming `spec`) when it cannot be had."""
    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise error(f"{what} {spec!r}: expected FILE.py:NAME or MODULE:NAME")
    try:
        if target.endswith(".py"):
            path = Path(target)
            if not path.is_file():
                raise error(f"{what} {spec!r}: no file {path}")
            module_spec = importlib.util.spec_from_file_location(f"agentroll_user_{what}_{path.stem}", path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except error:
        raise
    except Exception as exc:
        raise error(f"{what} {spec!r}: cannot import {target}: {type(exc).__name__}: {exc}") from None
    found = getattr(module, name, None)
    if found is None:
        raise error(f"{what} {spec!r}: {target} has no {kind} {name!r}")
    return found
