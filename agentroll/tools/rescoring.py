"""`agentroll rescore DIR -o NEW --reward SPEC`: the same records scored again by another reward, no model called.

Every record is copied token for token (ids, logprobs, masks, routes); only the rewards move. Each recorded
execution goes through its system's `rescore` (the selector's pick and the shaping recomputed as the system defines
them), then the folder's length shaping, then the group's figures; `--filter-uniform-groups` applies to the new
outcomes. A reward is given the request the run gave the old one: the statement and the row's prompt as given, from
the records' `problem` (a folder older than schema 6 has only the rendered prompt: said once). The reward options
are generate's (`RewardOptions`), passed in whole as `RewardSettings`. NEW is a whole folder of its own (its
manifest's `settings.derived_from` names DIR), written by the folder package as any run is: killed, it resumes by
running the same command again.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agentroll.errors import InputError, UsageError
from agentroll.folder import Manifest, read_groups
from agentroll.folder.journal import Journal
from agentroll.folder.layout import Layout
from agentroll.inputs import Problem
from agentroll.process.concurrency import gather_or_cancel
from agentroll.record.group import Group, annotate
from agentroll.record.schema import Sample
from agentroll.record.stats import RunStats
from agentroll.rewards import JudgeFailed, RewardSet, RewardSettings, label_fault
from agentroll.rewards.components import graded
from agentroll.rewards.held import hold, needs_judging, release
from agentroll.rewards.options import RewardOptions
from agentroll.settings.shaping import LengthShaping
from agentroll.systems import System, builtin, load_system, vocabulary_of
from agentroll.systems.recorded import Rescoring

log = logging.getLogger("agentroll")


@dataclass
class RescoreResult:
    source: str
    output: str
    stats: RunStats = field(default_factory=RunStats)
    complete: bool = False
    failures: list[str] = field(default_factory=list)  # why each group not written was not (a judge's failure)


def asked(group: Group) -> Problem | None:
    """The group's row as the run gave it to its rewards: its prompt as given (the records' `problem`), label,
    metadata and id, so `Problem.statement` derives the statement as the run did. None for a folder written before
    schema 6, whose records do not hold the row's prompt."""
    first = group.executions[0][0] if group.executions and group.executions[0] else None
    if first is None or not first.problem:
        return None
    stored = group.problem
    return Problem(
        id=stored.id,
        prompt=first.problem,
        label=first.label,
        metadata=first.metadata,
        line=0,
        source=stored.source,
        content_hash=stored.content_hash,
    )


def system_of_folder(manifest: Manifest) -> System:
    """The folder's system: a built-in by name; a user's system loaded from its spec when it still loads, else
    the base `System` (each sample scored, the last one's the outcome), with a warning."""
    spec = manifest.settings.get("system") or {"name": "three-stage", "options": {}}
    name, options = str(spec.get("name", "three-stage")), dict(spec.get("options") or {})
    native = builtin(name)
    if native is not None:
        return native(**options)
    try:
        return load_system(name, options)
    except Exception as exc:  # a file moved, a module gone: the default rescoring still holds for most systems
        log.warning(
            "system %s does not load here (%s): rescoring it the default way (each sample scored, the last "
            "one's raw reward the outcome)",
            name,
            exc,
        )
        return System()


