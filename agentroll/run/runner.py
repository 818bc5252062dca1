"""A whole `generate` run: read rows, skip what the folder already holds, `run_group`, `commit`.

Rows stream in from a file or stdin as they arrive; `Generator.stream` keeps a bounded number of groups in
flight, so memory stays flat however long the input. Signals, progress drawing and exit codes are the CLI's:
the runner only reports through a `Progress` hook and returns (or raises) what happened. The input's first row
is read and checked before the folder is touched (an empty or bad input leaves it as it was); the writer is
closed on every exit path, so the folder is consistent whatever ends the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentroll.client import ClientCounters
from agentroll.engine.generator import Generator
from agentroll.errors import AgentrollError, IncompleteRun, InputError, TooManyFailures, UsageError, first_line
from agentroll.folder import Layout, ShardWriter, StdoutWriter, consumed
from agentroll.inputs import Problem, aread_problems, in_partition, rows_to_read, source_name
from agentroll.inputs import check as check_input
from agentroll.inputs.mix import amix, check_mix
from agentroll.process import heap
from agentroll.record.group import Group
from agentroll.record.stats import RunStats
from agentroll.run.progress import Progress
from agentroll.run.run_options import RunOptions

log = logging.getLogger("agentroll")


@dataclass(slots=True)
class RunResult:
    stats: RunStats
    requests: ClientCounters
    wall_s: float
    model: str
    output: str
    complete: bool = False
    committed: bool = False  # the folder's manifest says complete: true (closed so)
    teachers: list[dict[str, Any]] = field(default_factory=list)  # --teacher: each one's model and requests
    notes: list[str] = field(default_factory=list)  # lines the summary ends with (said as warnings too)
    failures: Counter[str] = field(default_factory=Counter)  # why groups were not written: reason -> groups
    repeats: int = 0  # of those groups, the ones a rerun fails again (an agent that crashed: the journal replays)
    startup_s: float = 0.0  # until the first row to run was in hand (servers, tokenizer, folder, done rows)
    startup_requests: int = 0  # made by then (the servers' probes)

    @property
    def missing_groups(self) -> int:
        """Rows read whose group is neither on disk nor filtered, and that were not skipped as asked (already
        done, or invalid under --skip-invalid): failed groups, and those a signal or an error cut short."""
        s = self.stats
        return max(
            0,
            s.problems
            - s.groups_written
            - s.groups_filtered
            - s.problems_skipped_done
            - s.invalid_rows
            - s.problems_beyond_target,
        )


class Runner:
    def __init__(
        self, run: RunOptions, generate: dict[str, Any], progress: Progress | None = None, demo: bool = False
    ) -> None:
        self.run_options = run
        self.demo = demo  # `agentroll demo`: the folder is marked as its own
        journal = None if run.output == "-" else Layout(Path(run.output)).journal
        self.generator = Generator(journal=journal, **generate)
        if run.output == "-" and self.generator.options.return_routed_experts:
            raise UsageError("--return-routed-experts needs an output folder (routes go to a sidecar), not -o -")
        if run.output == "-" and self.generator.options.return_sampling_mask:
            raise UsageError("--return-sampling-mask needs an output folder (masks go to a sidecar), not -o -")
        self.progress = progress or Progress()
        self.result: RunResult | None = None  # set before `run` returns or raises: the CLI's summary reads it
        # a row was well formed though not run: of another slice (--partition), or refused only for its id
        self.well_formed = False
        self.first: Problem | None = None  # the input's first row, when checked before the folder is taken
        self.rows_seen = 0  # rows in the input, of any slice, valid or not
        self.target_reached = False
        self._started = time.monotonic()
        self._begun = False  # progress has started: the first row to run is in hand, or the input is done
        self._ended: BaseException | None = None  # what ended the run, if not its input's end
        self._first_invalid = ""  # the first row skipped under --skip-invalid, as it was said
        self.stopped_by: int | None = None  # the signal the command stops the run for (its exit: 128 + it)
        self._ticker: asyncio.Task[None] | None = None

    @property
    def stats(self) -> RunStats:
        return self.generator.stats

    async def run(self) -> RunResult:
        """Generate every row's group. Returns when the input is done (check `complete`); raises the error that
        ended the run otherwise (`self.result` then holds the figures so far)."""
        opts = self.run_options
        if opts.mix:  # before the output folder is touched
            check_mix(opts.sources())
        else:
            check_input(opts.input)
        started, begun = time.monotonic(), time.time()
        gen = self.generator
        async with gen:
            checked = await self._checked(self._rows())
            heap.settle()  # what is loaded now lives as long as the run (agentroll.process.heap)
            settings = {
                **gen.settings,
                "partition": list(opts.slice) if opts.slice else None,
                "compression": opts.compression,
                **({"mix": [{"name": s.name, "weight": s.weight} for s in opts.sources()]} if opts.mix else {}),
            }
            writer = (
                StdoutWriter()
                if opts.output == "-"
                else ShardWriter(
                    Path(opts.output), settings, opts.shard_size, opts.overwrite, opts.compression, demo=self.demo
                )
            )
            writer.server = gen.server
            done = writer.open(self._first_clash)
            replay = gen.open_journal(done)  # once the folder's lock is held: one process per journal
            log.debug(
                "%s: %d groups on disk or filtered already; the journal holds %d calls", opts.output, len(done), replay
            )
            if replay:
                log.info(
                    "the call journal holds %d finished calls of unfinished groups: they are replayed, not asked again",
                    replay,
                )
            policies = gen.settings.get("policies") or []  # a head-to-head run: every policy's model
            model = " vs ".join(f"{p['name']} ({p['model']})" for p in policies) or gen.model
            self.result = result = RunResult(self.stats, gen.counters, 0.0, model, opts.output)
            self._started = started
            try:
                rows = self._todo(done, writer, checked)
                if self._reached(writer):
                    log.info(
                        "--target-groups %d: that many groups are on disk already, nothing to do", opts.target_groups
                    )
                else:
                    async with contextlib.aclosing(gen.stream(rows, ordered=opts.ordered)) as groups:
                        async for group in groups:
                            self._commit(writer, group)
                            if self._reached(writer):
                                break  # the groups still in flight are cancelled; their calls stay in the journal
                if self.target_reached:
                    self.stats.problems_beyond_target = max(0, self.stats.problems - self.stats.groups_settled)
                if opts.target_groups is not None and not self.target_reached:
                    self._short_of_target(writer, result)
                self._every_row_invalid()
                result.complete = result.missing_groups == 0
            except BaseException as exc:
                self._ended = exc
                raise
            finally:
                self._begin(tick=False)
                if self._ticker is not None:
                    self._ticker.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._ticker
                self.progress.finish(self.stats, self.generator.counters)
                result.wall_s = time.monotonic() - started
                result.teachers = gen.teacher_report()
                writer.run_info = {
                    "stats": self.stats.to_dict(),
                    "requests": asdict(gen.counters),
                    "wall_s": round(result.wall_s, 3),
                    "started_at": round(begun, 3),
                    "finished_at": round(time.time(), 3),
                    "exit": self._exit(result),
                    **({"teachers": result.teachers} if result.teachers else {}),
                }
                writer.close(complete=result.complete)
                result.committed = result.complete  # on disk: a signal from now on changes nothing
        return result

    def _exit(self, result: RunResult) -> dict[str, Any]:
        """How this run ended, for the manifest (`last_run.exit`): the exit code the command gives (None when a
        caller cancelled it without a signal) and why. A follower ends on it (`read_groups(follow=True)`)."""
        ended = self._ended
        if ended is None:
            if result.complete:
                return {"code": 0, "reason": "complete"}
            missing = f"{result.missing_groups} of {self.stats.problems} groups could not be produced"
            return {"code": IncompleteRun.exit_code, "reason": missing}
        if isinstance(ended, AgentrollError):
            return {"code": ended.exit_code, "reason": first_line(ended)}
        if self.stopped_by is not None:
            return {"code": 128 + self.stopped_by, "reason": f"stopped by {signal.Signals(self.stopped_by).name}"}
        if isinstance(ended, KeyboardInterrupt):
            return {"code": 130, "reason": "stopped by SIGINT"}
        if isinstance(ended, asyncio.CancelledError):
            return {"code": None, "reason": "cancelled"}
        return {"code": 1, "reason": f"{type(ended).__name__}: {first_line(ended)}"}

    def _named(self) -> str:
        opts = self.run_options
        return ", ".join(s.path for s in opts.sources()) if opts.mix else source_name(opts.input)

    def _total(self) -> int | None:
        """Rows to read, for the progress bar (None: not known cheaply)."""
        opts = self.run_options
        return rows_to_read([s.path for s in opts.sources()] if opts.mix else [opts.input], opts.limit)

    def _begin(self, tick: bool = True) -> None:
        """Progress starts once the rows already on disk at the input's head are skipped (a resume's first line
        says `groups 10/120`, not 0) and the first row to run is in hand, or the input is done; its rates leave
        out the start-up's requests, and so does the summary's (`RunResult.startup_s`)."""
        result = self.result
        if self._begun or result is None:
            return
        self._begun = True
        opts = self.run_options
        result.startup_s = time.monotonic() - self._started
        result.startup_requests = self.generator.counters.requests
        self.progress.start(None if opts.partition else self._total(), result.startup_requests)
        self.progress.advance(self.stats, self.generator.counters)
        if tick:
            self._ticker = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        """Progress from the start, and between groups: a bar that moves, a log line that comes."""
        while True:
            await asyncio.sleep(self.progress.interval_s)
            self.progress.advance(self.stats, self.generator.counters)

    def _reached(self, writer: ShardWriter | StdoutWriter) -> bool:
        """--target-groups: are that many groups on disk (this run's and earlier ones')?"""
        target = self.run_options.target_groups
        if target is None:
            return False
        on_disk = writer.groups_committed if isinstance(writer, ShardWriter) else self.stats.groups_written
        self.target_reached = self.target_reached or on_disk >= target
        return self.target_reached

    def _short_of_target(self, writer: ShardWriter | StdoutWriter, result: RunResult) -> None:
        """--target-groups N, but the input (or --limit) ran out first: said once, and in the summary."""
        opts = self.run_options
        on_disk = writer.groups_committed if isinstance(writer, ShardWriter) else self.stats.groups_written
        limit = f", --limit {opts.limit}" if opts.limit is not None else ""
        note = (
            f"--target-groups {opts.target_groups}: the input ran out at {on_disk} of {opts.target_groups} groups "
            f"({self.stats.problems} prompts read{limit})"
        )
        log.warning(note)
        result.notes.append(note)

    def _commit(self, writer: ShardWriter | StdoutWriter, group: Group) -> None:
        stats = self.stats
        if group.status in ("complete", "filtered"):
            writer.commit(group)
            log.debug("problem %s: group %s (%d records)", group.problem_id, group.status, group.num_records)
            if group.status == "complete":
                stats.groups_written += 1
                stats.records_written += group.num_records
        elif group.status == "invalid":
            if not self.run_options.skip_invalid:
                raise group.cause or InputError(group.problem.source, group.problem.line, None, str(group.error))
            stats.invalid_rows += 1
            self._first_invalid = self._first_invalid or str(group.error)
            log.warning("skipping invalid row: %s", group.error)
        else:
            if self.result is not None:
                self.result.failures[str(group.error)] += 1
                self.result.repeats += not group.rerun_helps
            helps = group.rerun_helps  # an agent that crashed on what the journal replays fails the same way again
            rerun = "a rerun redoes it" if helps else "a rerun fails it again unless the agent changes"
            fold = f"groups not written (a rerun {'redoes' if helps else 'fails'} them)"
            where = f"problem {group.problem_id} ({group.problem.source} line {group.problem.line})"
            log.warning(
                "%s: group not written, %s: %s", where, rerun, group.error, extra={"fold": (fold, str(group.error))}
            )
        self.progress.advance(stats, self.generator.counters)
        limit = self.run_options.max_failures
        if limit is not None and self.generator.counters.failures > limit:
            raise TooManyFailures(f"{self.generator.counters.failures} calls failed for good (--max-failures {limit})")

    def _rows(self) -> AsyncIterator[Problem]:
        """The input's rows as read: a row that cannot be parsed raises (is counted under --skip-invalid)."""
        opts, gen = self.run_options, self.generator
        unread = self._skip_unread if opts.skip_invalid else None
        return amix(opts.sources(), gen.keys, unread) if opts.mix else aread_problems(opts.input, gen.keys, unread)

    def _first_clash(self, done: dict[str, str]) -> None:
        if self.first is not None:
            self._clash(self.first, done)

    def _every_row_invalid(self) -> None:
        """Under --skip-invalid, an input none of whose rows could be read is a usage fault (wrong --prompt-key,
        say), not a run of nothing. A slice's rows may all be bad, or all clash with done ids (`well_formed`: the
        keys are then right)."""
        stats = self.stats
        every = self.run_options.skip_invalid and stats.problems and stats.invalid_rows == stats.problems
        if every and not self.well_formed:
            raise InputError(
                self._named(),
                0,
                None,
                f"every row read ({stats.problems}) was invalid (the first: {self._first_invalid}): check "
                "--prompt-key and --label-key",
            )

    def _clash(self, problem: Problem, done: dict[str, str]) -> None:
        """A row whose id is done in the folder with another prompt or label is refused."""
        written = done.get(problem.id)
        if written is not None and written != problem.content_hash:
            self.well_formed = True
            raise InputError(
                problem.source,
                problem.line,
                self.generator.keys.id,
                f"id {problem.id!r} is already in the output folder with another prompt or label; give this row "
                "another id",
            )

    async def _checked(self, rows: AsyncIterator[Problem]) -> AsyncIterator[Problem]:
        """The rows, the first read and checked now, before the output folder is touched: an empty input (said
        in one line naming it) or a bad first row leaves the folder as it was. `--limit 0` reads no row."""
        if self.run_options.limit == 0:
            return rows
        first = await anext(rows, None)
        if first is None and self.rows_seen == 0:  # (rows that do not parse count, under --skip-invalid)
            raise InputError(
                self._named(), 0, None, "no rows to generate from: the input is empty (or holds only blank lines)"
            )
        if first is None:
            self._every_row_invalid()  # no row could be read (a wrong key): before the folder is touched
        part = self.run_options.slice
        if first is not None and not self.run_options.skip_invalid and (not part or in_partition(first.id, *part)):
            self.generator.problem(first)  # checked again in its turn
            if self.run_options.target_groups is None:  # (a target already on disk reads no row: none to refuse)
                self.first = first  # and against the folder's done ids before the run takes it (`writer.open`)

        async def chained() -> AsyncIterator[Problem]:
            if first is not None:
                yield first
            async for problem in rows:
                yield problem

        return chained()

    async def _todo(
        self, done: dict[str, str], writer: ShardWriter | StdoutWriter, rows: AsyncIterator[Problem]
    ) -> AsyncIterator[Problem]:
        """The rows still to run: bad rows raise (or are counted under --skip-invalid), rows of another slice
        are passed over, and a row already done is skipped, unless its content differs from what was written
        under its id: then it is refused."""
        opts, stats, gen = self.run_options, self.stats, self.generator
        on_invalid = self._skip if opts.skip_invalid else None
        taken = 0
        while opts.limit is None or taken < opts.limit:  # --limit: not one row read past the last one taken
            problem = await anext(rows, None)
            if problem is None:
                break
            if self.target_reached:
                break  # --target-groups: no more prompts than it takes
            self.rows_seen += 1
            if opts.slice is not None and not in_partition(problem.id, *opts.slice):
                if not self.well_formed:
                    with contextlib.suppress(InputError):
                        gen.problem(problem)
                        self.well_formed = True
                continue
            taken += 1
            stats.problems += 1
            try:
                gen.problem(problem)  # a row's own reward must be allowed
                self._clash(problem, done)
            except InputError as exc:
                if on_invalid is None:
                    raise
                on_invalid(exc)
                continue
            if problem.id in done:
                stats.problems_skipped_done += 1
                continue
            if isinstance(writer, ShardWriter) and opts.consumer is not None:
                await self._wait_for_consumer(writer, opts.consumer, opts.max_ahead or 0)
            self._begin()
            yield problem

    async def _wait_for_consumer(self, writer: ShardWriter, name: str, most: int) -> None:
        """Take no new prompt while the consumer has more than `most` committed groups still to read."""
        waiting = False
        while writer.groups_committed - consumed(writer.directory, name) > most:
            if not waiting:
                log.warning(
                    "waiting for consumer %s: %d groups committed, %d consumed (--max-ahead %d)",
                    name,
                    writer.groups_committed,
                    consumed(writer.directory, name),
                    most,
                )
                waiting = True
            await asyncio.sleep(0.2)  # another process's progress: a file to look at again

    def _skip(self, exc: InputError) -> None:
        self.stats.invalid_rows += 1
        self._first_invalid = self._first_invalid or str(exc)
        log.warning("skipping invalid row: %s", exc)

    def _skip_unread(self, exc: InputError) -> None:
        """A row that could not even be parsed: it counts as read, and as skipped. Under --partition it has no id
        to place it in a slice: slice 0 counts it and the others pass it over, so a split job counts it once."""
        self.rows_seen += 1
        if self.run_options.slice is not None and self.run_options.slice[0] != 0:
            return
        self.stats.problems += 1
        self._skip(exc)
