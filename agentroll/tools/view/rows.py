"""A group as one row of the viewer's list: what a person sorts and filters on, in its system's words.

The words are the folder's system's, as for `stats`, `report` and `inspect`: its report figures (one counter
over another) computed over the group's executions, each under its label; the labels of its charts' counts
(three-stage: "candidate right, pick wrong") for each execution that tallies them; its own checks
(`Vocabulary.check`) over each whole execution. Nothing here names a stage.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...folder.places import Place
from ...record.group import Group, outcome, spread
from ...record.schema import Sample
from ...record.stats import Figure, RunStats
from ...systems.vocabulary import Finding, Vocabulary
from ..system import SystemInfo, system_of, words

META_TEXT = 80  # characters of a metadata string kept in a row (the group view has it whole)


@dataclass(frozen=True, slots=True)
class Words:
    """The folder's system as the viewer asks it: its stages, vocabulary, and the labels its charts count."""

    info: SystemInfo
    vocabulary: Vocabulary
    warning: str | None
    tags: tuple[tuple[str, str], ...]  # (label, counter) of each chart's counts

    @classmethod
    def of(cls, manifest: Any) -> Words:
        info = system_of(manifest)
        vocabulary, warning = words(info, warn=False)
        tags = tuple((label, counter) for chart in vocabulary.charts for label, counter in chart.counts)
        return cls(info, vocabulary, warning, tags)

    def run(self, stages: Iterable[str] = ()) -> RunStats:
        """Counters ready for executions: the system's stages (then any other seen), its vocabulary."""
        run = RunStats()
        run.use_stages(self.info.ordered([*(self.info.stages or ()), *stages]), self.vocabulary)
        return run

    def figures(self, run: RunStats) -> list[Figure]:
        return run.report_figures()

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.info.name,
            "stages": list(self.info.stages or ()),
            "figures": [{"key": f.key, "label": f.label} for f in self.figures(self.run())],
            "tags": [label for label, _ in self.tags],
            "warning": self.warning,
        }

    def tags_of(self, tally: dict[str, float]) -> list[str]:
        return [label for label, counter in self.tags if tally.get(counter)]

    def check(self, samples: list[Sample]) -> list[Finding]:
        """The system's findings on a whole execution (one that is not whole has its own finding)."""
        if len(samples) != samples[0].rollout_size:
            return [Finding(0, f"{len(samples)} records where rollout_size says {samples[0].rollout_size}")]
        try:
            return list(self.vocabulary.check(samples))
        except Exception as exc:  # a user's check: said where it happened
            return [Finding(0, f"the system's check raised {type(exc).__name__}: {exc}")]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _scalar(value: Any) -> Any:
    if isinstance(value, str):
        return value if len(value) <= META_TEXT else value[: META_TEXT - 1] + "…"
    if value is None or isinstance(value, bool | int | float):
        return value
    return None


def gap(student: Any, teacher: Any, mask: Any = None) -> list[float] | None:
    """|student - teacher| per response token (None: no teacher logprobs, or not one per token)."""
    if not isinstance(teacher, list) or not isinstance(student, list) or len(teacher) != len(student):
        return None
    out = []
    for i, (a, b) in enumerate(zip(student, teacher, strict=True)):
        if isinstance(mask, list) and i < len(mask) and not mask[i]:
            continue
        if isinstance(a, int | float) and isinstance(b, int | float) and math.isfinite(a) and math.isfinite(b):
            out.append(abs(a - b))
    return out


def execution_policies(records: list[dict[str, Any]]) -> list[str | None]:
    """The `policy` of each execution (a head-to-head run's records name theirs; None elsewhere)."""
    out: list[str | None] = []
    last = object()
    for r in records:
        if r.get("rollout_id") != last:
            last = r.get("rollout_id")
            policy = r.get("policy")
            out.append(None if policy is None else str(policy))
    return out


