"""The unit of work: a problem's K executions, produced, judged and written together or not at all."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

from agentroll.inputs import Problem
from agentroll.record.schema import Sample

GroupStatus = Literal["complete", "filtered", "failed", "invalid"]


@dataclass(slots=True)
class Group:
    """What `Generator.run_group` gives back.

    `status`: `complete` (all K executions, figures set: the writer commits it), `filtered` (uniform outcomes
    under --filter-uniform-groups: kept out of the data, remembered as done), `failed` (some call or render
    failed for good, so the group is not whole: nothing is written and a rerun redoes it) or `invalid` (the
    row itself cannot be run, e.g. the chat template rejects it). `error` says why for the last two.
    """

    problem: Problem
    executions: list[list[Sample]]
    status: GroupStatus = "complete"
    error: str | None = None
    attempts: int = 1  # group runs made: 1 + resamples of a uniform group
    # the InputError of an invalid group, the ExecutionFailed of a failed one
    cause: BaseException | None = field(default=None, repr=False)

    @property
    def rerun_helps(self) -> bool:
        """False for a failed group that a rerun fails again (`ExecutionFailed.rerun_helps`)."""
        return getattr(self.cause, "rerun_helps", True) is not False

    @property
    def problem_id(self) -> str:
        return self.problem.id

    @property
    def ok(self) -> bool:
        return self.status == "complete"

    def records(self) -> list[dict[str, Any]]:
        """The group's records as the JSONL lines a shard holds, as dicts, in write order."""
        return [orjson.loads(line) for line in self.encode().splitlines()]

    def encode(self) -> bytes:
        """The JSONL block the writer appends in one write."""
        return b"".join(orjson.dumps(s) + b"\n" for samples in self.executions for s in samples)

    @property
    def num_records(self) -> int:
        return sum(len(e) for e in self.executions)


def annotate(executions: list[list[Sample]], finals: list[float]) -> None:
    """Per-group figures on every record: mean and std of the executions' final rewards, solver pass@k, and the
    (problem, stage) GRPO baselines. They describe exactly the executions written, since a group is only ever
    written whole. In a head-to-head run (`policy` set) each policy's K executions are a group of their own here:
    a baseline never mixes two models' samples."""
    by_policy: dict[str | None, tuple[list[list[Sample]], list[float]]] = {}
    for samples, final in zip(executions, finals, strict=True):
        mine = by_policy.setdefault(samples[0].policy if samples else None, ([], []))
        mine[0].append(samples)
        mine[1].append(final)
    for members, outcomes in by_policy.values():
        _annotate(members, outcomes)


def _annotate(executions: list[list[Sample]], finals: list[float]) -> None:
    mean = sum(finals) / len(finals)
    std = (sum((f - mean) ** 2 for f in finals) / len(finals)) ** 0.5
    passed = float(any(s.raw_reward == 1.0 for e in executions for s in e if s.stage == "solver"))
    by_stage: dict[str, list[Sample]] = {}
    for samples in executions:
        for sample in samples:
            sample.group_reward_mean, sample.group_reward_std, sample.group_pass_at_k = mean, std, passed
            by_stage.setdefault(sample.stage, []).append(sample)
    for members in by_stage.values():  # GRPO baselines are per (problem, stage): solvers are not rewriters
        rewards = [s.reward for s in members]
        stage_mean = sum(rewards) / len(rewards)
        stage_std = (sum((r - stage_mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
        for sample in members:
            sample.stage_group_size = len(members)
            sample.stage_group_reward_mean, sample.stage_group_reward_std = stage_mean, stage_std
