"""The unit of work: a problem's K executions, produced, judged and written together or not at all; and the one
definition of the group's figures (outcomes, pass@k, baselines over conversations) that every tool and
converter reads."""

from __future__ import annotations

import math
from collections.abc import Sequence
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


# -- the group's figures: one definition, read by the records, `stats`, `validate`, `inspect`, the viewer and every
# converter that writes a baseline or an advantage ---------------------------------------------------------------
#
# A group is a problem's K executions (each policy's K, in a head-to-head run: figures never mix two models). An
# execution's outcome is its `final_reward`; the group's mean, std and pass@k are over its K outcomes. A baseline
# (GRPO's group) is per (problem, policy, stage) and over *conversations*, never over calls: a conversation is a
# stage's records of one execution chained by `continues` (a one-call stage: each call; tool use: the solver's
# turns), or, for a system whose vocabulary says `whole_stage` (the agent), the stage's whole share of the
# execution (its branches included). Its reward is its last record's shaped `reward`; each of its records carries
# its advantage, so an execution that makes more calls weighs no more than another.

Item = Any  # a `Sample`, or a record as a dict (what the converters read)


def value(item: Item, name: str) -> Any:
    """A field of a sample or of a record read as a dict."""
    return item.get(name) if isinstance(item, dict) else getattr(item, name)


def policy_groups(executions: Sequence[Sequence[Item]]) -> dict[str | None, list[Sequence[Item]]]:
    """The executions per policy, in order (one key, None, outside a head-to-head run): each is a group."""
    out: dict[str | None, list[Sequence[Item]]] = {}
    for samples in executions:
        out.setdefault(value(samples[0], "policy") if samples else None, []).append(samples)
    return out


def outcome(execution: Sequence[Item]) -> float:
    """An execution's outcome: its `final_reward` (every record of it holds the same)."""
    return float(value(execution[0], "final_reward"))


def spread(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (divisor n), as the records hold them."""
    mean = math.fsum(values) / len(values)
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def graded(outcomes: Sequence[float]) -> bool:
    """Outcomes on the 0..1 scale where 1 is solved. Reward components weighted to more than 1 (or a penalty
    below 0) leave it: 1 is then no pass, and a pass@k of them would be a wrong 0 rather than none."""
    return all(0.0 <= o <= 1.0 for o in outcomes)


def pass_at_all(outcomes: Sequence[float], pass_fail: bool = True) -> float | None:
    """1 if some execution's outcome is 1 (solved), else 0; None for a system whose outcome is not pass/fail,
    or outcomes off the 0..1 scale (`graded`)."""
    return float(any(o == 1.0 for o in outcomes)) if pass_fail and graded(outcomes) else None


def conversations(execution: Sequence[Item], whole_stage: bool = False) -> list[list[int]]:
    """The positions of an execution's records, one list per conversation (see above), in write order. A
    `continues` that names no earlier record of the same stage links nothing (`validate` reports it)."""
    root: list[int] = []
    first: dict[str, int] = {}
    for i, item in enumerate(execution):
        stage = value(item, "stage")
        parent = value(item, "continues")
        if whole_stage:
            root.append(first.setdefault(stage, i))
        elif type(parent) is int and 0 <= parent < i and value(execution[parent], "stage") == stage:
            root.append(root[parent])
        else:
            root.append(i)
    found: dict[int, list[int]] = {}
    for i, r in enumerate(root):
        found.setdefault(r, []).append(i)
    return list(found.values())


def stage_groups(executions: Sequence[Sequence[Item]], whole_stage: bool = False) -> dict[str, list[list[Item]]]:
    """One group's (one policy's K executions') conversations per stage, in order: GRPO's groups."""
    out: dict[str, list[list[Item]]] = {}
    for samples in executions:
        for positions in conversations(samples, whole_stage):
            out.setdefault(value(samples[positions[0]], "stage"), []).append([samples[j] for j in positions])
    return out


def conversation_reward(members: Sequence[Item]) -> float:
    """A conversation's reward: its last record's shaped `reward` (what it ended on)."""
    return float(value(members[-1], "reward"))


def annotate(executions: list[list[Sample]], finals: list[float], words: Any = None, scale: bool = True) -> None:
    """The group's figures on every record (`group_*`, over the executions' outcomes, and `stage_group_*`, over
    the stage's conversations), per policy. They describe exactly the executions written, since a group is only
    ever written whole. `words`: the system's `Vocabulary` (its `whole_stage` and `pass_fail`); `scale` False:
    the run's outcomes are off the 0..1 scale (`rewards.components.graded`), so no pass@k."""
    whole_stage = getattr(words, "whole_stage", False)
    pass_fail = getattr(words, "pass_fail", True) and scale
    outcomes = {id(samples): final for samples, final in zip(executions, finals, strict=True)}
    for members in policy_groups(executions).values():
        mine = [outcomes[id(samples)] for samples in members]
        mean, std = spread(mine)
        passed = pass_at_all(mine, pass_fail)
        for samples in members:
            for sample in samples:
                sample.group_reward_mean, sample.group_reward_std, sample.group_pass_at_k = mean, std, passed
        for chats in stage_groups(members, whole_stage).values():
            stage_mean, stage_std = spread([conversation_reward(c) for c in chats])
            for chat in chats:
                for sample in chat:
                    sample.stage_group_size = len(chats)
                    sample.stage_group_reward_mean, sample.stage_group_reward_std = stage_mean, stage_std
