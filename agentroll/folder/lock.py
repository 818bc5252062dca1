"""Locks on folders (`flock`): one writer per folder, one `--ray` driver per job folder."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

from ..errors import OutputError

TRIES = 10  # a lock held for an instant (a follower asking whether a writer is there) is waited for


def take(path: Path, busy: str, create: bool = True) -> int | None:
    """Hold the lock at `path` and return its descriptor (closing it lets go). `busy`: the one line said when
    another process holds it. None when `create` is False and there is no lock file."""
    try:
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
    except FileNotFoundError:
        if create:
            raise OutputError(f"cannot create {path}: its folder is gone") from None
        return None
    except OSError as exc:
        raise OutputError(f"cannot open {path}: {exc.strerror or exc}") from exc
    try:
        for attempt in range(TRIES):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == TRIES - 1:
                    raise
                time.sleep(0.02)  # a reader's instant (`held`) passes; a writer's lock does not
    except BlockingIOError:
        os.close(fd)
        raise OutputError(busy) from None
    except OSError as exc:
        os.close(fd)
        raise OutputError(
            f"cannot lock {path} ({exc.strerror or exc}): agentroll needs storage whose locks hold (docs/ray.md)"
        ) from None
    return fd


def held(path: Path) -> bool:
    """Does a process hold the lock at `path` now? Asked by taking it shared for an instant (a writer that asks
    in that instant waits for it: `take` tries again before it says busy)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False  # storage without locks: nothing holds it that we could see
    finally:
        os.close(fd)  # closing lets go
    return False


def release(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def wait_until_free(path: Path, seconds: float, on_wait: object = None) -> bool:
    """Wait up to `seconds` for another process to let go of the lock at `path` (it exists); True once free
    (or when there is none, or the storage has no locks). `on_wait()` is called once if it has to wait."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return True
    try:
        deadline, said = time.monotonic() + seconds, False
        while time.monotonic() < deadline:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if not said and callable(on_wait):
                    said = True
                    on_wait()
                time.sleep(0.2)  # another process's lock: nothing to wait on but time
            except OSError:
                return True
        return False
    finally:
        os.close(fd)
