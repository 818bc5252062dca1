"""The seccomp filter alone (`agentroll.sandbox._seccomp`), installed on an interpreter outside any sandbox: the
programs model code is, the interpreter's start-up, subprocess, threads, multiprocessing (fork and spawn), a shell
pipeline, asyncio's subprocesses, sockets on the loopback, files, numpy where installed, all run under it as they
do without it; what it refuses, it refuses with the errno a program can handle. Here rather than in a sandbox:
the sandbox's process cap as an ordinary user (4) is too small for pools, and its interpreter may lack numpy."""

from __future__ import annotations

import ctypes
import errno
import platform
import subprocess
import sys

import pytest

from agentroll.sandbox import _seccomp

pytestmark = pytest.mark.skipif(platform.machine() not in _seccomp.ARCHES, reason="no filter for this machine")

# installs the filter (no_new_privs first: an unprivileged process may then), then becomes the program
UNDER = """import ctypes, os, sys
code = bytes.fromhex(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]
program = Program(len(code) // 8, code)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
assert libc.prctl(22, 2, ctypes.byref(program), 0, 0) == 0, os.strerror(ctypes.get_errno())  # PR_SET_SECCOMP
os.execv(sys.argv[2], sys.argv[2:])
"""

EVERYDAY = """import asyncio, concurrent.futures, json, multiprocessing, os, shutil, socket, sqlite3, subprocess, sys
import tempfile, threading
def square(x):
    return x * x
if __name__ == "__main__":
    seen = {}
    done = []
    thread = threading.Thread(target=done.append, args=(1,))
    thread.start()
    thread.join()
    seen["thread"] = done
    with multiprocessing.Lock():
        seen["subprocess"] = subprocess.run(["echo", "hi"], capture_output=True, text=True).stdout
    with multiprocessing.get_context("fork").Pool(2) as pool:
        seen["fork pool"] = pool.map(square, range(4))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        seen["spawn pool"] = pool.map(square, range(2))
    with concurrent.futures.ProcessPoolExecutor(2) as executor:
        seen["executor"] = list(executor.map(square, range(3)))
    seen["shell"] = subprocess.run("echo $((1 + 2)) | wc -c; ls / > /dev/null", shell=True, capture_output=True,
                                   text=True).stdout
    async def child():
        proc = await asyncio.create_subprocess_exec("true")
        return await proc.wait()
    seen["asyncio"] = asyncio.run(child())
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    client = socket.create_connection(server.getsockname())
    peer, _ = server.accept()
    client.sendall(b"x")
    seen["loopback"] = peer.recv(1).decode()
    where = tempfile.mkdtemp()
    with open(os.path.join(where, "f"), "w") as f:
        f.write("x")
    shutil.copy2(os.path.join(where, "f"), os.path.join(where, "g"))
    shutil.copytree(where, where + "-copy")
    shutil.rmtree(where)
    shutil.rmtree(where + "-copy")
    seen["sqlite"] = sqlite3.connect(":memory:").execute("select 1").fetchall()
    seen["cpus"] = os.cpu_count() > 0 and len(os.sched_getaffinity(0)) > 0
    try:
        import numpy
        seen["numpy"] = float(numpy.linalg.inv(numpy.eye(3) * 2).sum())
    except ImportError:
        seen["numpy"] = 1.5
    print(json.dumps(seen))
"""


def under_filter(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    code = _seccomp.program()
    assert code is not None
    argv = (sys.executable, "-c", UNDER, code.hex(), *argv)
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def test_everyday_programs_run_under_the_filter_as_without_it(tmp_path):
    import json

    (tmp_path / "main.py").write_text(EVERYDAY)  # a file, as in the sandbox: spawned workers import it
    done = under_filter(sys.executable, str(tmp_path / "main.py"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {
        "thread": [1],
        "subprocess": "hi\n",
        "fork pool": [0, 1, 4, 9],
        "spawn pool": [0, 1],
        "executor": [0, 1, 4],
        "shell": "2\n",
        "asyncio": 0,
        "loopback": "x",
        "sqlite": [[1]],
        "cpus": True,
        "numpy": 1.5,
    }


def test_what_it_refuses_comes_back_as_an_errno_a_program_handles():
    """EPERM for a call the table knows and does not allow, ENOSYS beyond it and for clone3 (glibc then uses
    clone), ENOTTY for an ioctl it does not allow (as a file answers a terminal request), EPERM for a netlink
    socket and for clone with a namespace flag."""
    column = _seccomp.ARCHES[platform.machine()][0]
    io_setup = _seccomp.REFUSED["io_setup"][column]
    clone = _seccomp.ALLOWED["clone"][column]
    code = f"""import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(number, *args):
    return "ok" if libc.syscall(number, *args) >= 0 else errno.errorcode[ctypes.get_errno()]
context = ctypes.c_ulong(0)
fd = os.open("/dev/null", os.O_RDONLY)
print(call({io_setup}, 128, ctypes.byref(context)), call(435, 0, 0), call({_seccomp.KNOWN_UP_TO + 1}),
      call({_seccomp.ALLOWED["ioctl"][column]}, fd, 0x5412, 0),  # TIOCSTI: no
      call({_seccomp.ALLOWED["socket"][column]}, 16, 3, 0),  # AF_NETLINK, SOCK_RAW
      call({clone}, 0x10000000 | 17, 0, 0, 0, 0))  # CLONE_NEWUSER | SIGCHLD
"""
    done = under_filter(sys.executable, "-I", "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["EPERM", "ENOSYS", "ENOSYS", "ENOTTY", "EPERM", "EPERM"]
    assert errno.ENOTTY and ctypes  # the names the program prints are errno's own


def test_the_filter_is_the_same_program_for_every_call_and_arch():
    """Written for both architectures; every allowed call has a number on at least one; the program fits the
    kernel's limit (4096 instructions) and every jump lands inside it."""
    import struct

    for machine in _seccomp.ARCHES:
        code = _seccomp.program(machine)
        assert code is not None and len(code) % 8 == 0 and len(code) // 8 < 4096
        insns = [struct.unpack("=HBBI", code[i : i + 8]) for i in range(0, len(code), 8)]
        for at, (op, jt, jf, _) in enumerate(insns):
            if op & 0x07 == 0x05:  # a jump
                assert at + 1 + max(jt, jf) < len(insns)
        assert insns[-1][0] == _seccomp.RET_K
    assert _seccomp.program("riscv64") is None
    assert all(any(n is not None for n in pair) for pair in _seccomp.ALLOWED.values())
    assert not set(_seccomp.ALLOWED) & set(_seccomp.REFUSED)