async def rescore(
    source: str | os.PathLike[str],
    output: str | os.PathLike[str],
    reward: str | RewardSettings,
    *,
    filter_uniform_groups: bool | None = None,
    overwrite: bool = False,
    shard_size: int = 1000,
    failed_only: bool = False,
) -> RescoreResult:
    """Rescore the folder `source` into `output` (see the module's docstring). `reward`: a spec, with every other
    reward setting at generate's defaults, or the whole `RewardSettings` (`RewardOptions.reward_settings()`, as the
    CLI passes them). `filter_uniform_groups` None keeps the source's setting; `overwrite` starts `output` over
    (as generate's does). `failed_only`: only the samples a judge gave no verdict (`--judge-failures keep`) are
    scored again, every other record copied as it is (a group without such a sample is copied whole). A group
    the judge fails again is not written (`complete` False: exit 8); a rerun asks only what still has no verdict."""
    src, out = Path(source), Path(output)
    if src.resolve() == out.resolve():
        raise UsageError(f"-o {out}: rescoring writes a new folder, not into its source")
    settings_of_rewards = RewardOptions(reward=reward).reward_settings() if isinstance(reward, str) else reward
    manifest = Manifest.load(src)
    if not manifest.complete:
        log.warning("%s: its run did not complete; only the groups on disk are rescored", src)
    settings = manifest.settings
    system = system_of_folder(manifest)
    uniform = bool(settings.get("filter_uniform_groups")) if filter_uniform_groups is None else filter_uniform_groups
    derived = {"folder": str(src.resolve()), "folder_id": manifest.folder_id, "reward": settings.get("reward")}
    new_settings = {
        **{k: v for k, v in settings.items() if k != "code_reward"},
        **settings_of_rewards.recorded(),
        "filter_uniform_groups": uniform,
        "resample_uniform": 0,
        "derived_from": derived,
    }
    length = LengthShaping(**settings["length_shaping"]) if settings.get("length_shaping") else LengthShaping()
    weights = (float(settings.get("correct_reward_weight", 1.0)), float(settings.get("incorrect_reward_weight", 1.0)))
    routes = bool(settings.get("return_routed_experts") or settings.get("return_sampling_mask"))  # sidecar read
    groups = read_groups(src, routes=routes)
    first = next(groups, None)  # checked before the output folder is touched, as generate's first row is
    if first is not None:
        _check_label(src, first, settings_of_rewards)
    rewards = RewardSet(settings_of_rewards)
    compression = str(settings.get("compression") or "none")
    from agentroll.folder import ShardWriter  # the writer only for a rescore: `import agentroll` reads, never writes

    writer = ShardWriter(out, new_settings, shard_size, overwrite=overwrite, compression=compression)
    result = RescoreResult(str(src), str(out))
    stats = result.stats
    stats.use_stages(tuple(settings.get("system", {}).get("stages") or ()) or system.stages, vocabulary_of(system))
    started, begun = time.monotonic(), time.time()
    try:
        done = writer.open()
    except BaseException:  # another run's folder, other settings: nothing scored, nothing left running
        await rewards.aclose()
        raise
    warned = False
    journal = Journal(Layout(out).journal, {"rescore": settings_of_rewards.recorded()})
    journal.open(done)
    try:
        for group in itertools.chain([first] if first is not None else [], groups):
            stats.problems += 1
            if done.get(group.problem.id) == group.problem.content_hash:
                stats.problems_skipped_done += 1
                continue
            _check_label(src, group, settings_of_rewards)
            problem = asked(group)
            if problem is None:
                problem = group.problem  # its prompt is the rendered solver prompt: said once
                if not warned:
                    warned = True
                    log.warning(
                        "%s was written before records kept the row's prompt (field problem, schema 6): the "
                        "rewards see the rendered solver prompt as request.problem and request.prompt",
                        src,
                    )
            if failed_only and not needs_judging(group.executions):
                scored = group  # nothing without a verdict: copied as it is
            else:
                release(group.executions)  # a group held back by a judge's failure: as it was, to be scored again
                try:
                    scored = await _group(group, problem, system, rewards, stats, weights, length, journal, failed_only)
                except JudgeFailed as exc:
                    stats.groups_failed += 1
                    result.failures.append(f"the judge gave no verdict for a {exc}")
                    journal.settle(group.problem.id, group.problem.content_hash, failed=True)
                    continue
                if hold(scored.executions):
                    stats.groups_held += 1
            held = needs_judging(scored.executions)  # its outcomes not all known: no filter judges it uniform yet
            if uniform and not held and len({s[0].final_reward for s in scored.executions}) <= 1:
                scored.status = "filtered"
                stats.groups_filtered += 1
            else:
                stats.groups_written += 1
                stats.records_written += scored.num_records
            for samples in scored.executions:
                stats.add_execution(samples)
            stats.compare(group.problem.id, scored.executions)  # a head-to-head folder: who won, rescored
            writer.commit(scored)
            journal.settle(group.problem.id, group.problem.content_hash)
        result.complete = not result.failures
    finally:
        journal.close()
        await rewards.aclose()
        writer.run_info = {
            "stats": stats.to_dict(),
            "wall_s": round(time.monotonic() - started, 3),
            "started_at": round(begun, 3),
            "finished_at": round(time.time(), 3),
        }
        writer.close(complete=result.complete)
    return result


def _check_label(src: Path, group: Group, settings: RewardSettings) -> None:
    """A group whose label the new reward (or a component of it) cannot score is a bad row (exit 3), as generate
    would call it: not a folder of zero rewards."""
    reward = settings.default
    faults = [label_fault(c.spec, group.problem.label) for c in settings.components] or [
        label_fault(reward, group.problem.label)
    ]
    fault = next((f for f in faults if f is not None), None)
    if fault is not None:
        raise InputError(str(src), 0, "label", f"problem {group.problem.id!r}: {fault} (--reward {reward})")


async def _group(
    group: Group,
    problem: Problem,
    system: System,
    rewards: RewardSet,
    stats: RunStats,
    weights: tuple[float, float],
    length: LengthShaping,
    journal: Journal | None = None,
    failed_only: bool = False,
) -> Group:
    """The group's executions rescored side by side (a group judge sees them together)."""

    async def one(samples: list[Sample]) -> None:
        for sample in samples:  # the run's length shaping is applied again below: its notes go first
            sample.reward_info = length.unnoted(sample.reward_info)
        together = len(group.executions)
        execution = Rescoring(
            samples, rewards, stats, problem, weights, journal=journal, together=together, failed_only=failed_only
        )
        await system.rescore(execution)
        rewards.leave((problem.id, problem.content_hash), 0, execution.reward_calls, together)
        if execution.final_reward is None:
            raise UsageError(f"system {system.name}'s rescore set no outcome (final_reward)")
        for sample in samples:
            sample.final_reward = execution.final_reward
        if length.active:
            length.apply(samples)

    await gather_or_cancel(*(one(samples) for samples in group.executions))
    finals = [e[0].final_reward for e in group.executions]
    annotate(group.executions, finals, stats.vocabulary, graded(rewards.settings.components))
    return group


def result_dict(result: RescoreResult) -> dict[str, Any]:
    return {
        "source": result.source,
        "output": result.output,
        "complete": result.complete,
        "stats": asdict(result.stats),
    }
