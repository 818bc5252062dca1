"""A few worker processes, one call at a time each, every call timed on its own: math checks (`CheckPool`,
`_worker.py`) and a user's sync reward function (`WorkerPool`, `_user_function.py`).

Why not `ProcessPoolExecutor`: a timeout there can only be put on the wait, so the time a check spends queued
counts against it, and a stuck worker can only be removed by killing the whole pool, which loses every check
queued behind it. Here the clock starts when a worker starts the check; an overrun kills and replaces that one
worker, and the queue goes on. The workers are plain subprocesses on pipes (no multiprocessing resource
tracker to leave behind), and they die with agentroll (see `_worker.py`). PR_SET_PDEATHSIG fires when the
*thread* that started a worker ends: they are started from the event loop's thread, which outlives the loop.

The parent's side is event-loop callbacks on the workers' pipes: an uncached check costs one write and one
read, with no thread hand-off. One event loop at a time: a pool used from a new loop (`asyncio.run` again)
keeps its idle workers and replaces the others.

A worker answers `R` once ready (or `E"why"` and exits), then one line per call line.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import subprocess
import sys
import weakref
from pathlib import Path

import orjson

WORKER = str(Path(__file__).with_name("_worker.py"))


class CheckTimeout(Exception):
    """The call overran its time; its worker was killed."""


class CheckFailed(Exception):
    """The call raised, or its worker died or could not start."""


class WorkerUnavailable(CheckFailed):
    """No worker could be started: nothing can be checked (a set-up failure)."""


class _Job:
    __slots__ = ("future", "payload")

    def __init__(self, payload: bytes, future: asyncio.Future[bytes]) -> None:
        self.payload, self.future = payload, future


class _Worker:
    __slots__ = ("alive", "buffer", "job", "proc", "ready", "timer", "why")

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.alive = True
        self.buffer = b""
        self.ready = False
        self.job: _Job | None = None
        self.timer: asyncio.TimerHandle | None = None  # the running check's deadline, or the start-up's
        self.why = ""  # what it said before it was ready: why it could not set up

    @property
    def fd_out(self) -> int:
        assert self.proc.stdout is not None
        return self.proc.stdout.fileno()


def _reap(procs: set[subprocess.Popen[bytes]]) -> None:
    """Kill and wait for every worker; also run at garbage collection and at interpreter exit."""
    for proc in list(procs):
        _kill(proc)
    procs.clear()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        proc.kill()
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)  # a SIGKILLed process is gone within microseconds


class WorkerPool:
    """Workers started by `argv` (`sys.executable` and a script run by path; agentroll's pid is added), `size` at
    most, as calls need them."""

    what = "worker"

    def __init__(self, argv: list[str], size: int = 1, timeout_s: float = 10.0, start_timeout_s: float = 120.0) -> None:
        self.argv = argv
        self.size = max(1, size)
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._workers: list[_Worker] = []
        self._idle: list[_Worker] = []
        self._queue: collections.deque[_Job] = collections.deque()
        self._procs: set[subprocess.Popen[bytes]] = set()
        self._finalizer = weakref.finalize(self, _reap, self._procs)

    async def call(self, payload: bytes) -> bytes:
        """A worker's reply line to `payload` (one line). Raises CheckTimeout or CheckFailed. Cancelling the
        caller drops a queued call, or lets a running one finish (or time out) with its result thrown away."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._adopt(loop)
        job = _Job(payload, loop.create_future())
        if self._idle:
            self._start(self._idle.pop(), job)
        else:
            self._queue.append(job)
            if len(self._workers) < self.size:
                self._spawn()
        return await job.future

    def close(self) -> None:
        for worker in list(self._workers):
            self._discard(worker)
        for job in self._queue:
            if not job.future.done():
                job.future.set_exception(CheckFailed(f"the {self.what}s were closed"))
        self._queue.clear()
        _reap(self._procs)
        self._loop = None

    # --- workers ---------------------------------------------------------------------------------------

    def _spawn(self) -> None:
        assert self._loop is not None
        try:
            proc = subprocess.Popen(
                [*self.argv, str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0
            )
        except OSError as exc:
            self._fail_queue(f"cannot start a {self.what}: {exc}")
            return
        self._procs.add(proc)
        worker = _Worker(proc)
        self._workers.append(worker)
        os.set_blocking(worker.fd_out, False)
        self._loop.add_reader(worker.fd_out, self._readable, worker)
        worker.timer = self._loop.call_later(self.start_timeout_s, self._start_overrun, worker)

    def _start(self, worker: _Worker, job: _Job) -> None:
        assert self._loop is not None and worker.proc.stdin is not None
        worker.job = job
        try:
            view = memoryview(job.payload)
            while view:  # a pipe may take a long check in parts; the idle worker is reading
                view = view[worker.proc.stdin.write(view) or 0 :]
        except OSError:  # it died while idle (unnoticed if that was under another event loop)
            worker.job = None
            self._queue.appendleft(job)  # the check never ran: it goes to another worker
            self._lost(worker)
            return
        worker.timer = self._loop.call_later(self.timeout_s, self._overrun, worker)

    def _free(self, worker: _Worker) -> None:
        while self._queue:
            job = self._queue.popleft()
            if not job.future.done():  # a cancelled caller's check is dropped here
                self._start(worker, job)
                return
        self._idle.append(worker)

    def _readable(self, worker: _Worker) -> None:
        try:
            data = os.read(worker.fd_out, 65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._lost(worker)
            return
        if worker.buffer:
            data, worker.buffer = worker.buffer + data, b""
        while data and worker.alive:
            line, newline, data = data.partition(b"\n")
            if not newline:
                worker.buffer = line
                return
            self._reply(worker, line)

    def _reply(self, worker: _Worker, line: bytes) -> None:
        if worker.timer is not None:
            worker.timer.cancel()
            worker.timer = None
        if not worker.ready:
            worker.ready = line == b"R"
            if worker.ready:
                self._free(worker)
            elif line.startswith(b"E"):
                with contextlib.suppress(orjson.JSONDecodeError):
                    worker.why = str(orjson.loads(line[1:]))
            return
        job, worker.job = worker.job, None
        if job is not None and not job.future.done():
            job.future.set_result(line)
        self._free(worker)

    def _overrun(self, worker: _Worker) -> None:
        job = worker.job
        self._discard(worker)
        if job is not None and not job.future.done():
            job.future.set_exception(CheckTimeout())
        self._refill()

    def _start_overrun(self, worker: _Worker) -> None:
        self._discard(worker)
        self._fail_queue(f"the {self.what} did not start within {self.start_timeout_s:g}s")

    def _lost(self, worker: _Worker) -> None:
        """The worker's pipe closed: it died, or was killed from outside."""
        job = worker.job
        with contextlib.suppress(subprocess.TimeoutExpired):  # its own exit code, before our kill replaces it
            worker.proc.wait(timeout=1)  # its pipe closed: it has exited, or is exiting
        code = worker.proc.returncode
        self._discard(worker)
        if job is not None and not job.future.done():
            job.future.set_exception(CheckFailed(f"the {self.what} died (exit code {code})"))
        if worker.ready:
            self._refill()
            return
        why = f"the {self.what} could not start (exit code {code}{': ' + worker.why if worker.why else ''})"
        # Restarting it at once could loop for ever: fail what waits; the next check tries again.
        self._fail_queue(why)

    def _fail_queue(self, why: str) -> None:
        """No worker could be had. Unless others are running or starting, the waiting checks fail."""
        if self._workers:
            return
        while self._queue:
            job = self._queue.popleft()
            if not job.future.done():
                job.future.set_exception(WorkerUnavailable(why))

    def _refill(self) -> None:
        """A worker is gone: replace it if checks are waiting."""
        while self._queue and self._queue[0].future.done():
            self._queue.popleft()
        if self._queue and len(self._workers) < self.size:
            self._spawn()

    def _discard(self, worker: _Worker, loop: asyncio.AbstractEventLoop | None = None) -> None:
        worker.alive = False
        if worker in self._workers:
            self._workers.remove(worker)
        if worker in self._idle:
            self._idle.remove(worker)
        if worker.timer is not None:
            worker.timer.cancel()
            worker.timer = None
        worker.job = None
        loop = loop or self._loop
        if loop is not None and worker.proc.stdout is not None and not worker.proc.stdout.closed:
            with contextlib.suppress(Exception):  # the loop may be closed already
                loop.remove_reader(worker.fd_out)
        _kill(worker.proc)
        self._procs.discard(worker.proc)

    def _adopt(self, loop: asyncio.AbstractEventLoop) -> None:
        """Move to the caller's loop. Idle and starting workers follow it; a running check belongs to a loop
        that is gone (its caller with it), so its worker is replaced; so are checks queued there."""
        old, self._loop = self._loop, loop
        self._queue.clear()
        for worker in list(self._workers):
            if worker.job is not None:
                self._discard(worker, old)
                continue
            if old is not None:
                with contextlib.suppress(Exception):
                    old.remove_reader(worker.fd_out)
            loop.add_reader(worker.fd_out, self._readable, worker)
            if worker.timer is not None:
                worker.timer.cancel()
                worker.timer = loop.call_later(self.start_timeout_s, self._start_overrun, worker)


class CheckPool(WorkerPool):
    """math-verify checks (`_worker.py`)."""

    what = "math worker"

    def __init__(self, size: int = 1, timeout_s: float = 10.0, start_timeout_s: float = 120.0) -> None:
        super().__init__([sys.executable, WORKER], size, timeout_s, start_timeout_s)

    async def check(self, label: str, answer: str, inner_timeout_s: int) -> bool:
        """Whether the worker finds them equal. Raises CheckTimeout or CheckFailed."""
        try:
            payload = orjson.dumps([label, answer, inner_timeout_s]) + b"\n"
        except orjson.JSONEncodeError as exc:  # a lone surrogate, say
            raise CheckFailed(f"cannot send the answer to the worker: {exc}") from None
        line = await self.call(payload)
        if line == b"1" or line == b"0":
            return line == b"1"
        raise CheckFailed(orjson.loads(line[1:]) if line.startswith(b"E") else f"unexpected reply {line[:200]!r}")
