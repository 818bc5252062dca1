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
import signal
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import IO, Any

import orjson

from agentroll.client import ClientCounters
from agentroll.engine.options import GenerateOptions
from agentroll.errors import InputError, OutputError, UsageError
from agentroll.folder.job import log_path, part_dir
from agentroll.folder.layout import Layout
from agentroll.folder.manifest import Manifest
from agentroll.process.children import die_with
from agentroll.record.stats import RunStats
from agentroll.run.progress import Progress
from agentroll.run.run_options import RunOptions

RAY_RETRIES = 3  # --ray-retries when not given
DEFAULT_PORTS = {"": 6379, "ray://": 10001}  # Ray's own: a GCS address, a Ray Client server


def ray_address(text: str | None) -> str:
    """`--ray` as Ray takes it: auto, local, HOST:PORT or ray://HOST:PORT; a missing port is Ray's default (6379
    for a cluster's GCS, 10001 for ray://). Anything else is a usage error."""
    given = (text or "").strip()
    if given in ("auto", "local"):
        return given
    bad = UsageError(f"--ray {given!r}: expected auto, local, HOST[:PORT] or ray://HOST[:PORT]")
    scheme = "ray://" if given.startswith("ray://") else ""
    rest = given[len(scheme) :]
    if rest.startswith("["):  # [IPv6]:PORT
        inside, closed, tail = rest[1:].partition("]")
        if not (closed and inside) or tail[:1] not in ("", ":"):
            raise bad
        host, sep, port = f"[{inside}]", tail[:1], tail[1:]
    elif rest.count(":") > 1:
        raise UsageError(f"--ray {given!r}: write an IPv6 address in brackets, [ADDRESS]:PORT")
    else:
        host, sep, port = rest.partition(":")
    if not host or "/" in host or (sep and not (port.isdigit() and 0 < int(port) < 65536)):
        raise bad
    return f"{scheme}{host}:{port if sep else DEFAULT_PORTS[scheme]}"


def check_options(run: RunOptions, generate: GenerateOptions) -> None:
    """What a `--ray` job cannot do, said before anything starts."""
    ray_address(run.ray)
    if run.output == "-":
        raise UsageError("--ray writes into a folder (each partition into OUT/part-I), not -o -")
    for path in [s.path for s in run.sources()] if run.mix else [run.input]:
        if path == "-":
            raise UsageError("--ray needs an input file that every node reads at the same path, not stdin")
        if not os.path.isfile(path):
            raise InputError(path, 0, None, "no such file")
    if run.partition is not None:
        raise UsageError("--ray makes its own partitions: use --partitions P, not --partition")
    if run.limit is not None:
        raise UsageError("--limit does not go with --ray (it would apply to each partition)")
    if run.consumer is not None:
        raise UsageError(
            "--consumer does not go with --ray: a consumer follows one folder (follow OUT/part-I, "
            "or read OUT when the job is done)"
        )
    urls = generate.base_url
    if run.endpoints_per_task is not None and not generate.policy and run.endpoints_per_task > len(urls):
        raise UsageError(
            f"--endpoints-per-task {run.endpoints_per_task} is more than the {len(urls)} --base-url endpoints"
        )


