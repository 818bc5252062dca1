"""`agentroll distill DIR -o NEW --teacher URL`: a teacher's scores added to a finished folder, no student server.

Every record is copied token for token (ids, logprobs, masks, rewards, routes); the teacher scores each one's
prompt + response ids exactly as `generate --teacher` does (the same call, the same `Teacher`), so a run with a
teacher and a distilled folder hold the same teacher fields for the same records. Which stage is scored follows
generate's rule: `--teacher` for the stages that train, `--stage NAME.teacher=URL|none` for one apart, a frozen
stage only on request. The teacher is checked as generate checks it: its vocabulary against the student's
tokenizer (the folder's, `settings.tokenizer`, or `--tokenizer`), by token ids, before anything is written.

NEW is a whole folder of its own (`settings.derived_from` names DIR, `settings.teacher` the teacher), written by
the folder package as any run is. Groups are scored concurrently (as many as keep the teacher's slots busy) and
committed in the source's order; each scored call is kept in NEW's call journal, so a kill loses only the calls in
flight and the same command resumes. A group whose scoring fails for good is not written (exit 8: rerun).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentroll.client import CallFailed, ClientCounters, ClientSettings, Transport
from agentroll.context import provenance
from agentroll.engine.handshake import discover
from agentroll.errors import UsageError
from agentroll.folder import Layout, Manifest, read_groups
from agentroll.record.group import Group
from agentroll.record.schema import Sample
from agentroll.record.stats import RunStats
from agentroll.render.chat import load_first
from agentroll.run.progress import Progress
from agentroll.systems import vocabulary_of
from agentroll.teacher.check import check_vocabulary
from agentroll.teacher.scorer import Teacher, clear, score_each
from agentroll.teacher.settings import TeacherOptions, TeacherSettings
from agentroll.tools.rescoring import system_of_folder

log = logging.getLogger("agentroll")


@dataclass
class DistillResult:
    source: str
    output: str
    stats: RunStats = field(default_factory=RunStats)
    teachers: list[dict[str, Any]] = field(default_factory=list)
    complete: bool = False
    wall_s: float = 0.0


def frozen_stages(settings: dict[str, Any]) -> set[str]:
    """The stages the run froze (`trainable: false`): another served model, or said so (handshake.stage_setups)."""
    model = settings.get("model")
    out = set()
    for name, own in (settings.get("stage_settings") or {}).items():
        if isinstance(own, dict) and not own.get("trainable", own.get("model", model) == model):
            out.add(name)
    return out


class Plan:
    """Which teacher scores each stage, from the options and the source's settings; the teachers made."""

    def __init__(
        self,
        options: TeacherOptions,
        settings: dict[str, Any],
        stages: dict[str, dict[str, Any]],
        client: ClientSettings,
    ) -> None:
        names = tuple((settings.get("system") or {}).get("stages") or ()) or ("solver", "rewriter", "selector")
        unknown = sorted(set(stages) - set(names))
        if unknown:
            raise UsageError(f"--stage names {', '.join(unknown)}: the folder's stages are {', '.join(names)}")
        options.check_stage_teachers(stages)
        frozen = frozen_stages(settings)
        self.wanted = {name: options.stage_teacher(stages.get(name, {}), name not in frozen, client) for name in names}
        self.default = options.teacher_settings(client)  # a stage the system did not declare (a user's system)
        if not any(self.wanted.values()) and self.default is None:
            raise UsageError("no stage has a teacher: pass --teacher URL (or --stage NAME.teacher=URL)")
        self.teachers: dict[TeacherSettings, Teacher] = {}
        self.by_stage: dict[str, Teacher | None] = {}

    def of(self, stage: str) -> Teacher | None:
        return self.by_stage.get(stage, self.by_stage.get("", None))

    async def start(self, tokenizers: dict[str, list[Any]], transport: Transport | None) -> None:
        """Reach each teacher once and check its vocabulary against every tokenizer the records of a stage it
        scores were made with (`student_tokenizers`: each policy's of a head-to-head folder, a stage's own)."""
        checked: set[tuple[int, int]] = set()
        for name, wanted in [*self.wanted.items(), ("", self.default)]:
            if wanted is None:
                self.by_stage[name] = None
                continue
            teacher = self.teachers.get(wanted)
            if teacher is None:
                teacher = self.teachers[wanted] = Teacher(wanted, transport)
                model, length, _ = await discover(teacher.client, wanted.model)
                await teacher.start(model, length)
            for tokenizer in tokenizers.get(name) or tokenizers[""]:
                if (id(teacher), id(tokenizer)) not in checked:
                    await check_vocabulary(teacher, tokenizer)
                    checked.add((id(teacher), id(tokenizer)))
            self.by_stage[name] = teacher

    def recorded(self) -> dict[str, Any]:
        """`settings.teacher`, as generate writes it."""

        def one(teacher: Teacher | None) -> dict[str, Any] | None:
            return None if teacher is None else teacher.settings.recorded(teacher.model)

        return {"default": one(self.by_stage.get("")), "stages": {n: one(self.by_stage[n]) for n in self.wanted}}

    async def aclose(self) -> None:
        await asyncio.gather(*(t.aclose() for t in self.teachers.values()), return_exceptions=True)


