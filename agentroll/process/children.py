"""Child processes that cannot outlive their parent: the simulator or vLLM under a benchmark or a test tier.

A child is started in a session of its own, so it is stopped with its whole process group, and on Linux the
kernel kills it when its parent dies, however that dies (`PR_SET_PDEATHSIG`). agentroll's own reward workers do
the same from inside (`rewards/_worker.py`), since they must not import the package.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from typing import Any

PR_SET_PDEATHSIG = 1


def die_with(parent: int, sig: int = signal.SIGKILL) -> None:
    """In the child, between fork and exec: `sig` when `parent` dies; exit at once if it already has."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the prctl took effect: no signal will come
        os._exit(1)


def spawn(args: list[str], sig: int = signal.SIGKILL, **kwargs: Any) -> subprocess.Popen[Any]:
    """`Popen` in a new session, dying with this process."""
    parent = os.getpid()
    return subprocess.Popen(args, start_new_session=True, preexec_fn=lambda: die_with(parent, sig), **kwargs)


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    """SIGTERM to the child's process group, SIGKILL past `grace_s`, then whatever of the group is left."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def alive(pid: int) -> bool:
    """Whether a process `pid` exists (one of another user counts): what is named after an agentroll that is
    gone may be swept."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
