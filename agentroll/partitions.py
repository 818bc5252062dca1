"""A `--ray` job's plan, without Ray: how many partitions, what each task runs, and how their figures add up.

A job is `--partition I/P` runs into `OUT/part-I` joined by `agentroll merge` into `OUT`. This module decides P and
each task's options, keeps the folder's plan (`OUT/.agentroll/ray/plan.json`, so a rerun splits the input the same
way even on a cluster of another size), adds the tasks' stats into one summary, and holds what the partition's
own process (`agentroll ray-partition`) needs: its spec, and its counters as JSON lines. `cluster` drives Ray.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import IO, Any

import orjson

from .children import die_with
from .client import ClientCounters
from .errors import InputError, OutputError, UsageError
from .options import GenerateOptions
from .runner import Progress, RunOptions
from .stats import RunStats
from .writer import MANIFEST, _atomic_write

STATE = Path(".agentroll") / "ray"  # under OUT: the plan, each partition's log and attempts
PLAN = "plan.json"
PART = re.compile(r"part-\d+")


def part_dir(out: Path, index: int) -> Path:
    return out / f"part-{index}"


def check_options(run: RunOptions, generate: GenerateOptions) -> None:
    """What a `--ray` job cannot do, said before anything starts."""
    if run.output == "-":
        raise UsageError("--ray writes into a folder (each partition into OUT/part-I), not -o -")
    if run.input == "-":
        raise UsageError("--ray needs an input file that every node reads at the same path, not stdin")
    if not os.path.isfile(run.input):
        raise InputError(run.input, 0, None, "no such file")
    if run.partition is not None:
        raise UsageError("--ray makes its own partitions: use --partitions P, not --partition")
    if run.limit is not None:
        raise UsageError("--limit does not go with --ray (it would apply to each partition)")
    if run.consumer is not None:
        raise UsageError("--consumer does not go with --ray: a consumer follows one folder (follow OUT/part-I, "
                         "or read OUT when the job is done)")
    urls = generate.base_url
    if run.endpoints_per_task is not None and run.endpoints_per_task > len(urls):
        raise UsageError(f"--endpoints-per-task {run.endpoints_per_task} is more than the {len(urls)} --base-url "
                         "endpoints")


def tasks_at_once(partitions: int, cpus: float, task_cpus: float = 1.0) -> int:
    """How many tasks the cluster runs at the same time: one per `task_cpus` CPUs, at least one."""
    return max(1, min(partitions, int(cpus // task_cpus)))


def share(total: int, ways: int) -> int:
    """A task's part of a whole-job figure, at least 1."""
    return max(1, total // ways)


def endpoints(urls: list[str], index: int, per_task: int | None) -> list[str]:
    """Task `index`'s endpoints: all of them, or `per_task` of them, round-robin (task 0 the first E, ...)."""
    if per_task is None:
        return list(urls)
    return [urls[(index * per_task + j) % len(urls)] for j in range(per_task)]


@dataclass(frozen=True)
class Task:
    index: int
    run: dict[str, Any]  # RunOptions of `--partition index/P -o OUT/part-index`
    generate: dict[str, Any]  # the job's generate options with this task's endpoints and concurrency


def plan_tasks(run: RunOptions, given: dict[str, Any], generate: GenerateOptions, partitions: int,
               at_once: int) -> list[Task]:
    """Each partition's options. `--concurrency` (or, under auto, `--max-concurrency` per endpoint) is the
    whole job's: split between the tasks that run at once (or share an endpoint at once)."""
    out = Path(os.path.abspath(run.output))
    urls = generate.base_url
    per_task = run.endpoints_per_task
    sharing = at_once if per_task is None else max(1, math.ceil(at_once * per_task / len(urls)))
    tasks = []
    for index in range(partitions):
        options = replace(run, input=os.path.abspath(run.input), output=str(part_dir(out, index)),
                          partition=f"{index}/{partitions}", overwrite=False, ray=None, partitions=None,
                          endpoints_per_task=None)
        mine = {**given, "base_url": endpoints(urls, index, per_task)}
        if generate.api_key:  # as found on the driver (flag or environment): a node's environment may differ
            mine["api_key"] = generate.api_key
        if generate.concurrency == "auto":
            mine["max_concurrency"] = share(generate.max_concurrency, sharing)
        else:
            mine["concurrency"] = share(int(generate.concurrency), at_once)
        tasks.append(Task(index, asdict(options), mine))
    return tasks


def prepare_output(out: Path, requested: int | None, default: int, overwrite: bool) -> int:
    """Make `out` ready for a job and return its number of partitions: the one recorded by an earlier run of the
    job (a rerun resumes, on a cluster of any size), else `requested`, else `default`. The merged manifest of an
    earlier run goes: it is written again at the end."""
    state = out / STATE
    try:
        manifest = orjson.loads((out / MANIFEST).read_bytes()) if (out / MANIFEST).exists() else None
    except (OSError, orjson.JSONDecodeError) as exc:
        raise OutputError(f"{out / MANIFEST} is not a manifest agentroll can read ({exc})") from exc
    if (manifest is not None and not (isinstance(manifest, dict) and manifest.get("merged_from"))) or any(
            out.glob("rollouts-*")):
        raise OutputError(f"{out} holds the rollouts of a run without --ray; give the --ray job a folder of its own")
    try:
        if overwrite:
            for path in out.glob("part-*"):
                if PART.fullmatch(path.name) and path.is_dir():
                    shutil.rmtree(path)
            shutil.rmtree(state, ignore_errors=True)
        recorded = None
        if (state / PLAN).exists():
            recorded = int(orjson.loads((state / PLAN).read_bytes())["partitions"])
        if requested is not None and recorded is not None and requested != recorded:
            raise UsageError(f"{out} holds a job split into {recorded} partitions: rerun it with --partitions "
                             f"{recorded} (or without --partitions), or pass --overwrite to start over")
        partitions = recorded or requested or default
        state.mkdir(parents=True, exist_ok=True)
        _atomic_write(state / PLAN, orjson.dumps({"partitions": partitions}))
        if manifest is not None:
            (out / MANIFEST).unlink()
    except OSError as exc:
        raise OutputError(f"output folder {out}: {exc.strerror or exc}") from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise OutputError(f"{state / PLAN} is damaged ({exc}); fix it, or pass --overwrite") from exc
    return partitions


def add_requests(counters: list[dict[str, Any]]) -> ClientCounters:
    """Tasks' request counters added up (`peak_in_flight` too: the tasks ran side by side; at most that)."""
    total = ClientCounters()
    for counts in counters:
        for spec in fields(ClientCounters):
            value = counts.get(spec.name)
            if isinstance(value, dict):
                merged = getattr(total, spec.name)
                for key, n in value.items():
                    merged[key] = merged.get(key, 0) + n
            elif isinstance(value, int | float) and not isinstance(value, bool):
                setattr(total, spec.name, getattr(total, spec.name) + value)
    return total


def add_stats(stats: list[dict[str, Any]]) -> RunStats:
    """Tasks' `RunStats.to_dict()` figures as one `RunStats`."""
    parts = [RunStats.from_dict(figures) for figures in stats]
    return sum(parts[1:], parts[0]) if parts else RunStats()


@dataclass
class Outcome:
    """How one partition ended, as its last attempt reported it."""

    index: int
    code: int | None = None  # the partition's agentroll exit code; None: its task was lost or never ran
    attempts: int = 0  # attempts in this job (above 1: Ray ran it again)
    stats: dict[str, Any] | None = None
    requests: dict[str, Any] | None = None
    error: str = ""  # the tail of its log, or Ray's error
    cancelled: bool = False  # by a stop of the job

    @property
    def ok(self) -> bool:
        return self.code == 0


def job_code(outcomes: list[Outcome]) -> int:
    """The job's exit code: 0 when every partition exited 0; 9 when a partition's task was lost more often than
    --ray-retries allows (or Ray could not run it); else the first failed partition's code that is not 8, or 8."""
    if any(o.code is None for o in outcomes):
        return 9
    codes = [o.code for o in outcomes if o.code]
    return next((c for c in codes if c != 8), 8) if codes else 0


class JsonProgress(Progress):
    """A partition's counters as JSON lines on `stream` (its task reads them): at most every `every_s`, and once
    more at the end."""

    def __init__(self, stream: IO[bytes], every_s: float = 0.5) -> None:
        self.stream, self.every_s, self.last = stream, every_s, 0.0
        self.seen: tuple[RunStats, ClientCounters] | None = None

    def advance(self, stats: RunStats, requests: ClientCounters) -> None:
        self.seen = (stats, requests)
        if time.monotonic() - self.last >= self.every_s:
            self._emit()

    def stop(self) -> None:
        if self.seen is not None:
            self._emit()

    def _emit(self) -> None:
        assert self.seen is not None
        stats, requests = self.seen
        self.last = time.monotonic()
        with contextlib.suppress(OSError, ValueError):  # the task is gone: the run goes on, its folder stays whole
            self.stream.write(orjson.dumps({"stats": stats.to_dict(), "requests": asdict(requests)}) + b"\n")
            self.stream.flush()


def partition_spec(data: bytes) -> dict[str, Any]:
    """The spec a task sends its child; the child dies (SIGTERM: it closes its folder) when its task's worker
    does, as its node's processes would."""
    spec = orjson.loads(data)
    die_with(int(spec["parent"]), signal.SIGTERM)
    return dict(spec)
