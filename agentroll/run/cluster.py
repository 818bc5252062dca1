"""`agentroll generate --ray`: one job over a Ray cluster, built on `--partition I/P` and `agentroll merge`.

The driver (`RayJob`) splits the input into P partitions (`partitions`), runs each as a Ray task, and merges
`OUT/part-*` into `OUT` at the end. A task (`run_partition`) starts `agentroll ray-partition` as a child process:
an ordinary `generate --partition I/P -o OUT/part-I` (`partitions.partition_spec`), so a task that dies with its
node leaves a folder the writer recovers, and Ray's retry (`max_retries`, `--ray-retries`) runs the same command
again, which resumes: each problem once. The child streams its counters (`partitions.JsonProgress`) to its task,
which forwards them to a small actor (`Board`); the driver reads the board for the one progress bar and adds
every partition's stats for the summary.

Stopping: `stop()` cancels every task (`ray.cancel`); a running task sends its child SIGTERM, which finishes its
shard and manifest as a normal run does, and the driver waits for them. `kill()` kills the tasks' workers; a
child whose worker dies gets SIGTERM from the kernel (`PR_SET_PDEATHSIG`) and closes its folder, or is killed
with its node, leaving what a `kill -9` leaves, which the next run repairs. A retry waits for the writer's lock
of an earlier attempt's process that still lives, and the driver holds `OUT/.agentroll/ray/lock`: one writer per
folder, one driver per job. All of it rests on `flock` holding across the nodes' shared storage (docs/ray.md).

Ray is optional (`pip install 'agentroll[ray]'`): it is imported only here, and only when a job runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentroll.client import ClientCounters
from agentroll.engine.options import GenerateOptions
from agentroll.errors import AgentrollError, ClusterError, OutputError
from agentroll.folder import job as folder_job
from agentroll.folder.layout import Layout
from agentroll.folder.manifest import Manifest
from agentroll.folder.merge import merge
from agentroll.inputs import rows_to_read
from agentroll.record.stats import RunStats
from agentroll.run.cluster_task import GRACE_S, POLL_S, Board, PartitionLost, import_ray, run_partition
from agentroll.run.partitions import (
    RAY_RETRIES,
    Outcome,
    add_requests,
    add_stats,
    check_options,
    job_code,
    job_message,
    plan_tasks,
    ray_address,
    tasks_at_once,
    unseen_parts,
)
from agentroll.run.progress import Progress
from agentroll.run.run_options import RunOptions
from agentroll.run.runner import RunResult

log = logging.getLogger("agentroll")

NO_CPU_WAIT_S = 600.0  # how long the job waits for a node that can run a task (an autoscaler adding one)
TASK_CPUS = 1.0


# -- the driver ----------------------------------------------------------------------------------------------------


@dataclass
class JobResult:
    run: RunResult  # the partitions' figures added up, for the usual summary
    outcomes: list[Outcome]
    nodes: int
    at_once: int
    code: int = 0
    message: str = ""  # why the code is not 0
    merged: Manifest | None = None

    def notes(self) -> list[str]:
        """Lines for the summary: the job's shape, retries, failed partitions."""
        out = [f"ray: {len(self.outcomes)} partitions, {self.at_once} at once, on {self.nodes} node(s)"]
        for o in self.outcomes:
            if o.cancelled:
                continue
            if o.attempts > 1:
                out.append(f"part-{o.index}: {o.attempts} attempts (Ray ran it again after a loss; it resumed)")
            if o.code != 0 and (o.code is not None or o.error):
                out.append(
                    f"part-{o.index}: "
                    + (f"exit {o.code}" if o.code is not None else "lost")
                    + (f"\n  {o.error.replace(chr(10), chr(10) + '  ')}" if o.error else "")
                )
        if self.merged is not None:
            out.append(
                f"merged -> {Layout(Path(self.run.output)).manifest}: {self.merged.records} records, "
                f"{self.merged.groups} groups"
            )
        return out


