"""The local sandbox: programs per second, agentroll's memory with many programs in flight, and what a program
can see and do (the isolation table of docs/tool-use.md), measured.

    python bench/sandbox.py rate --against /tmp/agentroll-main --pairs 5     # this checkout and another, alternating
    python bench/sandbox.py memory --against /tmp/agentroll-main
    python bench/sandbox.py isolation                                        # as root, and as an ordinary user
    python bench/sandbox.py limits                                           # the same
    python bench/sandbox.py cpu --pairs 3

`rate`: programs per second through `LocalSandbox` (`--sandbox-concurrency` = the cores), for a trivial program
(`print(1)`, `--programs` of them) and for `--reward code` scoring answers of 3 stdin tests each (3 programs an
answer), each in a fresh process importing that checkout's package; it also prints the CPU seconds the process
and its children used per program. Runs of the two checkouts alternate, `--pairs` times; the medians and their
ratio are printed. A checkout of main for `--against`: `git archive main | tar -x -C /tmp/agentroll-main`.

`memory`: peak RSS of a process with 64 programs in flight at once, each printing 4 MB (the output cap).

`isolation`: one probe program run as root and (through setpriv, as uid 4242) as an ordinary user; prints what it
found, one row per property.

`limits`: the hostile programs of the limits table (memory, files, forks, threads) as root and as a user.

`cpu`: CPU seconds that 3 busy children get in 3 s of wall time: outside any sandbox, in the sandbox as root
(the run's cgroup gets one core) and as an ordinary user (no cgroup), alternating `--pairs` times. On a machine
others load, the cap shows only where the children outside get more than one core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RATE = """import asyncio, json, os, sys, time
from agentroll.sandbox import SandboxSettings
from agentroll.sandbox.local import LocalSandbox
from agentroll.rewards import RewardRequest, RewardSet, RewardSettings
kind, count = sys.argv[1], int(sys.argv[2])
cores = os.cpu_count() or 1
def used():
    # CPU seconds of this process and everything under it, reaped or not (its own cpuacct group), or None
    where = os.environ.get("BENCH_CPUACCT")
    return int(open(where).read()) / 1e9 if where else None
