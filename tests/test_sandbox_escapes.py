"""The local sandbox against programs that try to get out (issue 31), through `agentroll.sandbox` itself: as root
(agentroll in a container often is) and as an ordinary user (`tests/unprivileged.py`). A run's limits hold for
the run (all its processes), nothing of it outlives it, it sees nothing of the host but what it needs to run, and
nothing it prints decides anything but its own outcome."""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from agentroll.sandbox import RunResult, SandboxSettings
from agentroll.sandbox.local import LocalSandbox

from . import hostile, unprivileged

pytestmark = pytest.mark.bwrap  # model code in the local sandbox (conftest: skipped without bwrap)

Run = Callable[..., dict]


def as_dict(result: RunResult, described: str) -> dict:
    return {
        "status": result.status,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "exit_code": result.exit_code,
        "described": described,
    }


@pytest.fixture(params=["root", "user"])
def run(request) -> Run:
    """`run(code, stdin=None, timeout_s=10, **settings)`: one sandbox run made by root, or by an ordinary user."""
    if request.param == "root":
        if not unprivileged.is_root():
            pytest.skip("the root half runs when the tests run as root (CI does)")

        def as_root(code: str, stdin: str | None = None, timeout_s: float = 10.0, **settings) -> dict:
            async def main() -> dict:
                sandbox = LocalSandbox(SandboxSettings(**settings))
                try:
                    return as_dict(await sandbox.run(code, stdin, timeout_s), await sandbox.describe())
                finally:
                    await sandbox.aclose()

            return asyncio.run(main())

        return as_root
    user_home = unprivileged.home()
    unprivileged.interpreter()

    def as_user(code: str, stdin: str | None = None, timeout_s: float = 10.0, **settings) -> dict:
        done = unprivileged.sandbox_run(user_home, code, stdin, timeout_s, settings)
        assert "raised" not in done, done
        return done

    return as_user


def marker() -> str:
    """A unique number of seconds for `sleep`: how a process of a run is found from outside its pid namespace."""
    return f"{300 + uuid.uuid4().int % 1000}.{uuid.uuid4().int % 10**6}"