def tasks_at_once(partitions: int, cpus: float, task_cpus: float = 1.0) -> int:
    """How many tasks the cluster runs at the same time: one per `task_cpus` CPUs, at least one."""
    return max(1, min(partitions, int(cpus // task_cpus)))


def share(total: int, ways: int) -> int:
    """A task's part of a whole-job figure, at least 1."""
    return max(1, total // ways)


def target_share(target: int | None, index: int, partitions: int) -> int | None:
    """Partition `index`'s part of the job's `--target-groups`: N // P, one more for each of the first N % P
    partitions, so the shares add up to N (a user means the job's N, not N per partition)."""
    if target is None:
        return None
    return target // partitions + (index < target % partitions)


def mixed(run: RunOptions) -> list[str]:
    """The job's `--mix`, each source named as on the driver and its path made absolute: every partition reads
    the same sources, interleaved the same way, and keeps the rows of its own slice."""
    return [f"{s.name}:{os.path.abspath(s.path)}={s.weight!r}" for s in run.sources()]


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


def plan_tasks(
    run: RunOptions, given: dict[str, Any], generate: GenerateOptions, partitions: int, at_once: int
) -> list[Task]:
    """Each partition's options. `--concurrency` (or, under auto, `--max-concurrency` per endpoint) and
    `--target-groups` are the whole job's: the one split between the tasks that run at once (or share an endpoint
    at once), the other between the partitions."""
    out = Path(os.path.abspath(run.output))
    policies = generate.policies()
    per_task = run.endpoints_per_task
    # the tasks at once that share one endpoint: with E of a policy's n endpoints each (all, when it has fewer)
    sets = [len(p.urls) for p in policies] or [len(generate.base_url)]
    sharing = at_once if per_task is None else max(math.ceil(at_once * min(per_task, n) / n) for n in sets)
    tasks = []
    given = absolute_paths(given)
    for index in range(partitions):
        options = replace(
            run,
            input="-" if run.mix else os.path.abspath(run.input),
            mix=mixed(run),
            target_groups=target_share(run.target_groups, index, partitions),
            output=str(part_dir(out, index)),
            partition=f"{index}/{partitions}",
            overwrite=False,
            ray=None,
            partitions=None,
            endpoints_per_task=None,
            ray_retries=None,
        )
        mine = {**given, "base_url": endpoints(generate.base_url, index, per_task) if generate.base_url else []}
        if policies:  # each policy's own endpoints shared out the same way (all of them, when it has fewer)
            mine["policy"] = [
                p.spec(
                    endpoints(list(p.urls), index, None if per_task is None else min(per_task, len(p.urls))),
                    _path(p.tokenizer),
                )
                for p in policies
            ]
        if generate.api_key:  # as found on the driver (flag or environment): a node's environment may differ
            mine["api_key"] = generate.api_key
        if generate.concurrency == "auto":
            mine["max_concurrency"] = share(generate.max_concurrency, sharing)
        else:
            mine["concurrency"] = share(int(generate.concurrency), at_once)
        tasks.append(Task(index, asdict(options), mine))
    return tasks


def _path(name: str | None) -> str | None:
    """A tokenizer that names an existing path, made absolute (else a hub id, as it is)."""
    return os.path.abspath(name) if name and os.path.exists(name) else name


def _stage_path(item: str) -> str:
    head, eq, raw = item.partition("=")
    if eq and head.strip().rpartition(".")[2] == "tokenizer" and raw.strip() and os.path.exists(raw.strip()):
        return f"{head}={os.path.abspath(raw.strip())}"
    return item


def _code_path(spec: Any) -> Any:
    """FILE.py:NAME with FILE made absolute; anything else as it is."""
    if not isinstance(spec, str):
        return spec
    target, colon, name = spec.rpartition(":")
    return f"{os.path.abspath(target)}:{name}" if colon and target.endswith(".py") else spec


def absolute_paths(given: dict[str, Any]) -> dict[str, Any]:
    """The job's generate options with their relative paths made absolute on the driver: a partition runs on
    another node, whose working directory is the driver's only when that exists there. `--prompts`,
    `--system FILE.py:CLASS`, `--reward FILE.py:FUNCTION`, and `--tokenizer` / `--stage X.tokenizer=` when they
    name an existing path (else they are hub ids). A row's own `reward` field is used as written: when it names
    the run's `--reward` as given, it stays allowed."""
    out = dict(given)
    if out.get("prompts") is not None:
        out["prompts"] = os.path.abspath(str(out["prompts"]))
    tokenizer = out.get("tokenizer")
    if isinstance(tokenizer, str) and tokenizer and os.path.exists(tokenizer):
        out["tokenizer"] = os.path.abspath(tokenizer)
    if "system" in out:
        out["system"] = _code_path(out["system"])
    reward = out.get("reward")
    if _code_path(reward) != reward:
        out["reward"] = _code_path(reward)
        allowed = out.get("allow_reward") or []
        allowed = [allowed] if isinstance(allowed, str) else list(allowed)
        out["allow_reward"] = allowed if reward in allowed else [*allowed, reward]
    stages = out.get("stage")
    if stages:
        out["stage"] = [_stage_path(item) for item in ([stages] if isinstance(stages, str) else stages)]
    return out


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


RERUN_HELPS = (4, 7, 8, 9)  # a server back, calls that may succeed, a lost task: the same command again helps


def job_message(code: int, outcomes: list[Outcome], out: Path, retries: int) -> str:
    """Why the job's code is not 0, in one line; "run the same command again" only where that can help."""
    failed = [o for o in outcomes if not o.ok]
    if code == 0 or not failed:
        return ""
    names = ", ".join(f"part-{o.index}" for o in failed)
    logs = log_path(out, failed[0].index)
    if code == 9:
        return (
            f"{names}: lost more often than --ray-retries ({retries}) allows, or Ray could not run it; run "
            f"the same command again to resume (logs: {logs})"
        )
    if code in RERUN_HELPS:
        return f"{names} did not finish whole (see above, and {logs}); run the same command again to resume"
    return (
        f"{names} failed with exit {code} (see above, and {logs}); the same command would fail the same way: "
        "fix the cause, then run it again to resume"
    )


def unseen_parts(out: Path, outcomes: list[Outcome]) -> str:
    """Why the driver cannot merge what the partitions wrote, or "": a partition's manifest that the driver does
    not see, or sees older than the one its node wrote (the figures its task read there differ). Both mean that
    the driver and the nodes do not share `out` alike."""
    for o in outcomes:
        folder = part_dir(out, o.index)
        path = Layout(folder).manifest
        if not path.exists():
            return (
                f"{path} is not there for the driver: the driver and every node must see {out} at the same "
                "path, on shared storage (docs/ray.md)"
            )
        try:
            manifest = Manifest.load(folder)
        except OutputError as exc:
            return f"the driver cannot read it ({exc}); the nodes and the driver must share {out}"
        if o.stats is not None and manifest.last_run.get("stats") != o.stats:
            return (
                f"{path} as the driver reads it is not what part-{o.index} wrote on its node (an older copy): "
                f"the driver and every node must share {out} on storage they all see alike (docs/ray.md)"
            )
    return ""


class JsonProgress(Progress):
    """A partition's counters as JSON lines on `stream` (its task reads them): at most every `every_s`, and once
    more at the end."""

    def __init__(self, stream: IO[bytes], every_s: float = 0.5) -> None:
        self.stream, self.every_s, self.last = stream, every_s, -math.inf  # the first at once, even just after boot
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
