"""The Ray tier: a one-node Ray cluster on loopback (`ray start --head --node-ip-address 127.0.0.1`), 2 CPUs.

Skipped, with the reason, when ray is not importable (`pip install '.[test]'` installs it, so CI runs the tier).
The cluster runs under a guard process in a session of its own: the teardown kills that process group (the guard,
`ray start --block`, the GCS, the raylet), then every process of the cluster that left the group (Ray's workers,
agentroll's partitions); and when pytest dies, however it dies, the kernel tells the guard to do the same
(`PR_SET_PDEATHSIG`). Only this cluster is stopped: never `ray stop`, which stops every Ray on the machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

import agentroll

GUARD = r"""
import ctypes, os, signal, subprocess, sys
signal.signal(signal.SIGHUP, lambda *_: os.killpg(0, signal.SIGKILL))
ctypes.CDLL(None).prctl(1, signal.SIGHUP, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):  # the test process died before the prctl took effect
    os.killpg(0, signal.SIGKILL)
sys.exit(subprocess.call(sys.argv[2:]))
"""


@dataclass
class Cluster:
    address: str
    env: dict[str, str]  # for the driver: what a process on this cluster's node sees
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def running(pid: int) -> bool:
    """Alive and not a zombie (an orphan waits for init to reap it)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _kill(procs: list[psutil.Process]) -> None:
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    deadline = time.monotonic() + 20
    while any(running(p.pid) for p in procs) and time.monotonic() < deadline:
        time.sleep(0.1)  # SIGKILL sent: waiting for the kernel to carry it out
    alive = [p.pid for p in procs if running(p.pid)]
    assert not alive, f"processes of the test cluster outlived it: {alive}"


def ray_env() -> dict[str, str]:
    """The environment of the tier's Ray processes and drivers."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENTROLL_", "OPENAI_", "RAY_"))}
    env.update(
        {
            # Ray turns 127.0.0.1 into the host's outward address unless told that this is a one-machine cluster:
            # then every Ray server binds to loopback only.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
            # No token auth: a new local cluster would otherwise write ~/.ray/auth_token (recent Rays), and a token
            # found there changes how every later cluster of this user starts. Nothing here leaves loopback.
            "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": os.pathsep.join([str(Path(agentroll.__file__).parents[1]), env.get("PYTHONPATH", "")]),
        }
    )
    return env


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Cluster]:
    pytest.importorskip("ray", reason="the Ray tier needs ray: pip install '.[test]' (or 'agentroll[ray]')")
    temp = Path(tempfile.mkdtemp(prefix="ar-ray-"))  # short: Ray's socket paths must fit in 107 bytes
    port = _free_port()
    env = ray_env()
    log = temp / "ray-start.log"
    cmd = [
        str(Path(sys.executable).parent / "ray"),
        "start",
        "--head",
        "--block",
        "--node-ip-address",
        "127.0.0.1",
        "--port",
        str(port),
        "--num-cpus",
        "2",
        "--include-dashboard=false",
        "--disable-usage-stats",
        "--temp-dir",
        str(temp),
    ]
    with open(log, "wb") as out:
        guard = subprocess.Popen(
            [sys.executable, "-c", GUARD, str(os.getpid()), *cmd],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while b"will now block" not in log.read_bytes():  # ray start says when its cluster is up
            if guard.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start failed: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.2)
        yield Cluster(f"127.0.0.1:{port}", env, log)
    finally:
        members = [p for p in psutil.Process(guard.pid).children(recursive=True)] if guard.poll() is None else []
        with contextlib.suppress(ProcessLookupError):
            os.killpg(guard.pid, signal.SIGKILL)
        guard.wait()
        _kill(members)
        shutil.rmtree(temp, ignore_errors=True)
