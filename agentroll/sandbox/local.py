"""The local sandbox: one sandboxed process tree per run, supervised from the event loop.

By default each run is a bubblewrap sandbox (`_bwrap.py`): a filesystem, network, processes and user of its own,
limits per run (a cgroup where one can be made). Without bwrap, local code runs only when asked for by name,
`--sandbox unsafe-local` (`_unsafe.py`), with a warning; otherwise making the sandbox is a one-line error saying
how to get bwrap or to use `--sandbox-url`. Never a silently weaker set-up.

The set-up is found once, by running a trivial program through it: the interpreter asked for, else the system's
(as root the program runs as `nobody`, who may not reach an interpreter under /root); it is logged at start.
Every run then: the program's streams read up to the output cap (more ends it: `output_limit`), its wall-clock
timeout, the whole tree killed when it ends, overruns or writes too much, at most `concurrency` runs at once.
What the sandbox says about a run (it started, its exit status) comes on a descriptor the program never gets;
whatever the program prints or returns is its outcome and nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import subprocess
import tempfile
import time
import weakref
from typing import Any, Protocol, cast

from ..errors import UsageError
from . import RunResult, SandboxSettings, SandboxUnavailable, Status
from . import _bwrap as bwrap
from . import _unsafe as unsafe
from ._cgroup import Cgroups

log = logging.getLogger("agentroll")

DRAIN_S = 2.0  # after the kill, how long the pipes may take to close
SETUP_ATTEMPTS = 2  # a run whose sandbox could not be set up is tried once more before the sandbox is given up
Launched = tuple[dict[str, Any], bytearray, bytearray, str, bool]  # outcome, stdout, stderr, "exit" | "timeout", over


class Launch(Protocol):
    workdir: str
    argv: list[str]
    pass_fds: tuple[int, ...]
    popen: dict[str, Any]

    def spawned(self) -> None: ...

    async def ready(self, transport: asyncio.SubprocessTransport) -> bool: ...

    async def outcome(self, returncode: int | None, killed: bool) -> dict[str, Any]: ...

    def memory_killed(self) -> bool: ...

    def release(self) -> None: ...

    async def close(self) -> None: ...


class Plan(Protocol):
    def describe(self) -> str: ...

    def launch(self, code: str, timeout_s: float) -> Launch: ...


class LocalSandbox:
    kind = "local"

    def __init__(self, settings: SandboxSettings | None = None) -> None:
        self.settings = settings or SandboxSettings()
        if self.settings.mode not in ("bwrap", "unsafe-local"):
            raise UsageError(f"--sandbox {self.settings.mode!r}: use bwrap (the default) or unsafe-local")
        self.bwrap = bwrap.find_bwrap() if self.settings.mode == "bwrap" else None
        if self.settings.mode == "bwrap" and self.bwrap is None:
            raise UsageError(bwrap.NO_BWRAP)
        self.plan: Plan | None = None
        self._cgroups: Cgroups | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(1)
        self._lock = asyncio.Lock()
        self._uids: list[int | None] = []
        self._lease: weakref.finalize[Any, Any] | None = None  # lets go of the runs' uid's lease: at `aclose`,
        # or when the sandbox is collected without one

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
        plan = await self._ready()
        async with self._slots:
            return await self._run(plan, code, stdin, timeout_s)

    async def aclose(self) -> None:
        if self._lease is not None:
            self._lease()  # the uid is free for another run
            self._lease, self.plan = None, None
        if self._cgroups is not None:
            self._cgroups.close()
            self._cgroups = None
            self.plan = None

    # -- set-up -------------------------------------------------------------------------------------------------
    async def _ready(self) -> Plan:
        self._bind()
        if self.plan is not None:
            return self.plan
        async with self._lock:
            if self.plan is None:
                plans, why = await self._candidates()
                for plan in plans:
                    failure = await self._probe(plan)
                    if failure is None:
                        self.plan = plan
                        break
                    why.append(failure)
                if self.plan is None:  # nothing will ever run here: a set-up error, not a passing failure
                    raise UsageError(
                        f"the local sandbox cannot start a program here ({'; '.join(why)}); use --sandbox-url"
                    )
                log.info("sandbox: %s", self.plan.describe(), extra={"detail": True})  # said with --verbose
        return self.plan

    async def _candidates(self) -> tuple[list[Plan], list[str]]:
        """The set-ups to probe, most wanted first, and why those that could not even be tried were not."""
        s = self.settings
        if s.mode == "unsafe-local":
            log.warning(unsafe.WARNING)
            unsafe.sweep(s.tmp_dir or tempfile.gettempdir())
            return list(unsafe.candidates(s)), []
        assert self.bwrap is not None
        if self._cgroups is None:
            self._cgroups = Cgroups.make(s.memory_mb << 20, s.processes + 1)
        plans: list[Plan] = []
        why = []
        if self._lease is None:  # as root, reads every process's status; leased until `aclose`
            found = asyncio.ensure_future(asyncio.to_thread(bwrap.run_uids))
            try:
                self._uids, lease = await asyncio.shield(found)
            except asyncio.CancelledError:  # the thread goes on: its lease is let go once it is had
                found.add_done_callback(_let_go)
                raise
            self._lease = weakref.finalize(self, _close, lease)
        uids = self._uids
        for python in dict.fromkeys([s.python, *unsafe.SYSTEM_PYTHONS]):
            if python != s.python and not os.path.exists(python):
                continue
            binds, failure = await bwrap.prefixes_of(python)
            if failure is not None:
                why.append(f"{python}: {failure}")
                continue
            plans.extend(bwrap.plan_for(self.bwrap, python, binds, s, self._cgroups, uid) for uid in uids)
        return plans, why

    async def _probe(self, plan: Plan) -> str | None:
        """None when `plan` sets up and runs its interpreter here, else why not."""
        try:
            outcome, _, err, _, _ = await self._attempt(plan.launch("pass", 30.0), b"", 30.0)
        except (SandboxUnavailable, OSError) as exc:
            return str(exc)
        if outcome == {"exit": 0}:
            return None
        last = err.decode("utf-8", "replace").strip().rsplit("\n", 1)[-1]
        return str(outcome.get("setup") or last or outcome or "the sandbox said nothing")

    # -- one run ------------------------------------------------------------------------------------------------
    async def _run(self, plan: Plan, code: str, stdin: str | None, timeout_s: float) -> RunResult:
        data = (stdin or "").encode("utf-8", "replace")
        for attempt in range(SETUP_ATTEMPTS):
            try:
                launch = plan.launch(code, timeout_s)
            except OSError as exc:  # the machine's (no cgroup or descriptor to be had), never the program's
                why = f"the run could not be prepared: {exc}"
            else:
                start = time.monotonic()
                outcome, out, err, ended, over = await self._attempt(launch, data, timeout_s)
                duration = round(time.monotonic() - start, 4)
                if "setup" not in outcome:
                    break
                why = outcome["setup"] or err.decode("utf-8", "replace").strip()[-300:] or "it said nothing"
            if attempt + 1 == SETUP_ATTEMPTS:
                raise SandboxUnavailable(f"the local sandbox could not be set up: {why}")
            log.warning("sandbox: a run could not be set up (%s); trying it again", why)
        exit_code = outcome.get("exit", -outcome["signal"] if "signal" in outcome else None)
        stdout, stderr = relative(out, launch.workdir), relative(err, launch.workdir)
        status = classify(exit_code, stderr, ended, over, bool(outcome.get("memory")))
        return RunResult(status, stdout, stderr, None if ended == "timeout" else exit_code, duration)

    async def _attempt(self, launch: Launch, data: bytes, timeout_s: float) -> Launched:
        try:
            return await self._launch(launch, data, timeout_s)
        finally:
            launch.release()  # at once: a cancelled run may not get to run the rest
            await asyncio.shield(launch.close())

    async def _launch(self, launch: Launch, data: bytes, timeout_s: float) -> Launched:
        """Start the sandbox, let the program start once its limits are set, feed stdin, collect both streams
        (capped), kill the whole tree when it ends, overruns or writes too much. Returns (outcome, stdout,
        stderr, how it ended: "exit" or "timeout", over cap).

        A protocol rather than `create_subprocess_exec`: its `wait()` ends only once every pipe has closed, so a
        process that escaped the group holding stdout would hold the run for good."""
        loop = asyncio.get_running_loop()
        try:
            transport, run = await loop.subprocess_exec(
                lambda: _Run(loop, self.settings.max_output_bytes),
                *launch.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=launch.pass_fds,
                start_new_session=True,
                **launch.popen,
            )
        except OSError as exc:
            raise SandboxUnavailable(f"cannot start the sandbox: {exc}") from exc
        finally:
            launch.spawned()
        ended, killed = "exit", False
        try:
            if not await launch.ready(transport):
                await asyncio.wait({run.exited}, timeout=DRAIN_S)
            else:
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
            killed = not run.exited.done()
            _kill_group(transport.get_pid())
            try:
                await asyncio.wait({run.exited, *run.closed}, timeout=DRAIN_S)  # a straggler's pipes are given up
            finally:
                returncode = transport.get_returncode()
                transport.close()
        outcome = await launch.outcome(returncode, killed or run.overflow.done())
        if launch.memory_killed():  # read before the run's cgroup goes
            outcome["memory"] = True
        return outcome, run.out, run.err, ended, run.overflow.done()  # kept as read: 64 programs x 4 MB add up


class _Run(asyncio.SubprocessProtocol):
    """One sandbox's streams, each kept to its first `cap` bytes, and when it exits."""

    def __init__(self, loop: asyncio.AbstractEventLoop, cap: int) -> None:
        self.cap = cap
        self.out, self.err = bytearray(), bytearray()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.overflow: asyncio.Future[None] = loop.create_future()
        self.closed: list[asyncio.Future[None]] = [loop.create_future(), loop.create_future()]

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        kept = self.out if fd == 1 else self.err
        room = self.cap - len(kept)
        if len(data) <= room:
            kept += data
            return
        kept += data[: max(room, 0)]
        if not self.overflow.done():
            self.overflow.set_result(None)

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd in (1, 2) and not self.closed[fd - 1].done():
            self.closed[fd - 1].set_result(None)

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)


