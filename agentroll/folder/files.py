"""Durable file operations: a file replaced whole or not at all, appends that leave nothing half-buffered; the
folder itself made ready (`prepare`)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from ..errors import OutputError
from .layout import TMP, Layout


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


def prepare(root: Path) -> Layout:
    """The folder and its state directory, made if need be; our own words for what stands in the way."""
    if root.exists() and not root.is_dir():
        raise OutputError(f"{root} is a file, not a folder")
    try:
        root.mkdir(parents=True, exist_ok=True)
        layout = Layout(root)
        layout.state.mkdir(exist_ok=True)
    except NotADirectoryError:
        raise OutputError(f"output folder {root}: a part of the path is a file, not a folder") from None
    except OSError as exc:
        raise OutputError(f"output folder {root}: {exc.strerror or exc}") from exc
    return layout
