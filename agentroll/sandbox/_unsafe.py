"""`--sandbox unsafe-local`: model code without a filesystem sandbox, for machines without bubblewrap, only when
asked for by name (a warning says what it means at start).

Each run is `_launch.py` (see it): a fresh directory, the program's own process group, resource limits per
process, and namespaces where the machine allows them (network, pid, user: probed, most isolated first; as root
the program runs as `nobody`). Nothing stops the program from reading what its user can read (the dataset, other
runs' directories, the host's processes), and its limits are per process, not per run.

The program is written into its directory before the directory is handed to the program's user, through a
descriptor that follows no link and makes a new file: nothing planted can redirect or block that write. The
launcher reports on a descriptor of its own; nothing the program prints or returns is read as the sandbox's word.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..process.children import alive
from . import SandboxSettings

LAUNCHER = str(Path(__file__).with_name("_launch.py"))
NOBODY = 65534
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
WORKDIR_PREFIX = "agentroll-sandbox-"  # then the pid of the agentroll that made it
WARNING = (
    "--sandbox unsafe-local: model code runs without a filesystem sandbox. It can read whatever its user can "
    "(this run's input, other runs' programs, the host's processes and their command lines), and its limits are "
    "per process, not per run. Install bubblewrap, or use --sandbox-url, for code you do not trust"
)


@dataclass(frozen=True, slots=True)
class Mode:
    namespaces: str  # "user", "root" or "none" (see _launch.py)
    uid: int | None  # dropped to (agentroll runs as root), or None
    python: str
    settings: SandboxSettings

    def describe(self) -> str:
        where = {
            "user": "network, pid and user namespaces (no network)",
            "root": "network and pid namespaces (no network)",
            "none": "no namespaces: the code has the network, and processes that leave its group may outlive the run",
        }[self.namespaces]
        user = f"; runs as uid {self.uid}" if self.uid is not None else ""
        return f"unsafe-local, no filesystem sandbox: {where}{user}; in {self.python}"

    def launch(self, code: str, timeout_s: float) -> Launch:
        return Launch(self, code, timeout_s)


def candidates(settings: SandboxSettings) -> list[Mode]:
    """The set-ups to try, most isolated first; for each, the interpreter asked for, then the system's (a user
    `nobody` cannot run an interpreter under root's home), never root."""
    python = settings.python
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    uid = NOBODY if root else None
    kinds = ["user", *(["root"] if root else []), "none"] if sys.platform.startswith("linux") else ["none"]
    system = [p for p in SYSTEM_PYTHONS if os.path.exists(p) and os.path.realpath(p) != os.path.realpath(python)]
    return [Mode(kind, uid, p, settings) for kind in kinds for p in [python, *(system if uid is not None else [])]]


class Launch:
    """One run through `_launch.py`: its directory with the program in it, its status descriptor."""

    def __init__(self, mode: Mode, code: str, timeout_s: float) -> None:
        s = mode.settings
        self.workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-", dir=s.tmp_dir)  # 0700, ours
        fd = os.open(os.path.join(self.workdir, "main.py"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(code.encode("utf-8", "replace"))
        if mode.uid is not None:
            os.chown(self.workdir, mode.uid, mode.uid)  # only now: it held nothing to plant into before
        self.status_r, status_w = os.pipe()
        processes = (  # per user namespace, or shared by every run as `nobody`; else off
            s.processes if mode.namespaces == "user" else (s.processes * s.slots if mode.uid is not None else None)
        )
        env = {"PATH": SAFE_PATH, "HOME": self.workdir, "TMPDIR": self.workdir, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
        env.update({"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
        config = {
            "parent": os.getpid(),
            "workdir": self.workdir,
            "status_fd": status_w,
            "namespaces": mode.namespaces,
            "uid": mode.uid,
            "gid": mode.uid,
            "argv": [mode.python, "-I", "-B", "-X", "utf8", "main.py"],
            "env": env,
            "limits": {
                "cpu_s": math.ceil(timeout_s) + 1,
                "as_bytes": s.memory_mb << 20,
                "fsize_bytes": s.disk_mb << 20,
                "nproc": processes,
            },
        }
        self.argv = [s.python, "-I", "-S", "-B", LAUNCHER, orjson.dumps(config).decode()]
        self.pass_fds: tuple[int, ...] = (status_w,)
        self.popen: dict[str, Any] = {"env": {"PATH": SAFE_PATH}}
        self._theirs = [status_w]
        self._status: asyncio.StreamReader | None = None
        self._transport: asyncio.ReadTransport | None = None

    def spawned(self) -> None:
        for fd in self._theirs:
            os.close(fd)
        self._theirs = []

    async def ready(self, transport: asyncio.SubprocessTransport) -> bool:
        loop = asyncio.get_running_loop()
        self._status = status = asyncio.StreamReader()
        self._transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(status), os.fdopen(self.status_r, "rb")
        )
        self.status_r = -1
        return True

    async def outcome(self, returncode: int | None, killed: bool) -> dict[str, Any]:
        """{"exit": n} | {"signal": n} | {"setup": why} (the launcher's own lines, one JSON object each; a setup
        line wins: the program never ran) | {} (nothing said: it was killed)."""
        raw = b""
        if self._status is not None:  # everything written to it, once every writer has closed it
            with contextlib.suppress(asyncio.TimeoutError):
                raw = await asyncio.wait_for(self._status.read(), 5.0)
        said: dict[str, Any] = {}
        for line in raw.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError):
                item = orjson.loads(line)
                if isinstance(item, dict) and ("setup" in item or not said):
                    said = item
        return said

    def memory_killed(self) -> bool:
        return False

    def release(self) -> None:
        for fd in (*self._theirs, self.status_r):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._theirs, self.status_r = [], -1
        if self._transport is not None:
            self._transport.close()

    async def close(self) -> None:
        self.release()
        shutil.rmtree(self.workdir, ignore_errors=True)


def sweep(tmp_dir: str) -> None:
    """Remove the run directories of an agentroll that is gone: one killed between making a directory and
    handing it to its launcher (which removes it in every other case) leaves it behind."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(tmp_dir):
            pid = entry.name.removeprefix(WORKDIR_PREFIX).split("-", 1)[0]
            if entry.name.startswith(WORKDIR_PREFIX) and pid.isdigit() and not alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)