class RayJob:
    """`connect()`, then `run()`; `stop(signum)` from a signal handler asks the job to stop, `kill()` stops it at
    once; `close()` leaves the cluster and lets go of the job's folder."""

    def __init__(
        self, run: dict[str, Any], generate: dict[str, Any], progress: Progress | None = None, debug: bool = False
    ) -> None:
        self.options = RunOptions(**run)
        self.given = generate
        self.generate = GenerateOptions(**generate)
        check_options(self.options, self.generate)
        self.address = ray_address(self.options.ray)
        self.retries = RAY_RETRIES if self.options.ray_retries is None else self.options.ray_retries
        self.out = Path(os.path.abspath(self.options.output))
        self.progress = progress or Progress()
        self.debug = debug
        self.stopped: int | None = None
        self._ray: Any = None
        self._refs: dict[Any, int] = {}
        self._lock: int | None = None

    def connect(self) -> None:
        ray = import_ray()
        address = self.address
        extra = {"include_dashboard": False} if address == "local" else {}
        try:
            _reachable(address)
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING, **extra)
        except Exception as exc:  # ConnectionError, RuntimeError or ValueError, depending on what failed
            raise ClusterError(f"cannot reach the Ray cluster ({address}): {exc}") from exc
        self._ray = ray

    def stop(self, signum: int) -> None:
        if self.stopped is None:
            self.stopped = signum

    def kill(self) -> None:
        for ref in list(self._refs):
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)

    def close(self) -> None:
        if self._ray is not None:
            try:
                self._ray.shutdown()
            except Exception as exc:  # leaving a cluster that is already gone
                log.debug("ray.shutdown: %s", exc)
            self._ray = None
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def run(self) -> JobResult:
        """The job, to its end. Ray failing under it (the GCS lost, a call that raises) is a `ClusterError`: one
        line and exit 9, the folders left resumable."""
        try:
            return self._run()
        except AgentrollError:
            raise
        except Exception as exc:
            if self.debug:
                raise
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            raise ClusterError(
                f"Ray failed during the job ({type(exc).__name__}: {lines[-1] if lines else '-'}); "
                "the partitions' folders stay resumable: run the same command again"
            ) from exc

    def _run(self) -> JobResult:
        ray, opts = self._ray, self.options
        started = time.monotonic()
        folder_job.check_folder(self.out)  # before the lock creates anything in a folder the job must not use
        self._lock = folder_job.lock_job(self.out)
        nodes = self._cpu_nodes()
        partitions = folder_job.prepare_output(self.out, opts.partitions, max(1, nodes), opts.overwrite)
        at_once = tasks_at_once(partitions, ray.cluster_resources().get("CPU", 0.0), TASK_CPUS)
        tasks = plan_tasks(opts, self.given, self.generate, partitions, at_once)
        outcomes = [Outcome(i) for i in range(partitions)]
        if self.stopped is not None:  # a signal while the folder was made ready: no task was started
            for outcome in outcomes:
                outcome.cancelled = True
            return JobResult(
                RunResult(RunStats(), ClientCounters(), time.monotonic() - started, "", str(self.out)),
                outcomes,
                nodes,
                at_once,
                code=128 + self.stopped,
            )
        if opts.endpoints_per_task and partitions * opts.endpoints_per_task < len(self.generate.base_url):
            log.warning(
                "--endpoints-per-task %d over %d partitions leaves some of the %d endpoints unused",
                opts.endpoints_per_task,
                partitions,
                len(self.generate.base_url),
            )
        if not nodes:
            log.warning(
                "no node of the cluster has a CPU for a task yet: the tasks wait for one (an autoscaler "
                "may add it); the job gives up after %.0f s",
                NO_CPU_WAIT_S,
            )
        job = uuid.uuid4().hex[:12]
        board = ray.remote(num_cpus=0)(Board).remote()
        remote = ray.remote(run_partition).options(
            num_cpus=TASK_CPUS, max_retries=self.retries, retry_exceptions=[PartitionLost], scheduling_strategy="SPREAD"
        )
        log.info("ray: %d partitions (%d at once) on %d node(s) -> %s", partitions, at_once, nodes, self.out)
        spec = {"job": job, "cwd": os.getcwd(), "state": str(Layout(self.out).ray), "debug": self.debug}
        self._refs = {
            remote.remote({**spec, "index": t.index, "run": t.run, "generate": t.generate}, board): t.index
            for t in tasks
        }
        self.progress.start(rows_to_read([opts.input]))
        try:
            live = self._wait(board, outcomes, None if nodes else time.monotonic())
        finally:
            self.progress.stop()
        stats, requests = self._figures(outcomes, live)
        result = JobResult(
            RunResult(stats, requests, time.monotonic() - started, "", str(self.out)), outcomes, nodes, at_once
        )
        if self.stopped is not None:
            result.code = 128 + self.stopped  # said when the signal came; the folders stay resumable
            result.run.model = _model(self.out, partitions)
            return result
        result.code = job_code(outcomes)
        result.message = job_message(result.code, outcomes, self.out, self.retries)
        self._merge(result, partitions)
        result.run.complete = result.code == 0
        return result

    def _cpu_nodes(self) -> int:
        """Nodes alive that can run a task: a head started with --num-cpus 0 cannot."""
        return sum(
            1
            for node in self._ray.nodes()
            if node.get("Alive") and (node.get("Resources") or {}).get("CPU", 0) >= TASK_CPUS
        )

    def _wait(self, board: Any, outcomes: list[Outcome], no_cpu_since: float | None) -> dict[int, dict[str, Any]]:
        """Until every task has ended: settle each, feed the bar, and carry out a stop. Returns each
        partition's latest streamed counters. `no_cpu_since`: when the cluster was seen without a node that can
        run a task; past `NO_CPU_WAIT_S` without one, the job ends (exit 9)."""
        ray = self._ray
        pending, deadline, look = list(self._refs), None, 0.0
        live: dict[int, dict[str, Any]] = {}
        while pending:
            if no_cpu_since is not None and time.monotonic() >= look:
                look = time.monotonic() + 5
                if self._cpu_nodes():
                    no_cpu_since = None
                elif time.monotonic() - no_cpu_since >= NO_CPU_WAIT_S:
                    raise ClusterError(
                        f"no node of the Ray cluster had a CPU for a task ({TASK_CPUS:g} CPU each) "
                        f"in {NO_CPU_WAIT_S:.0f} s: add a node with CPUs (a head started with "
                        "--num-cpus 0 runs no task), then run the same command again"
                    )
            if self.stopped is not None and deadline is None:
                for ref in pending:
                    with contextlib.suppress(Exception):
                        ray.cancel(ref)  # queued tasks are dropped; a running one stops its child (SIGTERM)
                deadline = time.monotonic() + GRACE_S + 10
            elif deadline is not None and time.monotonic() > deadline:
                self.kill()
                deadline = float("inf")
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
            for ref in ready:
                self._settle(ref, outcomes[self._refs[ref]])
            live = self._poll(board, live, outcomes)
        return live

    def _settle(self, ref: Any, outcome: Outcome) -> None:
        try:
            got = self._ray.get(ref)
        except self._ray.exceptions.TaskCancelledError:
            outcome.cancelled = True
            return
        except self._ray.exceptions.RayError as exc:  # lost more often than --ray-retries allows, or killed
            lines = [line for line in str(exc).strip().splitlines() if line.strip()]
            outcome.error = lines[-1] if lines else type(exc).__name__
            return
        outcome.cancelled, outcome.code = got["cancelled"], got["code"]
        outcome.attempts = max(outcome.attempts, got["attempt"])
        outcome.stats, outcome.requests, outcome.error = got["stats"], got["requests"], got["tail"]

    def _poll(self, board: Any, live: dict[int, dict[str, Any]], outcomes: list[Outcome]) -> dict[int, Any]:
        try:
            parts = self._ray.get(board.read.remote(), timeout=5)
        except Exception:  # the board's node is gone: the bar waits, the job goes on
            return live
        for index, (attempt, figures) in parts.items():
            outcome = outcomes[index]
            if attempt > max(outcome.attempts, 1):
                log.warning(
                    "part-%d: attempt %d (the last one was lost with its node or process); it resumes "
                    "from what %s holds",
                    index,
                    attempt,
                    folder_job.part_dir(self.out, index),
                )
            outcome.attempts = max(outcome.attempts, attempt)
            live[index] = figures
        stats, requests = self._figures(outcomes, live)
        self.progress.advance(stats, requests)
        return live

    @staticmethod
    def _figures(outcomes: list[Outcome], live: dict[int, dict[str, Any]]) -> tuple[RunStats, ClientCounters]:
        """Every partition's figures added up: its final ones when it has ended, else its latest streamed."""
        parts = [
            (o.stats, o.requests)
            if o.stats is not None
            else (live.get(o.index, {}).get("stats"), live.get(o.index, {}).get("requests"))
            for o in outcomes
        ]
        return (add_stats([s for s, _ in parts if s]), add_requests([r for _, r in parts if r]))

    def _merge(self, result: JobResult, partitions: int) -> None:
        """Join the partitions into OUT when the driver sees each one's manifest as its node wrote it. When every
        partition exited 0, one it does not see so is exit 6 (the folder is not shared alike); otherwise the
        partitions' own code already says why nothing is joined."""
        unseen = unseen_parts(self.out, result.outcomes)
        if unseen:
            if result.code == 0:
                result.code, result.message = OutputError.exit_code, unseen
            return
        folders = [folder_job.part_dir(self.out, i) for i in range(partitions)]
        try:
            result.merged = merge(folders, self.out, allow_incomplete=True)
        except OutputError as exc:
            result.code = result.code or exc.exit_code
            result.message = result.message or f"merge: {exc}"
            return
        result.run.model = _model(self.out, partitions)
        target = self.options.target_groups
        if result.code == 0 and target is not None and result.merged.groups < target:
            note = (  # each partition said so in its own log; the job says it once, for all
                f"--target-groups {target}: the input ran out at {result.merged.groups} of {target} groups "
                f"({result.run.stats.problems} prompts read over {partitions} partitions)"
            )
            log.warning(note)
            result.run.notes.append(note)


def _reachable(address: str) -> None:
    """Ray retries an address that does not answer for minutes: say at once that nothing listens there."""
    if address in ("auto", "local"):
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=10):
        pass


def _model(out: Path, partitions: int) -> str:
    """The served model, as the first partition's folder records it."""
    for index in range(partitions):
        with contextlib.suppress(OutputError):
            return str(folder_job.part_manifest(out, index).settings.get("model") or "")
    return ""
