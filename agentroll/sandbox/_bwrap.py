"""The local sandbox on bubblewrap (`bwrap`): one run's command, and what happens around it.

Each run is a `bwrap` with namespaces of its own (user, mount, pid, network, IPC, UTS, cgroup where the kernel has
them; no new user namespace inside: `--disable-userns`), a new session, `--die-with-parent`, all capabilities
dropped, a seccomp allow-list (`_seccomp.py`), uid and gid 65534 inside, and a filesystem built from nothing:
read-only `/usr` (and `/bin`, `/lib`... as the host has them) and the interpreter's prefixes, its own `/proc` (its
init's `/proc/1` covered), a minimal `/dev` (read-only, with a capped tmpfs `/dev/shm`, no pseudo-terminals), a
capped tmpfs `/sandbox` for its working directory (`/tmp` and `/var/tmp` lead there), a read-only root. As root,
agentroll starts `bwrap` as the user of its own (`run_uids`: a uid of no account and no running process, leased
while the run lives so that no other live run is that uid, `_lease.py`; else `nobody`): the run's processes are that
user on the host too, never root in a namespace, and no other host process shares their user.

Nothing is written on the host for a run: the program reaches it through a descriptor (`--file`), its input
through stdin. What happened comes out of band: `--json-status-fd` says the sandbox's init pid, then, only when
the program was started, its exit code; the program cannot write there. Where the run has a cgroup
(`_cgroup.py`), agentroll moves that init into it before the program may start (`--block-fd`). The resource
limits are set inside, by `prlimit` (util-linux; else a few lines of Python) on itself before it starts the
interpreter: they hold for the program from its first instruction, and the process cap counts in the run's own
user namespace (set from outside, before that namespace exists, it would count every run's processes together;
agentroll as root cannot set them from outside either without CAP_SYS_RESOURCE, which containers drop).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import resource
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any

import orjson

from . import SandboxSettings, SandboxUnavailable
from . import _lease as lease
from . import _seccomp as seccomp
from ._cgroup import Cgroups, RunGroup
from ._lease import own_uids, running_uids

WORKDIR = "/sandbox"
NOBODY = 65534
SETUP_TIMEOUT_S = 60.0  # a sandbox is set up in milliseconds; past this one never will be
DRAIN_S = 5.0  # after bwrap has gone, how long its status may take to be read
FALLBACK_PROCESS_MB = 256  # without a cgroup: the budget split in processes of at least this much
NOFILE = 1024  # open files per process
INIT = "/proc/1"  # the sandbox's init (bwrap's pid 1), the program's own uid: covered, so that the program can
# neither read nor write its memory (/proc/1/mem) nor reach its descriptors (the eventfd whose count bwrap reports
# as the program's exit status): not dumpable would do, but bwrap's init is; hidepid would not (the same uid)
PTMX = "/dev/pts/ptmx"  # covered (nodev: opening it is refused): every pty counts against kernel.pty.max, host-wide
SET_LIMITS = (  # without prlimit: `python -c SET_LIMITS RESOURCE:SOFT:HARD,... PROGRAM ARGS...`
    "import os, resource, sys\n"
    "for item in sys.argv[1].split(','):\n"
    "    kind, soft, hard = map(int, item.split(':'))\n"
    "    resource.setrlimit(kind, (soft, hard))\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)
LINKED = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")  # links into /usr, or directories, as the host has
ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": WORKDIR,
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "OPENBLAS_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
NO_BWRAP = (
    "the local sandbox needs bubblewrap (bwrap), which is not installed: install it (Debian and Ubuntu: "
    "apt-get install bubblewrap; Fedora: dnf install bubblewrap), or run model code on a SandboxFusion server "
    "(--sandbox-url URL), or, knowing that it is then unconfined, pass --sandbox unsafe-local"
)


def find_bwrap() -> str | None:
    return shutil.which("bwrap")


@dataclass(frozen=True, slots=True)
class Limits:
    """A run's limits: with a cgroup, for all its processes together; without one, a process cap and an address
    space per process that add up to the memory budget."""

    cgroups: Cgroups | None
    memory_bytes: int
    processes: int  # processes and threads of the program (the sandbox's init is not counted)
    address_space: int  # per process
    disk_bytes: int
    cpu_s: int  # per process; with a cgroup, the run also gets one core's worth at most

    @classmethod
    def of(cls, settings: SandboxSettings, cgroups: Cgroups | None, timeout_s: float) -> Limits:
        memory = settings.memory_mb << 20
        processes = settings.processes
        space = memory
        if cgroups is None:
            processes = max(1, min(processes, settings.memory_mb // FALLBACK_PROCESS_MB))
            space = memory // processes
        return cls(cgroups, memory, processes, space, settings.disk_mb << 20, math.ceil(timeout_s) + 1)

    def describe(self) -> str:
        mb = self.memory_bytes >> 20
        if self.cgroups is not None:
            return (
                f"per run, a cgroup: {mb} MB of memory for all its processes (files in its tmpfs included), "
                f"{self.processes} processes and threads, one core"
            )
        return (
            f"per run, no cgroup can be made here: at most {self.processes} processes and threads of "
            f"{self.address_space >> 20} MB of address space each ({mb} MB in all; what the kernel holds for its "
            "sockets and files' names is not bounded: docs/tool-use.md)"
        )

    def rlimits(self) -> dict[str, tuple[int, int]]:
        nproc = self.processes + 1  # the sandbox's init counts
        return {
            "cpu": (self.cpu_s, self.cpu_s + 1),  # SIGXCPU at the first, SIGKILL at the second
            "as": (self.address_space, self.address_space),
            "fsize": (self.disk_bytes, self.disk_bytes),
            "nproc": (nproc, nproc),
            "core": (0, 0),
            "nofile": (NOFILE, NOFILE),
        }

    def command(self, prlimit: str | None, python: str) -> list[str]:
        """What sets these limits on itself, then starts the program with them."""
        limits = self.rlimits()
        if prlimit is not None:
            return [prlimit, *(f"--{name}={soft}:{hard}" for name, (soft, hard) in limits.items()), "--"]
        spec = ",".join(f"{getattr(resource, 'RLIMIT_' + n.upper())}:{s}:{h}" for n, (s, h) in limits.items())
        return [python, "-I", "-S", "-c", SET_LIMITS, spec]


@dataclass(frozen=True, slots=True)
class Plan:
    """How this machine runs programs: bwrap, the interpreter and what it needs bound, as whom, the limits."""

    bwrap: str
    prlimit: str | None  # util-linux's, under /usr (so in the sandbox too); None: SET_LIMITS does it
    python: str
    binds: tuple[str, ...]  # besides /usr: host directories bound read-only at the same place
    uid: int | None  # the host user bwrap runs as (agentroll is root: `run_uids`); None: agentroll's own
    cgroups: Cgroups | None
    settings: SandboxSettings
    seccomp: bytes | None = None  # the filter (`_seccomp.py`); None: this architecture has none

    def describe(self) -> str:
        who = "agentroll's user" if self.uid is None else "nobody (uid 65534)" if self.uid == NOBODY else None
        who = who or f"uid {self.uid} (the runs' own: no account's)"
        limits = Limits.of(self.settings, self.cgroups, 1).describe()
        calls = "a seccomp filter" if self.seccomp is not None else "no seccomp filter on this architecture"
        return (
            f"local, bubblewrap: a filesystem of its own, no network, its own pid, IPC and user namespaces, "
            f"{calls}; runs as {who} on the host, uid 65534 inside; in {self.python}; {limits}; "
            f"{self.settings.disk_mb} MB of files"
        )

    def argv(
        self, status_fd: int, block_fd: int | None, program_fd: int, limits: Limits, seccomp_fd: int | None
    ) -> list[str]:
        disk = str(self.settings.disk_mb << 20)
        argv = [
            self.bwrap,
            *("--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts"),
            *("--unshare-cgroup-try", "--disable-userns", "--die-with-parent", "--new-session"),
            *("--cap-drop", "ALL", "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox"),
            *("--ro-bind", "/usr", "/usr"),
        ]
        for path in LINKED:
            if os.path.islink(path):
                argv += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                argv += ["--ro-bind", path, path]
        for path in self.binds:
            argv += ["--ro-bind", path, path]
        argv += [
            *("--proc", "/proc", "--size", "4096", "--tmpfs", INIT, "--remount-ro", INIT),  # its init: not there
            *("--dev", "/dev", "--ro-bind", "/dev/null", PTMX),  # no pseudo-terminals
            *("--size", disk, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"),
            *("--size", disk, "--tmpfs", WORKDIR, "--symlink", WORKDIR, "/tmp", "--dir", "/var"),
            *("--symlink", WORKDIR, "/var/tmp", "--perms", "0644", "--file", str(program_fd), f"{WORKDIR}/main.py"),
            *("--remount-ro", "/", "--chdir", WORKDIR, "--json-status-fd", str(status_fd)),
            *(("--block-fd", str(block_fd)) if block_fd is not None else ()),
            *(("--seccomp", str(seccomp_fd)) if seccomp_fd is not None else ()),
            "--",
            *limits.command(self.prlimit, self.python),
            *(self.python, "-I", "-B", "-X", "utf8", "main.py"),
        ]
        return argv

    def launch(self, code: str, timeout_s: float) -> Launch:
        return Launch(self, code, Limits.of(self.settings, self.cgroups, timeout_s))


def prefixes_allowed(prefixes: list[str]) -> tuple[list[str], str | None]:
    """The interpreter's prefixes to bind (those outside /usr), or why one must not be: the root, a home, or one
    holding the working directory would show the program what it must not see."""
    home = os.path.realpath(os.path.expanduser("~"))
    here = os.path.realpath(os.getcwd())
    binds: list[str] = []
    for given in sorted(set(prefixes), key=len):
        path = os.path.realpath(given)  # judged where it really is; bound where the interpreter looks for it
        if path == "/usr" or path.startswith("/usr/"):
            continue
        if path == "/" or path == home or here == path or here.startswith(path + "/"):
            return [], f"its prefix {given} would show the program too much of this machine"
        if not any(given == b or given.startswith(b + "/") for b in binds):
            binds.append(given)
    return binds, None


async def prefixes_of(python: str) -> tuple[list[str], str | None]:
    """The directories an interpreter needs (its prefixes), as it says them; or why it cannot say. Run in a
    thread: a start cancelled meanwhile leaves no process behind (it ends within its timeout)."""
    probe = "import json, sys\nprint(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]))"
    try:
        done = await asyncio.to_thread(
            subprocess.run, [python, "-I", "-S", "-c", probe], capture_output=True, timeout=SETUP_TIMEOUT_S
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"cannot run it: {exc}"
    if done.returncode != 0:
        return [], f"it failed: {done.stderr.decode('utf-8', 'replace').strip()[-200:]}"
    return prefixes_allowed([str(p) for p in orjson.loads(done.stdout)])


class Launch:
    """One run's bwrap: its descriptors, its cgroup, its set-up before the program may start, its outcome."""

    workdir = WORKDIR

    def __init__(self, plan: Plan, code: str, limits: Limits) -> None:
        """OSError when the machine cannot give the run what it needs (its cgroup, descriptors): nothing of it is
        left made."""
        self.group: RunGroup | None = limits.cgroups.run() if limits.cgroups is not None else None
        self._theirs: list[int] = []
        self.block_w = self.status_r = -1
        self._status: asyncio.StreamReader | None = None
        self._transport: asyncio.ReadTransport | None = None
        try:
            self._prepare(plan, code, limits)
        except OSError:
            self.release()
            if self.group is not None:
                self.group.forget()
            raise

    def _prepare(self, plan: Plan, code: str, limits: Limits) -> None:
        self.program = os.memfd_create("agentroll-program", os.MFD_CLOEXEC)
        self._theirs.append(self.program)
        os.write(self.program, code.encode("utf-8", "replace"))
        os.lseek(self.program, 0, os.SEEK_SET)
        self.status_r, status_w = os.pipe()
        self._theirs.append(status_w)
        block_r = None
        self.uid = plan.uid
        if self.group is not None or plan.uid is not None:  # the program waits for what `ready` does
            block_r, self.block_w = os.pipe()
            self._theirs.append(block_r)
        if plan.seccomp is not None:
            self._theirs.append(seccomp.descriptor(plan.seccomp))
        self.argv = plan.argv(status_w, block_r, self.program, limits, self._theirs[-1] if plan.seccomp else None)
        self.pass_fds = tuple(self._theirs)
        user = {"user": plan.uid, "group": plan.uid, "extra_groups": []} if plan.uid is not None else {}
        self.popen: dict[str, Any] = {"env": dict(ENV), **user}

    def spawned(self) -> None:
        """The child has its copies: ours go."""
        for fd in self._theirs:
            os.close(fd)
        self._theirs = []

    async def ready(self, transport: asyncio.SubprocessTransport) -> bool:
        """Start reading the sandbox's status. As root, hand the run's pipes to nobody (the program may reopen
        them by path: /dev/stdin); with a cgroup, move the sandbox's init into it. Then let the program start.
        False when the sandbox ended before that (bwrap says why on stderr); SandboxUnavailable when the cgroup
        cannot be joined."""
        loop = asyncio.get_running_loop()
        self._status = status = asyncio.StreamReader()
        self._transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(status), os.fdopen(self.status_r, "rb")
        )
        self.status_r = -1
        if self.block_w < 0:
            return True
        if self.uid is not None:
            for fd in range(3):
                pipe = transport.get_pipe_transport(fd)
                if pipe is not None and pipe.get_extra_info("pipe") is not None:
                    with contextlib.suppress(OSError, ValueError):
                        os.fchown(pipe.get_extra_info("pipe").fileno(), self.uid, self.uid)
        if self.group is not None:
            try:
                line = await asyncio.wait_for(status.readline(), SETUP_TIMEOUT_S)
                child = int(orjson.loads(line)["child-pid"])
            except (asyncio.TimeoutError, orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                return False
            try:
                self.group.attach(child)
            except ProcessLookupError:
                return False
            except OSError as exc:
                raise SandboxUnavailable(f"the run could not join its cgroup: {exc}") from exc
        try:
            os.write(self.block_w, b"1")
        except BrokenPipeError:  # it ended in its set-up
            return False
        return True

    async def outcome(self, returncode: int | None, killed: bool) -> dict[str, Any]:
        """After bwrap has gone: {"exit": n} or {"signal": n} when the program ran (bwrap reports its exit code
        only then); else {} when it was killed, and {"setup": ""} when bwrap gave up by itself (exit 1: it could
        not set the sandbox up, and said why on stderr)."""
        lines = b""
        if self._status is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                lines = await asyncio.wait_for(self._status.read(), DRAIN_S)
        for line in lines.splitlines():
            with contextlib.suppress(orjson.JSONDecodeError, TypeError):
                said = orjson.loads(line)
                if isinstance(said, dict) and isinstance(said.get("exit-code"), int):
                    code = said["exit-code"]  # bwrap's own: 128 + n for a signal
                    return {"signal": code - 128} if 128 < code < 128 + 65 else {"exit": code}
        return {"setup": ""} if returncode == 1 and not killed else {}

    def memory_killed(self) -> bool:
        return self.group is not None and self.group.memory_killed()

    def release(self) -> None:
        """Its descriptors and status pipe, let go at once (also when the run is cancelled)."""
        for fd in (*self._theirs, self.block_w, self.status_r):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._theirs, self.block_w, self.status_r = [], -1, -1
        if self._transport is not None:
            self._transport.close()

    async def close(self) -> None:
        self.release()
        if self.group is not None:
            await self.group.remove()


def run_uids() -> tuple[list[int | None], int | None]:
    """The host users a run may be, most wanted first, and the descriptor of the first one's lease (None: no
    lease). As root: a uid of the runs' own (mapped in this user namespace, no account's, no running process's:
    near the top of the mapped ids), leased for as long as the sandbox lives so that no other live run on the
    host is that uid (`_lease.py`); then `nobody`, for a machine that will not switch to it or gives no lease.
    Runs as `nobody` share that user with whatever else the host runs as nobody (a server's workers, another
    tool's jobs), which may open their pipes through /proc/PID/fd or trace them. Not root: agentroll's own user
    (None)."""
    if os.geteuid() != 0:
        return [None], None
    try:
        with open("/proc/self/uid_map") as mapping:
            ranges = [tuple(map(int, line.split())) for line in mapping.read().splitlines()]
    except (OSError, ValueError):
        ranges = []
    leased = lease.take(own_uids(ranges, {NOBODY, NOBODY + 1, *running_uids()}))
    return ([NOBODY], None) if leased is None else ([leased[0], NOBODY], leased[1])


def plan_for(
    bwrap: str, python: str, binds: list[str], settings: SandboxSettings, cgroups: Cgroups | None, uid: int | None
) -> Plan:
    prlimit = shutil.which("prlimit", path="/usr/bin:/usr/sbin")  # under /usr: bound into the sandbox
    return Plan(bwrap, prlimit, python, tuple(binds), uid, cgroups, settings, seccomp.program())
