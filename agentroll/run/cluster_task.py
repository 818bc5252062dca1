"""The task side of `agentroll generate --ray` (the driver is `cluster.py`): one partition run as a child
`agentroll ray-partition`, supervised, its counters forwarded to the job's `Board`.

A task that dies with its node leaves a folder the writer recovers; Ray's retry runs the same command again,
which resumes. The child is never left unsupervised: whatever ends the task first stops the child and waits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import orjson

from agentroll.errors import OutputError, UsageError
from agentroll.folder import job as folder_job
from agentroll.folder import lock as folder_lock
from agentroll.folder.layout import Layout
from agentroll.folder.manifest import Manifest
from agentroll.process.children import stop_group

log = logging.getLogger("agentroll")

POLL_S = 0.5  # how often the driver looks at its tasks, and a task at its child
GRACE_S = 60.0  # after a stop: how long a partition has to close its folder before it is killed
LOCK_WAIT_S = 300.0  # how long a retry waits for a lost attempt's process to let go of its folder


class PartitionLost(Exception):
    """A partition's process died by a signal that no stop of the job sent (OOM killer, node shutdown): Ray
    retries the task (`retry_exceptions`), and the rerun resumes."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise UsageError("--ray needs Ray on this machine and on every node: pip install 'agentroll[ray]'") from exc
    return ray


class Board:
    """A Ray actor: each partition's latest counters, from its latest attempt."""

    def __init__(self) -> None:
        self.parts: dict[int, tuple[int, dict[str, Any]]] = {}

    def report(self, index: int, attempt: int, figures: dict[str, Any]) -> None:
        if attempt >= self.parts.get(index, (0, {}))[0]:
            self.parts[index] = (attempt, figures)

    def read(self) -> dict[int, tuple[int, dict[str, Any]]]:
        return self.parts


def run_partition(spec: dict[str, Any], board: Any) -> dict[str, Any]:
    """A Ray task: partition `spec["index"]` as a child `agentroll ray-partition`, waited for; returns how it
    ended. Raises `PartitionLost` (Ray retries it) when the child was killed by something other than a stop. An
    OS error of the task itself (its log or attempts file on a full disk, a lost mount) ends the partition with
    exit 6, as it would end a run."""
    import ray

    index = spec["index"]
    node = ray.util.get_node_ip_address()
    files = folder_job.PartitionState(Path(spec["state"]), index)
    attempt = 1 + files.attempts_of(spec["job"])
    outcome: dict[str, Any] = {
        "index": index,
        "attempt": attempt,
        "code": None,
        "cancelled": False,
        "node": node,
        "stats": None,
        "requests": None,
        "tail": "",
    }
    try:
        _attempt(spec, board, outcome, files)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        outcome.update(code=OutputError.exit_code, tail=f"the task on {node}: {exc.strerror or exc}{where}")
    code = outcome["code"]
    if not outcome["cancelled"] and code is not None and (code < 0 or code in (130, 143)):
        raise PartitionLost(
            f"part-{index}: its process on {node} was stopped by signal "
            f"{-code if code < 0 else code - 128} (attempt {attempt}); Ray runs it again"
        )
    return outcome


def _attempt(spec: dict[str, Any], board: Any, outcome: dict[str, Any], files: folder_job.PartitionState) -> None:
    """Run the child and fill in `outcome`. From the moment the child exists, whatever ends this function (a
    cancel's KeyboardInterrupt, an OS error) first stops the child and waits for it: none runs unsupervised."""
    import ray

    index, attempt, node = outcome["index"], outcome["attempt"], outcome["node"]
    part = Path(spec["run"]["output"])
    _wait_for_writer(part, files, f"part-{index}, attempt {attempt}")
    with files.open_log() as log_file:
        log_file.write(
            f"--- part-{index}, attempt {attempt} of job {spec['job']} on {node}, "
            f"{time.strftime('%Y-%m-%d %H:%M:%S')} ---\n".encode()
        )
        log_file.flush()
        offset = log_file.tell()
        child = subprocess.Popen(
            [sys.executable, "-m", "agentroll", "ray-partition"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
            start_new_session=True,
            cwd=spec["cwd"] if os.path.isdir(spec["cwd"]) else None,
        )
    last: list[dict[str, Any]] = []
    relay: threading.Thread | None = None
    try:
        assert child.stdin is not None and child.stdout is not None
        files.add_attempt(
            {
                "job": spec["job"],
                "attempt": attempt,
                "node": node,
                "pid": os.getpid(),
                "child": child.pid,
                "time": time.time(),
            }
        )
        with contextlib.suppress(BrokenPipeError):  # a child that could not start: its exit code and log say why
            child.stdin.write(orjson.dumps({**spec, "parent": os.getpid()}))
            child.stdin.close()
        relay = threading.Thread(target=_relay, args=(child.stdout, board, index, attempt, last), daemon=True)
        relay.start()
        asked = getattr(ray.get_runtime_context(), "is_canceled", lambda: False)  # newer Rays also set a flag
        while child.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=POLL_S)
            if child.returncode is None and asked():
                outcome["cancelled"] = True
                stop_group(child, GRACE_S)
    except KeyboardInterrupt:  # ray.cancel: the job is being stopped
        outcome["cancelled"] = True
    finally:
        stop_group(child, GRACE_S)  # SIGTERM first: the run closes its folder
        if relay is not None:
            relay.join(timeout=10)
        for stream in (child.stdin, child.stdout):
            with contextlib.suppress(OSError, ValueError):
                if stream is not None:
                    stream.close()
    code = child.returncode
    figures = _last_run(part) if code in (0, 7, 8) else (last[-1] if last else {})
    outcome.update(
        code=code, stats=figures.get("stats"), requests=figures.get("requests"), tail=files.tail(offset) if code else ""
    )


def _relay(stream: IO[bytes], board: Any, index: int, attempt: int, last: list[dict[str, Any]]) -> None:
    """Forward the child's counters to the board. The pipe is drained to its end whatever the board does: a
    child whose pipe fills up would stop working."""
    with contextlib.suppress(OSError, ValueError):  # the pipe closed under us: the child is being stopped
        for line in stream:
            try:
                figures = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            last[:] = [figures]
            try:
                board.report.remote(index, attempt, figures)
            except Exception as exc:  # the board's node is gone, Ray is shutting down: the bar waits, not the run
                log.debug("part-%d: counters not forwarded: %s", index, exc)


def _wait_for_writer(part: Path, files: folder_job.PartitionState, who: str) -> None:
    """A lost attempt's process may still hold its folder for a while (closing it, stopped, or an NFS lock not
    yet expired): wait for the writer's lock, so the rerun resumes instead of failing, and say so in the
    partition's log. Past `LOCK_WAIT_S` the run itself says the folder is busy."""

    def note() -> None:
        files.note(
            f"--- {who}: waiting up to {LOCK_WAIT_S:.0f} s for {part} to be let go by the process of a "
            f"lost attempt ({time.strftime('%H:%M:%S')}) ---"
        )

    folder_lock.wait_until_free(Layout(part).lock, LOCK_WAIT_S, note)


def _last_run(part: Path) -> dict[str, Any]:
    try:
        return dict(Manifest.load(part).last_run)
    except OutputError:
        return {}