def student_tokenizers(manifest: Manifest, tokenizer: str | None) -> dict[str, list[Any]]:
    """Per stage ("" for the run's own), the tokenizers its records were made with: the run's, or each policy's in
    a head-to-head folder (`settings.policies`: policies of different models may tokenize apart, and generate
    checks a teacher against each), a stage's own where it had one (`--stage NAME.tokenizer`). `--tokenizer`
    stands for the run's (each policy's); one not the run's (by its hash in the manifest) is said."""
    settings = manifest.settings
    runs = [r for r in settings.get("policies") or () if isinstance(r, dict)] or [settings]
    stages = [*((settings.get("system") or {}).get("stages") or ()), *(settings.get("stage_settings") or {})]
    names: dict[str, list[str]] = {}
    for run in runs:
        own = run.get("stage_settings") or {}
        base = tokenizer or run.get("tokenizer") or settings.get("tokenizer")
        for stage in ["", *stages]:
            name = (own.get(stage) or {}).get("tokenizer") if stage else None
            name = name or base
            if name and str(name) not in names.setdefault(stage, []):
                names[stage].append(str(name))
    if not names.get(""):
        raise UsageError("the folder's settings name no tokenizer: pass --tokenizer (the student's)")
    servers = [*manifest.servers, *(p for s in manifest.servers for p in (s.get("policies") or {}).values())]
    hashes = {s.get("tokenizer_sha256") for s in servers if isinstance(s, dict)} - {None}
    loaded: dict[str, Any] = {}
    for name in dict.fromkeys(n for found in names.values() for n in found):
        loaded[name] = load_first([name], True, False)[1]
        if hashes and provenance.tokenizer_sha256(loaded[name]) not in hashes:
            log.warning("the tokenizer %s is not the one the run used (its hash differs from the manifest's)", name)
    return {stage: [loaded[n] for n in found] for stage, found in names.items()}


