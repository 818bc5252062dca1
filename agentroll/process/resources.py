"""Where the bundled prompts, samples and simulated-server tokenizer live, installed or in a checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent.parent  # agentroll/, this module being agentroll/process/resources.py


def _bundled(name: str) -> Path:
    installed = _PACKAGE / "_data" / name  # a wheel carries copies here (see pyproject's force-include)
    return installed if installed.is_dir() else _PACKAGE.parent / name


def prompts_dir() -> Path:
    return _bundled("prompts")


def samples_dir() -> Path:
    return _bundled("samples")


def sim_tokenizer_dir() -> Path:
    return _PACKAGE / "sim" / "tokenizer"
