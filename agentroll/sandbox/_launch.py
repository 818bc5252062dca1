"""The local sandbox's launcher: sets one run up and supervises it. Run by path, never imported by agentroll:

    python -I -S -B _launch.py CONFIG_JSON

It imports nothing of agentroll (a start costs milliseconds) and only the standard library. The process tree:

    L  this launcher, leader of its own process group (agentroll kills that group at the timeout)
    └─ A  with a pid namespace: its pid 1, which only reaps; when A ends, the kernel kills every process left
       │  in the namespace, including any that left the process group (setsid)
       └─ B  the program: resource limits set, then execve of the interpreter on main.py

L dies with agentroll (PR_SET_PDEATHSIG, SIGTERM): it then kills what it started and removes the working
directory, so nothing survives a kill -9 of agentroll; it also removes the directory when the program ends, as
agentroll may be killed before it does. A and B die with their parents (SIGKILL). The pipes are handed to the
dropped user, so the program may reopen them by path.

CONFIG: `parent` (agentroll's pid), `workdir`, `argv`, `env`, `uid`/`gid` (drop to them first: agentroll runs
as root), `namespaces` ("user": unprivileged user + network + pid namespaces, made after the drop; "root":
network + pid namespaces made as root, before the drop; "none"), `limits` {`cpu_s`, `as_bytes`, `fsize_bytes`,
`nproc` or null}, `status_fd`. The outcome goes to that fd, one JSON object a line: {"exit": n} | {"signal": n} |
{"setup": "why it could not be set up"}; a program that could not start says so there (`setup`) before its
exit is reported. The program never gets that fd: nothing it prints or returns is read as the launcher's word.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import sys

CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
STATUS_FD = 3  # where the outcome goes: the config's `status_fd`
SETUP_FAILED = 125
LINUX = sys.platform.startswith("linux")

if LINUX:
    import ctypes

    LIBC = ctypes.CDLL(None, use_errno=True)


def report(outcome: dict[str, object]) -> None:
    with contextlib.suppress(OSError):
        os.write(STATUS_FD, json.dumps(outcome).encode() + b"\n")


def die_with(parent: int | None, sig: int) -> None:
    """`sig` when the parent goes (set again after any change of credentials: the kernel clears it then).
    `parent` None: the parent is outside our pid namespace (its pid reads 0), so it cannot be checked."""
    if LINUX:
        LIBC.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if parent is not None and os.getppid() != parent:  # it went before the prctl took effect: as if signalled
        os.kill(os.getpid(), sig)
        os._exit(SETUP_FAILED)


def unshare(flags: int) -> None:
    if not LINUX or LIBC.unshare(flags) != 0:
        errno = ctypes.get_errno() if LINUX else 38
        raise OSError(errno, f"unshare: {os.strerror(errno)}")


def write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def setup(config: dict[str, object], parent: int) -> None:
    mode, uid, gid = config["namespaces"], config.get("uid"), config.get("gid")
    if mode == "root":
        unshare(CLONE_NEWNET | CLONE_NEWPID)
    if isinstance(uid, int) and isinstance(gid, int):
        for fd in (0, 1, 2):  # the pipes are root's: the program may reopen them (/dev/stdin, /dev/stdout)
            with contextlib.suppress(OSError):
                os.fchown(fd, uid, gid)
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if LINUX:
            LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # /proc/self is ours again (uid_map below)
        die_with(parent, signal.SIGTERM)
    if mode == "user":
        me, group = os.getuid(), os.getgid()
        unshare(CLONE_NEWUSER | CLONE_NEWNET | CLONE_NEWPID)
        # map our own ids: files can be made (an unmapped id cannot own one), nothing else is gained
        write("/proc/self/setgroups", "deny")
        write("/proc/self/uid_map", f"{me} {me} 1")
        write("/proc/self/gid_map", f"{group} {group} 1")
        die_with(parent, signal.SIGTERM)


def quiet() -> None:
    """Let go of the program's pipes: agentroll reads them to their end, which comes once the program's side
    has closed them all."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def program(config: dict[str, object], parent: int) -> None:
    """B: the limits, then the interpreter on the program (never returns)."""
    try:
        die_with(parent, signal.SIGKILL)
        limits = config["limits"]
        assert isinstance(limits, dict)
        cpu = int(limits["cpu_s"])
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        for name, key in (("RLIMIT_AS", "as_bytes"), ("RLIMIT_FSIZE", "fsize_bytes"), ("RLIMIT_NPROC", "nproc")):
            if limits.get(key) is not None and hasattr(resource, name):
                resource.setrlimit(getattr(resource, name), (int(limits[key]), int(limits[key])))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.set_inheritable(STATUS_FD, False)  # the exec closes it; until then a failure is reported there
        os.chdir(str(config["workdir"]))
        argv, env = config["argv"], config["env"]
        assert isinstance(argv, list) and isinstance(env, dict)
        os.execve(argv[0], argv, env)
    except BaseException as exc:  # whatever it is, the program cannot start
        report({"setup": f"the program could not start: {exc}"})
        os._exit(SETUP_FAILED)


def outcome_of(status: int) -> dict[str, object]:
    if os.WIFSIGNALED(status):
        return {"signal": os.WTERMSIG(status)}
    return {"exit": os.WEXITSTATUS(status)}


def reaper(config: dict[str, object]) -> None:
    """A, pid 1 of the new pid namespace: starts B, reaps whatever ends, reports B's outcome (never returns)."""
    die_with(None, signal.SIGKILL)
    me = os.getpid()
    child = os.fork()
    if child == 0:
        program(config, me)
    quiet()
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(0)
        if pid == child:
            report(outcome_of(status))
            os._exit(0)  # the kernel kills what is left in the namespace


def main() -> None:
    global STATUS_FD
    config = json.loads(sys.argv[1])
    STATUS_FD = int(config.get("status_fd", STATUS_FD))
    parent = int(config["parent"])
    workdir = str(config["workdir"])
    child = 0

    def parent_gone(*_: object) -> None:
        if child:
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)
        os.killpg(0, signal.SIGKILL)  # what is left of the group, this launcher included

    signal.signal(signal.SIGTERM, parent_gone)
    die_with(parent, signal.SIGTERM)
    try:
        setup(config, parent)
    except OSError as exc:
        report({"setup": str(exc)})
        os._exit(SETUP_FAILED)
    pid_namespace = config["namespaces"] != "none"
    me = os.getpid()
    child = os.fork()
    if child == 0:
        if pid_namespace:
            reaper(config)
        program(config, me)
    quiet()
    if pid_namespace:
        os.close(STATUS_FD)  # A reports B's outcome
    _, status = os.waitpid(child, 0)
    shutil.rmtree(workdir, ignore_errors=True)  # here, not only by agentroll: it may be killed before it does
    if not pid_namespace:
        report(outcome_of(status))
    os._exit(0)


if __name__ == "__main__":
    main()