def check_lengths(source: Path, plan: Plan, settings: dict[str, Any]) -> None:
    """Under --teacher-all-or-nothing every record a teacher scores must fit its context with the one token a
    scoring call generates: checked over the folder before NEW is touched, when the run's context could have made
    a longer one: the run's, each policy's of a head-to-head folder, and a stage's own. (Without it a record that
    fills the teacher's context is kept unscored: `Teacher.leave`.)"""
    strict = [t for t in plan.teachers.values() if t.settings.all_or_nothing]
    limits = [t.max_model_len for t in strict if t.max_model_len is not None]
    runs = [settings, *(r for r in settings.get("policies") or () if isinstance(r, dict))]
    contexts = [run.get("max_context_len") for run in runs] + [
        own.get("max_context_len")
        for run in runs
        for own in (run.get("stage_settings") or {}).values()
        if isinstance(own, dict) and "max_context_len" in own
    ]
    if not limits or all(isinstance(c, int) and c < min(limits) for c in contexts):
        return
    for group in read_groups(source):
        for samples in group.executions:
            for s in samples:
                teacher = plan.of(s.stage)
                length = len(s.prompt_token_ids) + len(s.response_token_ids)
                if teacher in strict and teacher is not None:
                    teacher.room(length, f"problem {s.problem_id}'s {s.stage} record", student=False)


async def distill(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    teacher: str | list[str] | TeacherOptions,
    *,
    stages: dict[str, dict[str, Any]] | None = None,
    tokenizer: str | None = None,
    overwrite: bool = False,
    shard_size: int = 1000,
    client: ClientSettings | None = None,
    progress: Progress | None = None,
    transport: Transport | None = None,
) -> DistillResult:
    """Score the folder `source` with a teacher into `output` (see the module's docstring). `teacher`: its URL(s),
    the other teacher options at their defaults, or the whole `TeacherOptions` (as the CLI passes them);
    `stages`: per-stage teacher settings ({stage: {"teacher": URL or "none", "teacher_model": NAME}}); `client`: the
    teachers' timeouts and retries (`teacher.settings.client_of`), their own concurrency aside."""
    src, out = Path(source), Path(output)
    if src.resolve() == out.resolve():
        raise UsageError(f"-o {out}: distill writes a new folder, not into its source")
    options = (
        teacher
        if isinstance(teacher, TeacherOptions)
        else TeacherOptions(teacher=[teacher] if isinstance(teacher, str) else teacher)
    )
    options.check_teacher()
    manifest = Manifest.load(src)
    if not manifest.complete:
        log.warning("%s: its run did not complete; only the groups on disk are scored", src)
    settings = manifest.settings
    plan = Plan(options, settings, stages or {}, client or ClientSettings())
    result = DistillResult(str(src), str(out))
    stats, progress = result.stats, progress or Progress()
    system = system_of_folder(manifest)
    stats.use_stages(tuple((settings.get("system") or {}).get("stages") or ()) or system.stages, vocabulary_of(system))
    started = time.monotonic()
    try:
        await plan.start(await asyncio.to_thread(student_tokenizers, manifest, tokenizer), transport)
        await asyncio.to_thread(check_lengths, src, plan, settings)
        new_settings = {
            **settings,
            "teacher": plan.recorded(),
            "derived_from": {"folder": str(src.resolve()), "folder_id": manifest.folder_id, "command": "distill"},
        }
        from agentroll.folder import ShardWriter  # the writer only for a command that writes: `import agentroll` reads
        from agentroll.folder.journal import Journal

        compression = str(settings.get("compression") or "none")
        writer = ShardWriter(out, new_settings, shard_size, overwrite=overwrite, compression=compression)
        begun = time.time()
        done = writer.open()
        journal = Journal(Layout(out).journal, fingerprint={"distill": manifest.folder_id})
        progress.start(sum(s.groups for s in manifest.shards) or None)
        try:
            journal.open(done)
            await _score_all(src, plan, writer, journal, done, stats, progress)
            result.complete = stats.groups_failed == 0
        finally:
            journal.close()
            result.wall_s = time.monotonic() - started
            result.teachers = [t.report() for t in plan.teachers.values()]
            progress.finish(stats, _counters(plan))
            writer.run_info = {
                "stats": stats.to_dict(),
                "teachers": result.teachers,
                "wall_s": round(result.wall_s, 3),
                "started_at": round(begun, 3),
                "finished_at": round(time.time(), 3),
            }
            writer.close(complete=result.complete)
    finally:
        await plan.aclose()
    return result


