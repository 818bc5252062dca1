"""The local sandbox: one child process per run, set up by `_launch.py`, supervised from the event loop.

Per run: a fresh directory (removed afterwards, by the launcher if agentroll itself is killed), the program
written there as `main.py`, a scrubbed environment (no variable of agentroll's own), the interpreter in isolated
mode, resource limits (CPU seconds, address space, file size, processes), its own process group killed whole at
the wall-clock timeout, and at most `concurrency` runs at once. The isolation is the best this machine allows,
found once by probing: unprivileged user + network + pid namespaces; as root, the same after dropping to the
user `nobody` (or network + pid namespaces made as root); else none, which is logged as a warning. It is not a
filesystem sandbox: the code can read what its user can read (docs/tool-use.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import orjson

from ..errors import UsageError
from . import RunResult, SandboxSettings, SandboxUnavailable, Status

log = logging.getLogger("agentroll")

LAUNCHER = str(Path(__file__).with_name("_launch.py"))
NOBODY = 65534
SETUP_FAILED = 125  # _launch.py's exit code when the program could not start
SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
SYSTEM_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3")
DRAIN_S = 2.0  # after the kill, how long the pipes may take to close
WORKDIR_PREFIX = "agentroll-sandbox-"  # then the pid of the agentroll that made it
Launched = tuple[dict[str, Any], bytes, bytes, str, bool]  # outcome, stdout, stderr, "exit" | "timeout", over cap


@dataclass(frozen=True, slots=True)
class Mode:
    namespaces: str  # "user", "root" or "none" (see _launch.py)
    uid: int | None  # dropped to (agentroll runs as root), or None
    python: str = sys.executable  # the interpreter the code runs in

    def describe(self) -> str:
        where = {
            "user": "network, pid and user namespaces (no network)",
            "root": "network and pid namespaces (no network)",
            "none": "no namespaces: the code has the network, and processes that leave its group may outlive the run",
        }[self.namespaces]
        user = f"; runs as uid {self.uid}" if self.uid is not None else ""
        return f"local child processes: {where}{user}; in {self.python}"


def candidates(python: str) -> list[Mode]:
    """The set-ups to try, most isolated first; for each, the interpreter asked for, then the system's (a user
    `nobody` cannot run an interpreter under root's home), never root."""
    root = hasattr(os, "geteuid") and os.geteuid() == 0
    uid = NOBODY if root else None
    kinds = ["user", *(["root"] if root else []), "none"] if sys.platform.startswith("linux") else ["none"]
    system = [p for p in SYSTEM_PYTHONS if os.path.exists(p) and os.path.realpath(p) != os.path.realpath(python)]
    return [Mode(kind, uid, p) for kind in kinds for p in [python, *(system if uid is not None else [])]]


