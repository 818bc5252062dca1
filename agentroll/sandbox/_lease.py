"""Leases on the runs' uids, so that no two live agentroll runs on a host share one (as root, `_bwrap.run_uids`).

A uid of no account and no running process is not enough: a second agentroll started while the first has no
program running would pick the same one, and the kernel's per-user counters (pipe pages, inotify, the process
count) would couple the two. So a run takes a lease: an exclusive `flock` on a file named after the uid in a
directory only root may write (`/run/agentroll-uids`, else one in the system's temp directory), held on a
descriptor for as long as the sandbox lives. The kernel lets go of it when that descriptor closes, however the
process ends (`kill -9` too): no lease outlives its holder, and nothing needs sweeping.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import stat
import tempfile
from collections.abc import Iterable, Iterator

PLACES = ("/run/agentroll-uids",)


def places() -> list[str]:
    return [*PLACES, os.path.join(tempfile.gettempdir(), "agentroll-uids")]


def directory() -> str | None:
    """The first place that is (or is made) a real directory of root's that no one else may write; None if none
    is (someone else made one in /tmp first: its leases could be taken or faked)."""
    for place in places():
        with contextlib.suppress(FileExistsError, OSError):
            os.mkdir(place, 0o700)
        try:
            found = os.lstat(place)
        except OSError:
            continue
        if stat.S_ISDIR(found.st_mode) and found.st_uid == 0 and not found.st_mode & 0o022:
            return place
    return None


def take(uids: Iterable[int], where: str | None = None) -> tuple[int, int] | None:
    """The first of `uids` no live holder leases, and the descriptor holding its lease (close it to let go);
    None when every one is leased or there is nowhere to lease them."""
    where = where or directory()
    if where is None:
        return None
    for uid in uids:
        try:
            fd = os.open(os.path.join(where, str(uid)), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another run holds it (flock's locks belong to the open file: a second sandbox here too)
            os.close(fd)
            continue
        return uid, fd
    return None


def own_uid(ranges: list[tuple[int, ...]], taken: set[int]) -> int | None:
    """The first of `own_uids`, or None."""
    return next(iter(own_uids(ranges, taken)), None)


def own_uids(ranges: list[tuple[int, ...]], taken: set[int]) -> Iterator[int]:
    """Near the top of the ids `ranges` map (uid_map's lines: first id here, first outside, count), below 2**31,
    those that are not `taken` and no account's, highest first: the 64 highest of each range at most."""
    for first, _, count in sorted(ranges, key=lambda r: r[0] + r[2], reverse=True):
        top = min(first + count, (1 << 31) - 1) - 1
        for uid in range(top, max(first, top - 64) - 1, -1):
            if uid not in taken and not _has_account(uid):
                yield uid


def running_uids() -> set[int]:
    """The real, effective, saved and filesystem uids of every process this agentroll can see."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, StopIteration):  # a process gone meanwhile
                    with open(f"/proc/{entry.name}/status", "rb") as status:
                        line = next(x for x in status if x.startswith(b"Uid:"))
                    found.update(map(int, line.split()[1:]))
    return found


def _has_account(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