def row(number: int, place: Place, shard: int, records: list[dict[str, Any]], group: Group, w: Words) -> dict:
    """The list's row of one group (see the module's docstring)."""
    run = w.run(s.stage for e in group.executions for s in e)
    tags: dict[str, int] = {}
    findings = []
    for samples in group.executions:
        run.add_execution(samples)
        for label in w.tags_of(dict(w.vocabulary.tally(samples))):
            tags[label] = tags.get(label, 0) + 1
        findings += [f.message for f in w.check(samples)]
    stages = {name: [s.samples, s.truncated, s.mean_raw_reward] for name, s in run.stages.items() if s.samples}
    finals = [e[0].final_reward for e in group.executions]
    mean, std = spread(finals)  # the group's (`agentroll.record.group`); a head-to-head row's are its policies
    lengths = [len(r.get("response_token_ids") or ()) for r in records]
    first = records[0]
    out: dict[str, Any] = {
        "n": number,
        "id": str(first.get("problem_id")),
        "shard": shard,
        "line": place.line,
        "k": len(group.executions),
        "records": len(records),
        "mean": mean,
        "std": std,
        "finals": finals,
        "figures": {f.key: run.figure(f) for f in w.figures(run)},
        "tags": tags,
        "stages": stages,
        "truncated": sum(s[1] for s in stages.values()),
        "checks": len(findings),
        "check": findings[0] if findings else None,
        "meta": {k: v for k, v in (first.get("metadata") or {}).items() if _scalar(v) is not None},
        "tokens": sum(lengths),
        "longest": max(lengths, default=0),
        "pass": solved(group.executions),
        "finish": sorted({str(r.get("finish_reason")) for r in records}),
    }
    out["meta"] = {k: _scalar(v) for k, v in out["meta"].items()}
    policies = execution_policies(records)
    if any(p is not None for p in policies):
        out["policies"] = policies
        out["by_policy"] = {str(name): _policy(group, policies, name, w) for name in dict.fromkeys(policies)}
        # each policy's own (its group's mean and std too), never the two models' pooled
        out["figures"], out["pass"], out["mean"], out["std"] = {}, [0, 0], None, None
    gaps = [g for r in records for g in gap(r.get("response_logprobs"), r.get("teacher_logprobs")) or ()]
    if gaps:
        out["teacher"] = {"mean": sum(gaps) / len(gaps), "max": max(gaps)}
    return out


def _policy(group: Group, policies: list[str | None], name: str | None, w: Words) -> dict[str, Any]:
    """A head-to-head run's figures of one policy's executions in the group: the system's, its mean final
    reward and their std (its group's, `agentroll.record.group`), its executions solved."""
    mine = [samples for samples, p in zip(group.executions, policies, strict=True) if p == name]
    run = w.run(s.stage for e in mine for s in e)
    for samples in mine:
        run.add_execution(samples)
    mean, std = spread([outcome(e) for e in mine])
    return {
        "mean": mean,
        "std": std,
        "figures": {f.key: run.figure(f) for f in w.figures(run)},
        "pass": solved(mine),
    }


def solved(executions: list[list[Sample]]) -> list[int]:
    """[executions, those solved]: the outcomes pass@k is over (`agentroll.record.group`)."""
    outcomes = [outcome(e) for e in executions if e]
    return [len(outcomes), sum(o == 1.0 for o in outcomes)]


def broken(number: int, place: Place, shard: int, records: list[dict[str, Any]], why: str) -> dict[str, Any]:
    """The row of a group whose records are not all of the schema: listed, flagged, openable as raw JSON."""
    first = records[0] if records else {}
    return {
        "n": number,
        "id": str(first.get("problem_id")),
        "shard": shard,
        "line": place.line,
        "k": len({r.get("rollout_id") for r in records}),
        "records": len(records),
        "mean": _number(first.get("group_reward_mean")),
        "std": _number(first.get("group_reward_std")),
        "finals": [],
        "figures": {},
        "tags": {},
        "stages": {},
        "truncated": 0,
        "checks": 1,
        "check": f"not records of the schema: {why}",
        "meta": {},
        "tokens": 0,
        "longest": 0,
        "pass": [0, 0],
        "finish": [],
        "broken": True,
    }