class LocalSandbox:
    kind = "local"

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        self.mode: Mode | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(1)
        self._lock = asyncio.Lock()

    def _bind(self) -> None:
        """Semaphore and lock of the running loop (a Generator may be used from one `asyncio.run` after another)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            self._slots = asyncio.Semaphore(self.settings.slots)
            self._lock = asyncio.Lock()

    async def describe(self) -> str:
        return (await self._ready()).describe()

    async def run(self, code: str, stdin: str | None = None, timeout_s: float = 10.0) -> RunResult:
        """`code` as a Python program fed `stdin`, killed at `timeout_s` of wall-clock time."""
        mode = await self._ready()
        async with self._slots:
            return await self._run(mode, code, stdin, timeout_s)

    async def aclose(self) -> None:
        pass

    # -- set-up -------------------------------------------------------------------------------------------------
    async def _ready(self) -> Mode:
        self._bind()
        if self.mode is not None:
            return self.mode
        async with self._lock:
            if self.mode is None:
                sweep(self.settings.tmp_dir or tempfile.gettempdir())
                why = []
                for mode in candidates(self.settings.python):
                    failure = await self._probe(mode)
                    if failure is None:
                        self.mode = mode
                        break
                    why.append(f"{mode.namespaces} with {mode.python}: {failure}")
                if self.mode is None:  # nothing will ever run here: a set-up error, not a passing failure
                    raise UsageError(
                        f"the local sandbox cannot start a program here ({'; '.join(why)}); use --sandbox-url"
                    )
                log.info("sandbox: %s", self.mode.describe())
                if self.mode.namespaces == "none":
                    log.warning(
                        "sandbox: no network namespace can be made here (%s): model code runs with the "
                        "network; use --sandbox-url for real isolation",
                        "; ".join(why),
                    )
        return self.mode

    async def _probe(self, mode: Mode) -> str | None:
        """None when `mode` sets up and runs its interpreter here, else why not."""
        workdir = self._workdir(mode)
        try:
            outcome, _, err, _, _ = await self._launch(mode, workdir, b"", 30.0, ["-S", "-c", "pass"])
        except SandboxUnavailable as exc:
            return str(exc)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if outcome == {"exit": 0}:
            return None
        last = err.decode("utf-8", "replace").strip().rsplit("\n", 1)[-1]
        return str(outcome.get("setup") or last or outcome or "the launcher said nothing")

    def _workdir(self, mode: Mode) -> str:
        workdir = tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-", dir=self.settings.tmp_dir)
        if mode.uid is not None:
            os.chown(workdir, mode.uid, mode.uid)
        return workdir

    def _config(self, mode: Mode, workdir: str, timeout_s: float, status_fd: int, args: list[str]) -> dict[str, Any]:
        s = self.settings
        processes = (
            s.processes if mode.namespaces == "user" else (s.processes * s.slots if mode.uid is not None else None)
        )  # shared by every run as `nobody`; else off
        env = {
            "PATH": SAFE_PATH,
            "HOME": workdir,
            "TMPDIR": workdir,
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        return {
            "parent": os.getpid(),
            "workdir": workdir,
            "status_fd": status_fd,
            "namespaces": mode.namespaces,
            "uid": mode.uid,
            "gid": mode.uid,
            "argv": [mode.python, "-I", "-B", "-X", "utf8", *args],
            "env": env,
            "limits": {
                "cpu_s": math.ceil(timeout_s) + 1,
                "as_bytes": s.memory_mb << 20,
                "fsize_bytes": s.file_size_mb << 20,
                "nproc": processes,
            },
        }

    # -- one run ------------------------------------------------------------------------------------------------
    async def _run(self, mode: Mode, code: str, stdin: str | None, timeout_s: float) -> RunResult:
        workdir = self._workdir(mode)
        try:
            program = Path(workdir) / "main.py"
            program.write_bytes(code.encode("utf-8", "replace"))
            program.chmod(0o644)
            data = (stdin or "").encode("utf-8", "replace")
            start = time.monotonic()
            outcome, out, err, ended, over = await self._launch(mode, workdir, data, timeout_s)
            duration = round(time.monotonic() - start, 4)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        if "setup" in outcome:
            raise SandboxUnavailable(f"the local sandbox could not be set up: {outcome['setup']}")
        exit_code = outcome.get("exit", -outcome["signal"] if "signal" in outcome else None)
        stdout, stderr = relative(out, workdir), relative(err, workdir)
        if exit_code == SETUP_FAILED and "sandbox: the program could not start" in stderr:
            raise SandboxUnavailable(stderr.strip().splitlines()[-1])
        return RunResult(
            classify(exit_code, stderr, ended, over),
            stdout,
            stderr,
            None if ended == "timeout" else exit_code,
            duration,
        )

    async def _launch(
        self, mode: Mode, workdir: str, data: bytes, timeout_s: float, args: tuple[str, ...] | list[str] = ("main.py",)
    ) -> Launched:
        """Start the launcher, feed stdin, collect both streams (capped), kill the group when it ends, overruns
        or writes too much. Returns (outcome, stdout, stderr, how it ended: "exit" or "timeout", over cap).

        A protocol rather than `create_subprocess_exec`: its `wait()` ends only once every pipe has closed, so a
        process that escaped the group holding stdout would hold the run for good."""
        loop = asyncio.get_running_loop()
        status_r, status_w = os.pipe()
        config = self._config(mode, workdir, timeout_s, status_w, list(args))
        cmd = [self.settings.python, "-I", "-S", "-B", LAUNCHER, orjson.dumps(config).decode()]
        try:
            transport, run = await loop.subprocess_exec(
                lambda: _Run(loop, self.settings.max_output_bytes),
                *cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(status_w,),
                start_new_session=True,
                env={"PATH": SAFE_PATH},
            )
        except OSError as exc:
            os.close(status_r)
            raise SandboxUnavailable(f"cannot start the sandbox launcher: {exc}") from exc
        finally:
            os.close(status_w)
        status = asyncio.ensure_future(_read_status(status_r))
        ended = "exit"
        try:
            stdin = cast("asyncio.WriteTransport | None", transport.get_pipe_transport(0))
            if stdin is not None:
                if data:
                    stdin.write(data)  # buffered by the transport: a program that never reads cannot block us
                stdin.close()  # after the buffer is written
            done, _ = await asyncio.wait(
                {run.exited, run.overflow}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                ended = "timeout"
        finally:
            _kill_group(transport.get_pid())
            await asyncio.wait({run.exited, *run.closed}, timeout=DRAIN_S)  # a straggler's pipes are given up
            transport.close()
            read, _ = await asyncio.wait({status}, timeout=DRAIN_S)
            if not read:
                status.cancel()
        outcome = status.result() if read and not status.cancelled() else {}
        return outcome, bytes(run.out), bytes(run.err), ended, run.overflow.done()


class _Run(asyncio.SubprocessProtocol):
    """One launcher's streams, each kept to its first `cap` bytes, and when it exits."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cap: int) -> None:
        self.cap = cap
        self.out, self.err = bytearray(), bytearray()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.overflow: asyncio.Future[None] = loop.create_future()
        self.closed: list[asyncio.Future[None]] = [loop.create_future(), loop.create_future()]

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        kept = self.out if fd == 1 else self.err
        room = self.cap - len(kept)
        kept += data[: max(room, 0)]
        if len(data) > room and not self.overflow.done():
            self.overflow.set_result(None)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd in (1, 2) and not self.closed[fd - 1].done():
            self.closed[fd - 1].set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