def sleepers(mark: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        if proc.info["cmdline"] and proc.info["cmdline"][-1] == mark:
            found.append(proc)
    return found


# -- what a program sees and may touch --------------------------------------------------------------------------
def test_a_program_sees_a_filesystem_of_its_own_and_no_host_process(run: Run):
    secret = Path(tempfile.mkdtemp(prefix="agentroll-secret-"))
    secret.chmod(0o755)
    (secret / "x").write_text('{"expected": "42"}\n')
    (secret / "x").chmod(0o644)
    code = f"""import json, os
pids = sorted(p for p in os.listdir("/proc") if p.isdigit())
seen = {{"uid": os.getuid(), "root": sorted(os.listdir("/")), "pids": pids}}
for path in ("/etc/passwd", "/root", "/home", "/work", "/sys", "/run", {str(secret)!r}, {str(secret / "x")!r}):
    seen[path] = os.path.exists(path)
for path in ("/made", "/usr/made", "/dev/made", "/proc/made"):
    try:
        open(path, "w").write("x")
        seen[path] = "written"
    except OSError as exc:
        seen[path] = type(exc).__name__
print(json.dumps(seen))
"""
    done = run(code)
    assert done["status"] == "ok", done["stderr"]
    seen = json.loads(done["stdout"])
    assert seen["uid"] == 65534
    assert not {"root", "home", "work", "etc", "sys", "run", "srv", "opt", "mnt", "media", "boot"} & set(
        seen["root"]
    ), seen["root"]
    assert len(seen["pids"]) <= 3, seen["pids"]  # its own: the sandbox's init, the program (and nothing else)
    assert not any(seen[p] for p in ("/etc/passwd", "/root", "/home", "/work", "/sys", "/run")), seen
    assert not seen[str(secret)] and not seen[str(secret / "x")]
    assert "written" not in {seen[p] for p in ("/made", "/usr/made", "/dev/made", "/proc/made")}


def test_a_program_that_forges_the_launchers_failure_only_fails_itself(run: Run):
    done = run(hostile.FORGE)
    assert (done["status"], done["exit_code"]) == ("error", 125)
    assert "could not start" in done["stderr"]  # its own words, as its own outcome


def test_a_forged_failure_only_fails_itself_with_the_unsafe_local_sandbox_too(run: Run):
    done = run(hostile.FORGE, mode="unsafe-local")
    assert (done["status"], done["exit_code"]) == ("error", 125)


def test_two_runs_at_once_cannot_see_each_other(run: Run):
    """A program looking for another run's directory, processes and program for 3 s, while one runs."""
    mark = marker()
    victim = f"import os\nos.system('sleep {mark}')\nprint(open('main.py').read().count('victim'))"
    spy = hostile.spy([], [], "/nonexistent", f"agentroll-mark-{uuid.uuid4().hex}")

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(run, victim, None, 6.0)
        while not sleepers(mark) and not first.done():  # the victim runs: its sleep shows in the process table
            time.sleep(0.02)
        second = pool.submit(run, spy, None, 20.0)
        spied, victimised = second.result(), first.result()
    for left in sleepers(mark):
        left.kill()
    assert spied["status"] == "ok", spied["stderr"]
    assert json.loads(spied["stdout"]) == []
    assert victimised["status"] == "timeout" and "forged" not in victimised["stdout"]


# -- limits per run ---------------------------------------------------------------------------------------------
def test_memory_is_limited_for_the_whole_run_not_per_process(run: Run):
    """Three children each after 200 MB resident, in a run of 256 MB: together they never hold more."""
    done = run(hostile.hoard(200), timeout_s=60.0, memory_mb=256)
    if done["status"] == "ok":
        assert int(done["stdout"]) <= 256, done
    else:
        assert done["status"] == "memory", done


def test_disk_is_limited_for_the_whole_run(run: Run):
    """Files of 4 MB, each far under any file-size limit, written everywhere it can: 32 MB of disk in all."""
    done = run(hostile.fill(200), timeout_s=60.0, disk_mb=32)
    assert done["status"] == "ok", done["stderr"]
    assert int(done["stdout"]) <= 2 * 32, done  # its directory (/tmp with it) and /dev/shm, each of 32 MB


def test_memory_the_kernel_would_hold_for_a_run_counts_or_is_refused(run: Run):
    """System V shared memory (touched, then detached) and memfds (each under the file-size limit) are in no
    process's address space and in no tmpfs: without a cgroup (an ordinary user) nothing else bounded them, and
    a run of 256 MB held 512 MB of each. Refused now (the seccomp filter); with a cgroup they count anyway."""
    done = run(hostile.stash(512), timeout_s=60.0, memory_mb=256)
    if done["status"] == "memory":
        return
    assert done["status"] == "ok", done
    assert all(mb <= 256 for mb in json.loads(done["stdout"]).values()), done


def test_a_run_opens_no_pseudo_terminal(run: Run):
    """Every pty counts against the host-wide `kernel.pty.max` (4096, shared by every container on the machine):
    a run held 400 at once, 64 processes could have held them all. /dev/ptmx is refused."""
    code = """import os
opened = []
for _ in range(300):
    try:
        opened.append(os.openpty())
    except OSError as exc:
        print(len(opened), type(exc).__name__)
        break
else:
    print(len(opened), "none refused")
"""
    done = run(code)
    assert done["status"] == "ok", done["stderr"]
    assert done["stdout"].split()[0] == "0", done["stdout"]


def test_nothing_of_a_run_outlives_it(run: Run):
    mark, key = f"agentroll-left-{uuid.uuid4().hex}", 0x5A000000 + uuid.uuid4().int % 0xFFFFF
    seconds = marker()
    done = run(hostile.linger(mark, key, seconds), timeout_s=20.0)
    assert done["status"] == "ok", done["stderr"]
    assert "left" in done["stdout"]
    left = [base for base in ("/tmp", "/var/tmp", "/dev/shm") if os.path.exists(os.path.join(base, mark))]
    segments = Path("/proc/sysvipc/shm").read_text().split("\n")[1:]
    keys = {int(line.split()[0]) for line in segments if line.strip()}
    stragglers = sleepers(seconds)
    for proc in stragglers:
        proc.kill()
    for base in left:
        os.unlink(os.path.join(base, mark))
    assert left == [] and key not in keys and stragglers == []


def test_the_calls_the_filter_does_not_allow_are_refused_and_ordinary_programs_still_run(run: Run):
    """The seccomp filter is an allow-list: what the reviews found open (the old AIO, pidfd_open and pidfd_getfd,
    process_vm_*, mq_open, fanotify_init, kcmp, inotify) and the riskiest calls (io_uring, the keyring, ptrace,
    bpf, userfaultfd, namespaces) fail with EPERM, a number beyond the kernel's table and clone3 (glibc falls
    back to clone) with ENOSYS, another ABI with ENOSYS; a thread, a multiprocessing lock (a semaphore in
    /dev/shm) and a subprocess work as ever, within the fallback's 4 processes and threads as an ordinary user
    (test_seccomp_filter.py runs more under the filter alone)."""
    import platform

    from agentroll.sandbox._seccomp import ARCHES, KNOWN_UP_TO, REFUSED

    if platform.machine() not in ARCHES:
        pytest.skip(f"no seccomp filter is written for {platform.machine()}")
    column = ARCHES[platform.machine()][0]
    calls = {name: numbers[column] for name, numbers in REFUSED.items() if numbers[column] is not None}
    enosys = {"clone3": 435, "beyond the table": KNOWN_UP_TO + 20}
    code = f"""import ctypes, errno, json, multiprocessing, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
seen = {{}}
for name, number in { ({**calls, **enosys})!r}.items():
    seen[name] = "allowed" if libc.syscall(number, 0, 0, 0, 0, 0) >= 0 else errno.errorcode[ctypes.get_errno()]
if {column} == 0:  # x86_64's x32 ABI: getpid's number with the x32 bit
    seen["x32"] = "allowed" if libc.syscall(39 | 0x40000000) >= 0 else errno.errorcode[ctypes.get_errno()]
done = []
thread = threading.Thread(target=done.append, args=(1,))
thread.start()
thread.join()
with multiprocessing.Lock():
    echoed = subprocess.run(["echo", "hi"], capture_output=True).stdout.decode()
seen["ordinary"] = [done, echoed]
print(json.dumps(seen))
"""
    done = run(code, timeout_s=30.0)
    assert done["status"] == "ok", done["stderr"]
    seen = json.loads(done["stdout"])
    assert seen.pop("ordinary") == [[1], "hi\n"]
    expected = {name: "EPERM" for name in calls} | {name: "ENOSYS" for name in enosys}
    assert seen == {**expected, **({"x32": "ENOSYS"} if column == 0 else {})}


def test_a_program_cannot_take_the_hosts_aio_contexts(run: Run):
    """`fs.aio-nr` is one counter for the whole machine that no namespace, rlimit or cgroup bounds: a program's
    `io_setup(65536)` took all of `fs.aio-max-nr` (65536 here) until it ended, and every process on the host got
    EAGAIN from io_setup. Refused now: the program, which answers only if it got them, scores nothing, and the
    host's count does not move while it runs."""
    mark = marker()
    code = f"""import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
context = ctypes.c_ulong(0)
got = libc.syscall({206 if os.uname().machine == "x86_64" else 0}, 65536, ctypes.byref(context))
print("taken" if got == 0 else errno.errorcode[ctypes.get_errno()], flush=True)
os.system("sleep {mark}")
"""
    before = int(Path("/proc/sys/fs/aio-nr").read_text())
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(run, code, None, 30.0)
        while not sleepers(mark) and not running.done():  # the program holds what it got: its sleep shows
            time.sleep(0.02)
        during = int(Path("/proc/sys/fs/aio-nr").read_text())
        for proc in sleepers(mark):
            proc.kill()
        done = running.result()
    assert done["stdout"] == "EPERM\n", done
    assert during - before < 65536, (before, during)


def test_a_program_can_neither_read_nor_write_the_sandboxs_init_nor_forge_its_exit(run: Run):
    """bwrap's init in the sandbox (pid 1) is the program's own uid: through its /proc/1/mem a program read and
    wrote its memory, and through pidfd_getfd it took init's eventfd, whose count bwrap reports as the program's
    exit status (a program exiting 3 was reported as exit 0). /proc/1 is covered and pidfd_* refused: the
    program's exit status is its own."""
    code = """import ctypes, errno, json, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
seen = {}
for path in ("/proc/1/mem", "/proc/1/task/1/mem", "/proc/1/environ", "/proc/1/maps"):
    try:
        with open(path, "rb") as f:
            f.read(1)
        seen[path] = "read"
    except OSError as exc:
        seen[path] = errno.errorcode[exc.errno]
try:
    os.listdir("/proc/1/fd")
    seen["fds"] = "listed"
except OSError as exc:
    seen["fds"] = errno.errorcode[exc.errno]
pidfd = libc.syscall(434, 1, 0)  # the same number on both architectures
seen["pidfd_open"] = "made" if pidfd >= 0 else errno.errorcode[ctypes.get_errno()]
for fd in range(3, 10):  # bwrap's init holds its eventfd on a low descriptor
    taken = libc.syscall(438, pidfd, fd, 0)
    if taken >= 0:
        try:
            os.write(taken, struct.pack("=Q", 1))  # init's count: the exit status bwrap reports, plus one
            seen["forged through"] = fd
        except OSError:
            pass
print(json.dumps(seen), flush=True)
sys.exit(3)
"""
    done = run(code)
    assert (done["status"], done["exit_code"]) == ("error", 3), done
    seen = json.loads(done["stdout"])
    assert "forged through" not in seen and seen["pidfd_open"] == "EPERM", seen
    assert not any(v in ("read", "listed") for v in seen.values()), seen


def test_a_run_opens_no_vsock_nor_netlink_socket(run: Run):
    """AF_VSOCK is not isolated by a network namespace: in a VM the sandbox could reach its hypervisor's services,
    and a port it bound was taken on the whole VM (a listener outside held port P: the sandbox's bind of P said
    EADDRINUSE). AF_NETLINK reaches kernel subsystems (routing, audit, uevents). Both refused; the families a
    program uses (Unix, IPv4, IPv6) work as ever."""
    code = """import errno, json, socket
seen = {}
for name, family, kind in (("vsock", 40, socket.SOCK_STREAM), ("netlink", 16, socket.SOCK_RAW),
                           ("inet", socket.AF_INET, socket.SOCK_STREAM), ("inet6", socket.AF_INET6, socket.SOCK_DGRAM),
                           ("unix", socket.AF_UNIX, socket.SOCK_STREAM)):
    try:
        socket.socket(family, kind).close()
        seen[name] = "made"
    except OSError as exc:
        seen[name] = errno.errorcode[exc.errno]
a, b = socket.socketpair()
a.sendall(b"x")
seen["pair"] = b.recv(1).decode()
print(json.dumps(seen))
"""
    done = run(code)
    assert done["status"] == "ok", done["stderr"]
    made = {"inet": "made", "inet6": "made", "unix": "made", "pair": "x"}
    assert json.loads(done["stdout"]) == {"vsock": "EPERM", "netlink": "EPERM", **made}


def test_as_root_a_run_lives_in_a_cgroup_of_its_own_holding_its_limits():
    """Where a cgroup can be made (root here): the run's processes are in groups of their own holding the memory
    budget, the process cap (the program's and the sandbox's init) and one core's worth of CPU, as the kernel
    shows them; the groups are gone once the run is."""
    from agentroll.sandbox._cgroup import hierarchies

    if not unprivileged.is_root():
        pytest.skip("a cgroup is made as root")
    mark = marker()

    async def main() -> dict[str, str]:
        sandbox = LocalSandbox(SandboxSettings(memory_mb=300, processes=20))
        try:
            task = asyncio.ensure_future(sandbox.run(f"import os\nos.system('sleep {mark}')", None, 60))
            while not sleepers(mark):  # polling the host's process table for the run's sleep
                await asyncio.sleep(0.02)
                assert not task.done(), task.result()
            pid = sleepers(mark)[0].pid
            found = {}
            for h in hierarchies(Path("/proc/self/mountinfo").read_text(), Path(f"/proc/{pid}/cgroup").read_text()):
                for name in ("memory.limit_in_bytes", "memory.max", "pids.max", "cpu.cfs_quota_us", "cpu.max"):
                    if (h.base / name).exists():
                        found[name] = (h.base / name).read_text().strip()
                        found[name + " in"] = str(h.base)
            for proc in sleepers(mark):
                proc.kill()
            await task
            return found
        finally:
            await sandbox.aclose()

    found = asyncio.run(main())
    assert found.get("memory.limit_in_bytes", found.get("memory.max")) == str(300 << 20), found
    assert found["pids.max"] == "21", found
    assert found.get("cpu.cfs_quota_us", found.get("cpu.max", "").split(" ")[0]) == "100000", found
    groups = [v for k, v in found.items() if k.endswith(" in")]
    assert all("/agentroll-" in g and "/run-" in g for g in groups) and not any(Path(g).exists() for g in groups)


def test_as_root_a_run_is_a_user_of_its_own_that_a_hosts_nobody_cannot_reach():
    """As root, the run's processes are a host uid of no account and no other process (not `nobody`, whom a
    host gives to a server's workers or another tool's jobs): such a process, as nobody, could otherwise open
    the run's stdout through the host's /proc and forge its output (it did: the attack review's)."""
    import pwd
    import subprocess

    if not unprivileged.is_root() or unprivileged.SETPRIV is None:
        pytest.skip("agentroll picks the runs' user as root (setpriv plays the host's nobody)")
    mark = marker()

    async def main() -> tuple[RunResult, int, subprocess.CompletedProcess[bytes]]:
        sandbox = LocalSandbox(SandboxSettings())
        try:
            task = asyncio.ensure_future(sandbox.run(f"import os\nos.system('sleep {mark}')\nprint('done')", None, 60))
            while not sleepers(mark):  # polling the host's process table for the run's sleep
                await asyncio.sleep(0.02)
                assert not task.done(), task.result()
            proc = sleepers(mark)[0]
            nobody = [unprivileged.SETPRIV, "--reuid=65534", "--regid=65534", "--clear-groups"]
            forge = ["/bin/sh", "-c", f"echo FORGED > /proc/{proc.pid}/fd/1"]
            forged = await asyncio.to_thread(subprocess.run, [*nobody, *forge], capture_output=True)
            uid = proc.uids().real
            proc.kill()
            return await task, uid, forged
        finally:
            await sandbox.aclose()

    result, uid, forged = asyncio.run(main())
    assert uid not in (0, 65534), uid
    with pytest.raises(KeyError):
        pwd.getpwuid(uid)
    assert forged.returncode != 0 and b"Permission denied" in forged.stderr, forged
    assert result.stdout == "done\n", result


HOLDER = """import asyncio, sys
from agentroll.sandbox import SandboxSettings
from agentroll.sandbox.local import LocalSandbox
async def main():
    sandbox = LocalSandbox(SandboxSettings())
    await sandbox.describe()  # set up: its uid chosen, no program running
    print(sandbox.plan.uid, flush=True)
    await asyncio.to_thread(sys.stdin.readline)  # a live run, between programs, until told to end
    await sandbox.aclose()
asyncio.run(main())
"""


def test_as_root_two_live_runs_never_share_a_uid_and_a_killed_ones_is_free_again():
    """Each agentroll run leases its uid on the host (a flock, held while it lives): a second agentroll started
    while the first had no program running picked the same uid (the kernel's per-user counters, pipe pages and
    inotify, then coupled them). Two processes at once get two uids; a third, after the first is killed -9, may
    have the first's, never the second's."""
    import subprocess
    import sys

    if not unprivileged.is_root():
        pytest.skip("agentroll picks the runs' user as root")
    env = {**os.environ, "PYTHONPATH": str(unprivileged.ROOT)}

    def start() -> tuple[subprocess.Popen[str], int]:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        assert proc.stdout is not None
        return proc, int(proc.stdout.readline())

    first, second, third = None, None, None
    try:
        first, uid1 = start()
        second, uid2 = start()
        first.kill()  # kill -9: its lease goes with it
        first.communicate()
        third, uid3 = start()
    finally:
        for proc in (first, second, third):
            if proc is not None:
                proc.kill()
                proc.communicate()  # its pipes closed
    assert uid1 != uid2 and uid3 != uid2, (uid1, uid2, uid3)
    assert 65534 not in (uid1, uid2, uid3)