def _counters(plan: Plan) -> ClientCounters:
    """The teachers' requests added up (what the progress line's rate counts)."""
    total = ClientCounters()
    for t in plan.teachers.values():
        c = t.client.counters
        total.requests += c.requests
        total.retries += c.retries
        total.failures += c.failures
        total.in_flight += c.in_flight
        total.queued += c.queued
        total.peak_in_flight = max(total.peak_in_flight, c.peak_in_flight)
    return total


async def _score_all(
    src: Path, plan: Plan, writer: Any, journal: Any, done: dict[str, str], stats: RunStats, progress: Progress
) -> None:
    """Score the groups not done, as many at once as keep the teachers' slots busy, committed in source order."""
    pending: deque[tuple[Group, asyncio.Task[Group | None]]] = deque()
    calls = 0
    sidecar = bool(writer.settings.get("return_routed_experts") or writer.settings.get("return_sampling_mask"))
    groups: Iterator[Group] = read_groups(src, routes=sidecar)  # routes and masks are written again
    ticker = asyncio.ensure_future(_tick(progress, stats, plan))
    try:
        for number in itertools.count():
            group = next(groups, None)
            if group is not None:
                stats.problems += 1
                if done.get(group.problem.id) == group.problem.content_hash:
                    stats.problems_skipped_done += 1
                    continue
                pending.append((group, asyncio.ensure_future(_score(group, plan, journal, number))))
                calls += 1  # a group's records go in one request (or a few): about a slot each
            # keep about twice the teachers' slots of requests in flight (under auto, as many as their caps are
            # now); commit what is finished at the head
            while pending and (group is None or calls >= 2 * _capacity(plan) or pending[0][1].done()):
                head, task = pending.popleft()
                scored = await task
                calls -= 1
                _settle(head, scored, writer, journal, stats)
                progress.advance(stats, _counters(plan))
            if group is None and not pending:
                break
    finally:
        ticker.cancel()
        for _, task in pending:
            task.cancel()
        await asyncio.gather(ticker, *(t for _, t in pending), return_exceptions=True)


def _capacity(plan: Plan) -> int:
    return max(1, sum(t.client.budget.capacity for t in plan.teachers.values()))


async def _tick(progress: Progress, stats: RunStats, plan: Plan) -> None:
    while True:
        await asyncio.sleep(progress.interval_s)
        progress.advance(stats, _counters(plan))


async def _score(group: Group, plan: Plan, journal: Any, number: int) -> Group | None:
    """The group with every record scored by its stage's teacher, a problem's records in as few requests as the
    teacher's batches take; None when a scoring call failed for good."""
    problem = group.problem
    asked: list[tuple[Teacher, Sample, str]] = []
    for samples in group.executions:
        for i, sample in enumerate(samples):
            teacher = plan.of(sample.stage)
            if teacher is None:
                clear(sample)
                continue
            asked.append((teacher, sample, "\x1f".join((problem.id, problem.content_hash, sample.rollout_id, str(i)))))
    try:
        await score_each(asked, journal, (problem.id, problem.content_hash), (number, 0))
    except CallFailed as exc:
        group.error = f"teacher call failed: {exc}"
        return None
    finally:
        for teacher in plan.teachers.values():
            teacher.settled(number)
    return group


def _settle(group: Group, scored: Group | None, writer: Any, journal: Any, stats: RunStats) -> None:
    problem = group.problem
    if scored is None:
        stats.groups_failed += 1
        log.warning(
            "problem %s: group not written, a rerun redoes it: %s",
            problem.id,
            group.error,
            extra={"fold": ("groups not written (a rerun redoes them)", str(group.error))},
        )
        journal.settle(problem.id, problem.content_hash, failed=True)
        return
    writer.commit(scored)
    journal.settle(problem.id, problem.content_hash)
    stats.groups_written += 1
    stats.records_written += scored.num_records
    for samples in scored.executions:
        stats.add_execution(samples)
