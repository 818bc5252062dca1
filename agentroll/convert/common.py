"""Shared by every converter: a folder read as (problem, stage) groups, GRPO baselines (over conversations, as
`agentroll.record.group` defines them) and atomic JSONL output (the chat messages behind a rendered prompt, for the
conversational layouts, are `convert.messages`'). Stage names and their order are the folder's system's
(`settings.system.stages`; a folder without one is three-stage)."""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import UsageError
from ..folder.manifest import Manifest
from ..record.group import conversation_reward, conversations, policy_groups, stage_groups
from ..record.schema import STAGES
from ..settings.shaping import dropped
from .trajectory import Trajectory, executions, kept, single, trajectories

ADVANTAGES = ("none", "grpo", "mean")
STDS = ("sample", "population")
LAYOUTS = ("conversational", "standard")

Record = dict[str, Any]


@dataclass(slots=True)
class StageGroup:
    """The samples of one stage of one problem over its K executions: the GRPO group, whose advantages are over its
    conversations (`conversation_advantages`). The solver samples of K executions are one group, the rewriter
    samples another; `advantages` is aligned with `records` (each its conversation's), and so is
    `trajectories` when the converter asked for whole conversations (each record the last turn of its own)."""

    problem_id: str
    stage: str
    records: list[Record]
    advantages: list[float] | None = None
    trajectories: list[Trajectory] | None = None
    policy: str | None = None  # a head-to-head folder: each policy's samples are a group of their own

    @property
    def name(self) -> str:
        """The group's name in a trainer's format: "problem_id/stage" ("problem_id/policy/stage" in a
        head-to-head folder)."""
        return group_name(self.records[0]) if self.records else f"{self.problem_id}/{self.stage}"

    def items(self, include_frozen: bool = False) -> list[tuple[Record, Trajectory, float | None]]:
        """(record, its trajectory, its advantage) per sample: the whole conversation the record ends when the
        group was read with whole conversations, else the call alone (`trajectory.single`)."""
        return [
            (
                record,
                self.trajectories[i] if self.trajectories is not None else single(record, include_frozen),
                None if self.advantages is None else self.advantages[i],
            )
            for i, record in enumerate(self.records)
        ]


@dataclass(slots=True)
class Problem:
    """One problem's stage groups (only the stages asked for, in pipeline order) and its ordinal in the folder."""

    index: int
    problem_id: str
    groups: list[StageGroup] = field(default_factory=list)


def group_name(record: Record) -> str:
    """The (problem, stage) group a record belongs to, as a trainer's group id: "problem_id/stage", or
    "problem_id/policy/stage" for a record of a head-to-head run (`generate --policy`): a baseline never mixes
    two models' samples."""
    policy = record.get("policy")
    middle = f"/{policy}" if policy is not None else ""
    return f"{record['problem_id']}{middle}/{record['stage']}"


def policy_of(record: Record) -> dict[str, str]:
    """A head-to-head record's `policy`, for a row that keeps where it came from (none for a run of one model:
    its rows are as they were)."""
    policy = record.get("policy")
    return {} if policy is None else {"policy": policy}


def baseline(rewards: list[float], std: str = "population") -> tuple[float, float]:
    """Mean and standard deviation: `population` (divisor n, as `group_reward_std` in the records and Megatron's
    `np.std`) or `sample` (divisor n - 1, Bessel's: `torch.std`, as slime, TRL, verl, OpenRLHF, SkyRL and NeMo-RL
    use it; 0 for a group of one, whose spread is unknown)."""
    n = len(rewards)
    mean = math.fsum(rewards) / n
    squares = math.fsum((r - mean) ** 2 for r in rewards)
    if std == "sample":
        return mean, math.sqrt(squares / (n - 1)) if n > 1 else 0.0
    return mean, math.sqrt(squares / n)


def advantages(rewards: list[float], kind: str, std: str = "population", epsilon: float = 0.0) -> list[float] | None:
    """`grpo`: (reward - mean) / (std + `epsilon`) (`std`: `population` or `sample`, see `baseline`; `epsilon`:
    the trainer's own damping, so the advantage is the one its GRPO would compute), or reward - mean when the std
    is 0 (every sample scored alike, or a group of one: all 0); `mean`: reward - mean (no std division, as in
    Dr. GRPO); `none`: None."""
    if kind == "none":
        return None
    mean, spread = baseline(rewards, std)
    if kind == "grpo" and spread > 0:
        return [(r - mean) / (spread + epsilon) for r in rewards]
    return [r - mean for r in rewards]