def classify(exit_code: int | None, stderr: str, ended: str, over: bool) -> Status:
    if over:
        return "output_limit"
    if ended == "timeout" or exit_code == -signal.SIGXCPU:  # wall clock, or the CPU-seconds limit
        return "timeout"
    if exit_code == 0:
        return "ok"
    tail = stderr.rstrip().rsplit("\n", 1)[-1]
    if tail.startswith("MemoryError") or "Cannot allocate memory" in tail:
        return "memory"
    return "error"


def relative(data: bytes, workdir: str) -> str:
    """A stream as text, paths in the run directory shown relative to it (the directory itself as `.`): its
    name holds agentroll's pid and a random part, so identical seeded runs would show the model different
    tracebacks (`File "/tmp/agentroll-sandbox-123-x7q/main.py"` is shown as `File "main.py"`)."""
    text = data.decode("utf-8", "replace")
    for path in sorted({workdir, os.path.realpath(workdir)}, key=len, reverse=True):
        text = text.replace(path + os.sep, "").replace(path, ".")
    return text


def sweep(tmp_dir: str) -> None:
    """Remove the run directories of an agentroll that is gone: one killed between making a directory and
    handing it to its launcher (which removes it in every other case) leaves it behind."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(tmp_dir):
            pid = entry.name.removeprefix(WORKDIR_PREFIX).split("-", 1)[0]
            if entry.name.startswith(WORKDIR_PREFIX) and pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(entry.path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _read_status(fd: int) -> dict[str, Any]:
    """The launcher's outcome line, read from its status pipe once every writer has closed it."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb"))
    try:
        raw = await reader.read()
    finally:
        transport.close()
    try:
        outcome = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return {}
    return outcome if isinstance(outcome, dict) else {}
