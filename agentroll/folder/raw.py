"""A folder's files as bytes, for `agentroll validate`: it checks them itself, line by line, sharing no parsing
with the writer and the readers (so it finds what they would miss), but it still reaches them only here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

from .layout import Layout


def manifest_bytes(folder: Path) -> bytes:
    return Layout(folder).manifest.read_bytes()


def keys_bytes(shard: Path) -> bytes:
    """The keys file of a finished shard (its folder's `.agentroll/keys/`)."""
    return Layout(shard.parent).keys(shard.name).read_bytes()


def keys_exist(shard: Path) -> bool:
    return Layout(shard.parent).keys(shard.name).exists()


def open_shard(path: Path) -> BinaryIO:
    return open(path, "rb")


def open_sidecar(path: Path) -> int:
    """A descriptor for `pread`s of a routes sidecar; close it with `os.close`."""
    return os.open(path, os.O_RDONLY)


def pread(fd: int, nbytes: int, offset: int) -> bytes:
    return os.pread(fd, nbytes, offset)
