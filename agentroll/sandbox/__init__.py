"""A sandbox for untrusted model code: the `python` tool and `--reward code` run programs through it.

`make_sandbox(settings)` gives a `LocalSandbox` (`local.py`: a bubblewrap sandbox per run, with a filesystem,
network, processes and user of its own and limits per run; or, asked for by name, `--sandbox unsafe-local`
without a filesystem sandbox) or, with `--sandbox-url`, a `RemoteSandbox` speaking SandboxFusion's `/run_code`
(`remote.py`). Both run Python source with an optional stdin under a wall-clock timeout, at most `concurrency`
at once, and give a `RunResult`; what a program prints or returns is only ever its own outcome. A sandbox that
cannot run anything (a remote one that stays down, a local set-up that fails) raises `SandboxUnavailable`: that
is an infrastructure failure, never an outcome of the model's code. docs/tool-use.md says what is isolated, as
measured, and what a hostile program can and cannot do.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Literal, Protocol

__all__ = ["FAILED_ON_IT", "RunResult", "Sandbox", "SandboxSettings", "SandboxUnavailable", "make_sandbox"]

FAILED_ON_IT = "the sandbox failed on this program"  # a `sandbox_error`'s stderr starts so
Status = Literal["ok", "error", "timeout", "memory", "output_limit", "sandbox_error"]


class SandboxUnavailable(Exception):
    """The sandbox could not run the code at all (not a failure of the code)."""


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run: `ok` (exit 0), `error` (another exit or a signal), `timeout` (killed at the wall-clock limit),
    `memory` (it ran out of its memory limit), `output_limit` (killed for writing more than the cap),
    `sandbox_error` (a SandboxFusion server failed on this program, and on it alone: `remote.py`)."""

    status: Status
    stdout: str
    stderr: str
    exit_code: int | None  # negative: killed by that signal; None: unknown (a timeout)
    duration_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SandboxSettings:
    """How code runs. `concurrency` 0: one run per core."""

    url: str | None = None  # SandboxFusion; None: local
    mode: str = "bwrap"  # local: "bwrap", or "unsafe-local" (no filesystem sandbox: asked for by name)
    concurrency: int = 0
    memory_mb: int = 1024  # per run, all its processes (local; docs/tool-use.md), memory_limit_MB (SandboxFusion)
    processes: int = 64  # processes and threads per run (local; fewer where no cgroup can be made)
    disk_mb: int = 64  # per run: its working directory and /tmp, and /dev/shm, each (local)
    max_output_bytes: int = 4 << 20  # per stream; more ends the run (`output_limit`), a SandboxFusion reply too
    python: str = field(default_factory=lambda: sys.executable)  # the interpreter the code runs in (local)
    tmp_dir: str | None = None  # where unsafe-local's run directories are made; default: the system's
    max_retries: int = 5  # SandboxFusion: attempts after the first, for transient failures
    connect_timeout_s: float = 10.0
    slack_s: float = 30.0  # SandboxFusion: an HTTP attempt may take the run's timeout plus this

    @property
    def slots(self) -> int:
        return self.concurrency or os.cpu_count() or 1


class Sandbox(Protocol):
    kind: str

    async def run(self, code: str, stdin: str | None = None, timeout_s: float = 10.0) -> RunResult: ...

    async def describe(self) -> str: ...

    async def aclose(self) -> None: ...


def make_sandbox(settings: SandboxSettings) -> Sandbox:
    if settings.url:
        from .remote import RemoteSandbox

        return RemoteSandbox(settings)
    from .local import LocalSandbox

    return LocalSandbox(settings)