def classify(exit_code: int | None, stderr: str, ended: str, over: bool, memory_killed: bool = False) -> Status:
    if over:
        return "output_limit"
    if ended == "timeout" or exit_code == -signal.SIGXCPU:  # wall clock, or the CPU-seconds limit
        return "timeout"
    if memory_killed:  # its cgroup's memory ran out: the kernel killed one of its processes
        return "memory"
    if exit_code == 0:
        return "ok"
    tail = stderr.rstrip().rsplit("\n", 1)[-1]
    if tail.startswith("MemoryError") or "Cannot allocate memory" in tail:
        return "memory"
    return "error"


def relative(data: bytes | bytearray, workdir: str) -> str:
    """A stream as text, paths in the run directory shown relative to it (the directory itself as `.`), as
    earlier versions showed them and as identical seeded runs must (`File "/sandbox/main.py"` is shown as
    `File "main.py"`; with --sandbox unsafe-local the directory's name holds agentroll's pid and a random part)."""
    text = data.decode("utf-8", "replace")
    for path in sorted({workdir, os.path.realpath(workdir)}, key=len, reverse=True):
        if path in text:  # the directory's own name, not a longer one it begins (`/sandboxes` stays)
            text = re.sub(re.escape(path) + r"(?:/|(?![\w.-]))", lambda m: "" if m[0].endswith("/") else ".", text)
    return text


def _close(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)


def _let_go(found: asyncio.Future[tuple[list[int | None], int | None]]) -> None:
    """The lease of a start cancelled while it was being taken."""
    _close(None if found.cancelled() or found.exception() is not None else found.result()[1])


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
