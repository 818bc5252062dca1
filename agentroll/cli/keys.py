"""The API key on the command line: visible to every process of the machine (`ps`, /proc/PID/cmdline), model
code run without a sandbox of its own included. It still works, with one warning; `--api-key-file FILE` and
`$OPENAI_API_KEY` do not show it."""

from __future__ import annotations

import os

ENVVAR = "OPENAI_API_KEY"
KEY_WARNING = (
    "--api-key on the command line is visible to every process on this machine (ps, /proc): "
    f"pass --api-key-file FILE or set {ENVVAR} instead"
)
TEACHER_KEY_WARNING = (
    "--teacher-api-key on the command line is visible to every process on this machine (ps, /proc): "
    "pass --teacher-api-key-file FILE instead"
)


def given_key(key: str | None, key_file: str | None) -> tuple[str | None, bool]:
    """The key to pass on, and whether to warn that it was typed on the command line. The CLI fills an option
    not given from `$OPENAI_API_KEY`: a value other than the variable's was typed; a value from the variable
    gives way to an explicit --api-key-file (both typed: the options refuse them, no warning first)."""
    typed = key is not None and key != os.environ.get(ENVVAR)
    if key_file is not None:
        return (key, False) if typed else (None, False)
    return key, typed