def check_stages(
    stages: Iterable[str] | str | None, system_stages: tuple[str, ...] | None = STAGES
) -> tuple[str, ...] | None:
    """`--stages solver,rewriter` as a tuple in the system's stage order (`system_stages`, the manifest's; None:
    a system that names none, whose stages are taken as given); None (every stage) when not given."""
    if stages is None:
        return system_stages
    names = [s.strip() for s in (stages.split(",") if isinstance(stages, str) else stages)]
    unknown = [s for s in names if system_stages is not None and s not in system_stages]
    if unknown or not names or not all(names):
        subset = f"subset of {', '.join(system_stages)}" if system_stages is not None else "list of stage names"
        raise UsageError(f"--stages takes a comma-separated {subset}, not {','.join(names)!r}")
    if system_stages is None:
        return tuple(dict.fromkeys(names))
    return tuple(s for s in system_stages if s in names)


def read_problems(
    src: Path,
    stages: tuple[str, ...] | None,
    advantage: str,
    counts: dict[str, int],
    *,
    include_frozen: bool = True,
    whole_conversations: bool = False,
    std: str = "population",
    routes: bool = False,
    policy: str | None = None,
    whole_stage: bool = False,
    epsilon: float = 0.0,
) -> Iterator[Problem]:
    """The folder's problems in manifest order (whole groups, by `agentroll.read_groups`), each split
    into stage groups (`stages` in order; None: every stage, as first seen). Baselines are computed over the
    whole stage group before anything is filtered out, so `--stages` or a converter's own filter never changes
    another sample's advantage. `counts["records"]` counts what was read.

    A group held back by a judge's failure (a record whose `judge.failed` is set) is left out whole, in every
    format (`counts["held_by_judge"]`). Unless `include_frozen`, records marked `trainable: false` are left out
    after the baselines (`counts["skipped_frozen"]`); those the overlong filter dropped always are
    (`counts["dropped_overlong"]`). With `whole_conversations`, a group keeps only the records that end a
    conversation, each with its `Trajectory` (`convert.trajectory`); the turns folded into a later one are
    counted in `counts["folded_turns"]`. `std`: the standard deviation of `--advantage grpo`, `epsilon` its damping.
    `routes`: records' `routed_experts` as arrays (`read_groups(routes=True)`). In a head-to-head folder each
    policy's samples of a stage are a group of their own (baselines too); `policy` keeps only that policy's
    records. The advantages are per conversation (`conversation_advantages`; `whole_stage`: the system's
    vocabulary's)."""
    from ..folder import read_groups

    counts.setdefault("records", 0)
    if not include_frozen:
        counts.setdefault("skipped_frozen", 0)
    if whole_conversations:
        counts.setdefault("folded_turns", 0)
    for index, group in enumerate(read_groups(src, routes=routes)):
        records = group.records() if not routes else _with_routes(group)
        if policy is not None:
            records = [r for r in records if r.get("policy") == policy]
        counts["records"] += len(records)
        if any(isinstance(r.get("judge"), dict) and r["judge"].get("failed") is not None for r in records):
            # --judge-failures keep: a sample has no verdict, so the group's outcomes (its baseline, its pairs)
            # are not known; no format takes it, frozen or not, until `rescore --failed-only` releases it
            counts["held_by_judge"] = counts.get("held_by_judge", 0) + len(records)
            continue
        ends: dict[int, Trajectory] = {}
        if whole_conversations:
            for execution in executions(records):
                try:
                    found = trajectories(execution, include_frozen)
                except ValueError as exc:
                    raise UsageError(f"{src}: problem {group.problem_id}: {exc} (run agentroll validate)") from None
                ends.update((id(t.record), t) for t in found)
        problem = Problem(index, group.problem_id)
        given = conversation_advantages(records, advantage, std, whole_stage, epsilon)
        named = dict.fromkeys(r.get("policy") for r in records)
        for stage, own in (
            (stage, own)
            for stage in (stages if stages is not None else dict.fromkeys(r["stage"] for r in records))
            for own in named
        ):
            members = [r for r in records if r["stage"] == stage and r.get("policy") == own]
            if not members:
                continue
            found_advantages = None if given is None else [given[id(r)] for r in members]
            keep = [i for i, r in enumerate(members) if kept(r, include_frozen)]
            cut = sum(map(dropped, members))
            if cut:
                counts["dropped_overlong"] = counts.get("dropped_overlong", 0) + cut
            if not include_frozen:
                counts["skipped_frozen"] += len(members) - len(keep) - cut
            if whole_conversations:
                counts["folded_turns"] += sum(id(members[i]) not in ends for i in keep)
                keep = [i for i in keep if id(members[i]) in ends]
            if not keep:
                continue
            problem.groups.append(
                StageGroup(
                    group.problem_id,
                    stage,
                    [members[i] for i in keep],
                    None if found_advantages is None else [found_advantages[i] for i in keep],
                    [ends[id(members[i])] for i in keep] if whole_conversations else None,
                    own,
                )
            )
        counts["split_conversations"] = counts.get("split_conversations", 0) + split(records, problem, whole_stage)
        yield problem


