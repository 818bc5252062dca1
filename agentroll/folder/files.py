"""Durable file operations: a file replaced whole or not at all, appends that leave nothing half-buffered."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from .layout import TMP


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    """`path` holds `data` or what it held before, whatever kills the process (temp, fsync, rename)."""
    tmp = path.with_name(path.name + TMP)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_all(f: Any, data: bytes) -> None:
    """Write every byte to an unbuffered file: after a failure nothing half-written waits in a buffer."""
    view = memoryview(data)
    while view:
        view = view[f.write(view) :]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)
        f.flush()
        os.fsync(f.fileno())