async def main():
    if kind == "trivial":
        sandbox = LocalSandbox(SandboxSettings(concurrency=cores))
        await sandbox.run("pass", None, 30)  # set up (probed) before the clock starts
        cpu, start = used(), time.monotonic()
        results = await asyncio.gather(*(sandbox.run("print(1)", None, 30) for _ in range(count)))
        assert all(r.stdout == "1\\n" for r in results), results[0]
        programs = count
    else:
        rewards = RewardSet(RewardSettings("code", sandbox=SandboxSettings(concurrency=cores)))
        label = {"inputs": ["1 2\\n", "3 4\\n", "5 6\\n"], "outputs": ["3\\n", "7\\n", "11\\n"]}
        answer = "```python\\na, b = map(int, input().split())\\nprint(a + b)\\n```"
        requests = [RewardRequest(answer, label, "p", "solver") for _ in range(count // 3)]
        await rewards.get("code").score(requests[:1])
        cpu, start = used(), time.monotonic()
        results = await rewards.get("code").score(requests)
        assert all(r.value == 1.0 for r in results), results[0]
        programs = 3 * len(requests)
    wall, after = time.monotonic() - start, used()
    cpu_ms = None if cpu is None else 1000 * (after - cpu) / programs
    print(json.dumps({"per_s": programs / wall, "cpu_ms": cpu_ms}))
asyncio.run(main())
"""

MEMORY = """import asyncio, json, resource
from agentroll.sandbox import SandboxSettings
from agentroll.sandbox.local import LocalSandbox
async def main():
    sandbox = LocalSandbox(SandboxSettings(concurrency=64))
    await sandbox.run("pass", None, 60)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = "import sys\\nsys.stdout.write('x' * ((4 << 20) - 1))\\n"
    results = await asyncio.gather(*(sandbox.run(code, None, 120) for _ in range(64)))
    assert all(len(r.stdout) == (4 << 20) - 1 for r in results), {r.status for r in results}
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"before_mb": before / 1024, "peak_mb": peak / 1024}))
asyncio.run(main())
"""


CPUACCT = Path("/sys/fs/cgroup/cpuacct")  # cgroup v1: CPU time of a group, its processes reaped or not


def measure(source: Path, script: str, *args: str) -> dict:
    """One fresh process importing `source`'s package, its JSON line. Where a cpuacct group can be made (root,
    cgroup v1), the process runs in one of its own, so that the CPU time of sandboxed processes nobody reaps
    (killed with their sandbox) is counted too."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    group = CPUACCT / f"agentroll-bench-{os.getpid()}"
    try:
        group.mkdir(exist_ok=True)
        env["BENCH_CPUACCT"] = str(group / "cpuacct.usage")
    except OSError:
        group = None
    argv = [sys.executable, "-c", script, *args]
    if group is not None:  # the shell joins the group, then becomes the benchmark: all of it is counted
        argv = ["/bin/sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "sh", *argv]
    done = subprocess.run(argv, cwd=source, env=env, capture_output=True, text=True)
    if group is not None:
        group.rmdir()
    if done.returncode != 0:
        raise SystemExit(f"{source}: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def rate(other: Path, pairs: int, programs: int) -> None:
    for kind in ("trivial", "code"):
        ours, theirs = [], []
        for i in range(pairs):
            a, b = measure(ROOT, RATE, kind, str(programs)), measure(other, RATE, kind, str(programs))
            ours.append(a)
            theirs.append(b)
            print(f"{kind} pair {i + 1}: this {show(a)}, other {show(b)}", flush=True)
        mine, other_rate = statistics.median(r["per_s"] for r in ours), statistics.median(r["per_s"] for r in theirs)
        cpu = ""
        if ours[0]["cpu_ms"] is not None:
            cpu_mine = statistics.median(r["cpu_ms"] for r in ours)
            cpu_other = statistics.median(r["cpu_ms"] for r in theirs)
            cpu = f"; CPU per program this {cpu_mine:.1f} ms, other {cpu_other:.1f} ms"
        print(f"{kind}: median this {mine:.1f}/s, other {other_rate:.1f}/s, ratio {mine / other_rate:.2f}{cpu}")


def show(found: dict) -> str:
    cpu = "" if found["cpu_ms"] is None else f" ({found['cpu_ms']:.1f} ms CPU)"
    return f"{found['per_s']:.1f}/s{cpu}"


def memory(other: Path | None) -> None:
    for source in (ROOT, other) if other else (ROOT,):
        found = measure(source, MEMORY)
        before, peak = found["before_mb"], found["peak_mb"]
        print(f"{source}: RSS before {before:.0f} MB, peak with 64 x 4 MB in flight {peak:.0f} MB")


PROBE = """import json, os, socket, subprocess
seen = {}
seen["uid inside"] = os.getuid()
seen["root directory"] = " ".join(sorted(os.listdir("/")))
pids = [p for p in os.listdir("/proc") if p.isdigit()]
seen["processes visible"] = len(pids)
def can_read(path):
    try:
        with open(path, "rb") as f:
            f.read(1)
        return "yes"
    except OSError as exc:
        return exc.strerror
for path in ("/etc/passwd", "/etc/shadow", "/root/.bashrc", "/home", "/proc/1/environ"):
    seen["read " + path] = can_read(path)
def can_write(path):
    try:
        with open(path, "w") as f:
            f.write("x")
        os.unlink(path)
        return "yes"
    except OSError as exc:
        return exc.strerror
for path in ("/probe", "/usr/probe", "/dev/probe", "/tmp/probe", "/var/tmp/probe", "/dev/shm/probe", "probe"):
    seen["write " + path] = can_write(path)
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    seen["network (1.1.1.1:53)"] = "yes"
except OSError as exc:
    seen["network (1.1.1.1:53)"] = exc.strerror or type(exc).__name__
seen["unix sockets in /run, /var/run, /tmp"] = sum(
    1 for d in ("/run", "/var/run", "/tmp") if os.path.isdir(d) for n in os.listdir(d) if n.endswith(".sock")
)
try:
    os.setuid(0)
    seen["setuid(0)"] = "yes"
except OSError as exc:
    seen["setuid(0)"] = exc.strerror
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
made = libc.unshare(0x10000000)  # CLONE_NEWUSER: a kernel's attack surface, and a way past the process cap
seen["new user namespace"] = "yes" if made == 0 else os.strerror(ctypes.get_errno())
made = libc.shmget(0, 1 << 20, 0o1000 | 0o600)  # memory the kernel holds outside its address space
seen["System V shared memory"] = "yes" if made >= 0 else os.strerror(ctypes.get_errno())
for name, make in (("memfd", lambda: os.memfd_create("probe")), ("pseudo-terminal", os.openpty),
                   ("vsock socket", lambda: socket.socket(40, socket.SOCK_STREAM)),  # AF_VSOCK: not in the netns
                   ("netlink socket", lambda: socket.socket(16, socket.SOCK_RAW)),
                   ("open /proc/1/mem (the sandbox's init)", lambda: open("/proc/1/mem", "rb"))):
    try:
        make()
        seen[name] = "yes"
    except OSError as exc:
        seen[name] = exc.strerror
machine = os.uname().machine
context = ctypes.c_ulong(0)
before = int(open("/proc/sys/fs/aio-nr").read())
for name, numbers, args in (("io_setup(65536)", (206, 0), (65536, ctypes.byref(context))),
                            ("pidfd_open(1)", (434, 434), (1, 0)),
                            ("mq_open", (240, 180), (b"/probe", 0o100, 0o600, 0)),
                            ("fanotify_init", (300, 262), (0, 0)), ("inotify_init1", (294, 26), (0,)),
                            ("kcmp", (312, 272), (1, 2, 0, 0, 0)),
                            ("process_vm_readv", (310, 270), (1, 0, 0, 0, 0, 0))):
    made = libc.syscall(numbers[0 if machine == "x86_64" else 1], *args)
    seen[name] = "yes" if made >= 0 else os.strerror(ctypes.get_errno())
seen["fs.aio-nr moved by"] = int(open("/proc/sys/fs/aio-nr").read()) - before
print(json.dumps(seen))
"""


def isolation() -> None:
    sys.path.insert(0, str(ROOT))
    import asyncio

    from agentroll.sandbox import SandboxSettings
    from agentroll.sandbox.local import LocalSandbox

    rows: dict[str, dict[str, object]] = {}

    async def as_root() -> dict:
        sandbox = LocalSandbox(SandboxSettings())
        try:
            result = await sandbox.run(PROBE, None, 30)
            print("root:", await sandbox.describe())
            return json.loads(result.stdout)
        finally:
            await sandbox.aclose()

    rows["root"] = asyncio.run(as_root())
    if os.geteuid() == 0:
        sys.path.insert(0, str(ROOT / "tests"))
        import unprivileged

        home = unprivileged.home()
        found = unprivileged.sandbox_run(home, PROBE, None, 30, {})
        print("user:", found.get("described"))
        rows["user"] = json.loads(found["stdout"])
    for key in rows["root"]:
        print(f"| {key} | " + " | ".join(str(rows[who].get(key)) for who in rows) + " |")


FORKS = """import os, time
made = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(20)
        os._exit(0)
    made += 1
print(made)
"""

THREADS = """import threading, time
made, stop = 0, threading.Event()
for _ in range(500):
    try:
        threading.Thread(target=stop.wait, daemon=True).start()
    except RuntimeError:
        break
    made += 1
print(made)
stop.set()
"""


def limits() -> None:
    """The limits table of docs/tool-use.md: each hostile program as root and, through setpriv, as a user."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    import asyncio

    import hostile
    import unprivileged

    from agentroll.sandbox import SandboxSettings
    from agentroll.sandbox.local import LocalSandbox

    programs = {
        "3 children after 600 MB each, 1024 MB budget (MB held at once)": hostile.hoard(600),
        "4 MB files everywhere, 500 MB wanted (MB written)": hostile.fill(500),
        "forks until refused (children)": FORKS,
        "threads until refused": THREADS,
    }

    async def as_root(code: str) -> str:
        sandbox = LocalSandbox(SandboxSettings())
        try:
            result = await sandbox.run(code, None, 60)
            return f"{result.status}: {result.stdout.strip()}"
        finally:
            await sandbox.aclose()

    home = unprivileged.home() if os.geteuid() == 0 else None
    for name, code in programs.items():
        root = asyncio.run(as_root(code))
        user = "-"
        if home is not None:
            found = unprivileged.sandbox_run(home, code, None, 60, {})
            user = f"{found['status']}: {found['stdout'].strip()}"
        print(f"| {name} | {root} | {user} |", flush=True)


BUSY = """import os, resource, time
children = []
for _ in range(3):
    pid = os.fork()
    if pid == 0:
        end = time.time() + 3
        while time.time() < end:
            pass
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
used = resource.getrusage(resource.RUSAGE_CHILDREN)
print(round(used.ru_utime + used.ru_stime, 2))
"""


def cpu(pairs: int) -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "tests"))
    import asyncio

    import unprivileged

    from agentroll.sandbox import SandboxSettings
    from agentroll.sandbox.local import LocalSandbox

    async def as_root() -> str:
        sandbox = LocalSandbox(SandboxSettings())
        try:
            return (await sandbox.run(BUSY, None, 30)).stdout.strip()
        finally:
            await sandbox.aclose()

    home = unprivileged.home()
    for i in range(pairs):
        outside = subprocess.run([sys.executable, "-c", BUSY], capture_output=True, text=True).stdout.strip()
        root = asyncio.run(as_root())
        user = unprivileged.sandbox_run(home, BUSY, None, 30, {})["stdout"].strip() if os.geteuid() == 0 else "-"
        load = os.getloadavg()[0]
        print(f"pair {i + 1}: CPU s outside {outside}, sandbox as root {root}, as a user {user} (load {load:.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["rate", "memory", "isolation", "limits", "cpu"])
    parser.add_argument("--against", type=Path, help="another checkout (rate: required)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--programs", type=int, default=60)
    args = parser.parse_args()
    if args.what == "rate":
        if args.against is None:
            parser.error("rate needs --against DIR")
        rate(args.against.resolve(), args.pairs, args.programs)
    elif args.what == "memory":
        memory(args.against.resolve() if args.against else None)
    elif args.what == "cpu":
        cpu(args.pairs)
    elif args.what == "limits":
        limits()
    else:
        isolation()


if __name__ == "__main__":
    tempfile.tempdir = None
    main()