def split(records: list[Record], problem: Problem, whole_stage: bool) -> int:
    """The group's conversations (`agentroll.record.group`'s: an agent's execution, its branches included) written as
    more than one row: a trainer that takes its baseline over the rows of a group id counts each once per row."""
    written = {id(r) for g in problem.groups for r in g.records}
    return sum(
        sum(id(execution[i]) in written for i in positions) > 1
        for execution in executions(records)
        for positions in conversations(execution, whole_stage)
    )


def conversation_advantages(
    records: list[Record], kind: str, std: str = "population", whole_stage: bool = False, epsilon: float = 0.0
) -> dict[int, float] | None:
    """Each record's advantage (by `id`), or None for `none`: per (policy, stage), over the group's
    conversations (`agentroll.record.group`: each conversation's reward is its last record's), every record of one
    conversation carrying its conversation's. A three-stage group's conversations are its calls (the
    per-stage baselines); a tool-use or agent group's are its K executions' conversations, however many calls
    each made, so an execution's weight in the baseline does not grow with its calls."""
    if kind == "none":
        return None
    out: dict[int, float] = {}
    for own in policy_groups(list(executions(records))).values():
        for chats in stage_groups(own, whole_stage).values():
            found = advantages([conversation_reward(c) for c in chats], kind, std, epsilon)
            for chat, value in zip(chats, found or [], strict=True):
                out.update((id(r), value) for r in chat)
    return out


def _with_routes(group: Any) -> list[Record]:
    """The group's records as dicts that keep each sample's `routed_experts` array (`Group.records()` goes through
    JSON, which has no arrays)."""
    records = []
    for samples in group.executions:
        for sample in samples:
            routes = sample.routed_experts
            if routes is not None and not hasattr(routes, "shape"):
                routes = None  # routes that could not be resolved as an array are not carried
            sample.routed_experts = None
            try:
                record = orjson.loads(orjson.dumps(sample))
            finally:
                sample.routed_experts = routes
            record["routed_experts"] = routes
            records.append(record)
    return records


def check_source(src: Path, out: Path) -> Manifest:
    """The source folder's manifest (a broken or missing one is one `OutputError` line); a `UsageError` when
    the output folder is the source itself."""
    manifest = Manifest.load(src)
    if out.resolve() == src.resolve():
        raise UsageError(f"-o {out}: the output folder cannot be the source folder")
    return manifest


def _ours(out: Path, names: list[str], stale: str | None) -> list[Path]:
    """The format's files (and folders) in OUT: its `names`, and any name matching `stale`."""
    if not out.is_dir():
        return []
    return [p for p in out.iterdir() if p.name in names or (stale and re.fullmatch(stale, p.name))]


def _remove(paths: list[Path]) -> None:
    for path in paths:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def prepare_out(out: Path, names: list[str], stale: str | None, overwrite: bool) -> list[Path]:
    """Creates OUT and returns the folders it created, OUT's missing parents first (for `discard`). Our own
    files already there are refused unless `overwrite`, which deletes them first (and any file matching `stale`,
    e.g. a slime file of an earlier, longer conversion): checked before anything is created."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"-o {out}: exists and is not a folder")
    present = _ours(out, names, stale)
    if present and not overwrite:
        raise UsageError(f"-o {out}: already holds {present[0].name} (pass --overwrite to replace it)")
    created = [p for p in reversed([out, *out.absolute().parents]) if not p.exists()]
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        discard(out, [], None, created)
        raise UsageError(f"-o {out}: {exc.strerror or exc}") from None
    _remove(present)
    return created


def discard(out: Path, names: list[str], stale: str | None, created: list[Path]) -> None:
    """Undoes a conversion refused while reading (a prompt the conversational layout cannot recover, a broken
    conversation): the format's files in OUT, which `prepare_out` left none of, so this run wrote them (a
    slime or prime-rl step already flushed), then the folders it created, deepest first, while empty. Nothing
    else in OUT is touched."""
    _remove(_ours(out, names, stale))
    for path in reversed(created):
        try:
            path.rmdir()
        except OSError:
            return


class JsonlWriter:
    """Rows to `path` through a temporary file renamed into place on success, so a file there is whole."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tmp = path.with_name(f".{path.name}.tmp")
        self.rows = 0
        self._f = open(self.tmp, "wb")  # noqa: SIM115 (closed by __exit__)

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(orjson.dumps(row) + b"\n")
        self.rows += 1

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        self._f.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            self.tmp.unlink(missing_ok=True)
