"""Executions and groups, for `validate`: what holds for every system (consecutive records of one rollout, one
problem, one `final_reward`, the system's stage order; whole groups whose figures describe them), and then the
system's own checks (its vocabulary's `check`) on each whole execution of well-formed records."""

from __future__ import annotations

import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..record.group import pass_at_all, spread
from ..record.schema import Sample
from ..systems.vocabulary import Vocabulary
from .system import LEGACY, SystemInfo, words

Add = Callable[[int, str, str], None]  # (line, kind, message)
_TOLERANCE = 1e-9


def _int(v: Any) -> int | None:
    return v if type(v) is int else None


def _num(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) else None


@dataclass(slots=True)
class Row:
    """The few fields of a record that execution and group checks need (a shard's records are not kept)."""

    line: int
    problem_id: Any
    problem_hash: Any
    rollout_id: Any
    group_size: int | None
    rollout_size: int | None
    sample_index: int | None
    stage: Any
    raw_reward: float | None
    final_reward: float | None
    figures: tuple[float | None, float | None, float | None]  # group_reward_mean, _std, group_pass_at_k
    policy: Any = None  # a head-to-head run's policy

    @classmethod
    def of(cls, line: int, r: dict[str, Any]) -> Row:
        return cls(
            line,
            r.get("problem_id"),
            r.get("problem_hash"),
            r.get("rollout_id"),
            _int(r.get("group_size")),
            _int(r.get("rollout_size")),
            _int(r.get("sample_index")),
            r.get("stage"),
            _num(r.get("raw_reward")),
            _num(r.get("final_reward")),
            (_num(r.get("group_reward_mean")), _num(r.get("group_reward_std")), _num(r.get("group_pass_at_k"))),
            r.get("policy"),
        )


def _close(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=_TOLERANCE, abs_tol=_TOLERANCE)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def _lines(rows: list[Row]) -> str:
    return f"lines {rows[0].line}-{rows[-1].line}" if len(rows) > 1 else f"line {rows[0].line}"


def _check_execution(rows: list[Row], add: Add, system: SystemInfo) -> None:
    head = rows[0]
    rid = str(head.rollout_id)[:12]
    if head.rollout_size is not None and head.rollout_size != len(rows):
        add(
            head.line,
            "execution",
            f"execution {rid} ({_lines(rows)}) has {_count(len(rows), 'consecutive record')}, "
            f"its rollout_size says {head.rollout_size}",
        )
    for name in ("problem_id", "problem_hash", "sample_index", "group_size", "rollout_size", "final_reward", "policy"):
        other = next((r for r in rows if getattr(r, name) != getattr(head, name)), None)
        if other is not None:
            add(
                other.line,
                "execution",
                f"{name} {getattr(other, name)!r} differs from {getattr(head, name)!r} "
                f"at line {head.line}, in execution {rid}",
            )
    order = system.stages
    if order is not None:
        rank = {stage: i for i, stage in enumerate(order)}
        previous = 0
        for r in rows:
            now = rank.get(r.stage, previous)
            if now < previous:
                said = f"the {system.name} system's stage order is {', '.join(order)}"
                add(r.line, "execution", f"a {r.stage} record after a {order[previous]} in execution {rid} ({said})")
                break
            previous = now


def _check_group(
    execs: list[list[Row]], k_setting: int | None, add: Add, system: SystemInfo, policies: tuple[str, ...] = ()
) -> None:
    head = execs[0][0]
    pid = head.problem_id
    rows = [r for e in execs for r in e]
    k = head.group_size
    if k is not None and len(execs) != k:
        add(
            head.line,
            "group",
            f"problem {pid!r} has {_count(len(execs), 'consecutive execution')} ({_lines(rows)}), "
            f"its group_size says {k}",
        )
    if k is not None and k_setting is not None and k != k_setting:
        add(head.line, "group", f"group_size {k} where the manifest's settings make groups of {k_setting}")
    indexes = [e[0].sample_index for e in execs]
    if k is not None and len(execs) == k and sorted(i for i in indexes if i is not None) != list(range(k)):
        add(head.line, "group", f"problem {pid!r} has executions with sample_index {indexes}, expected 0..{k - 1}")
    other = next((e[0] for e in execs if e[0].problem_hash != head.problem_hash), None)
    if other is not None:
        add(
            other.line,
            "group",
            f"problem_hash {other.problem_hash!r} differs from {head.problem_hash!r} at line "
            f"{head.line}, in the group of problem {pid!r}",
        )
    if k is None or len(execs) != k:
        return  # not a whole group (reported above): its figures cannot describe it
    if not _check_policies(execs, k, add, policies):
        return
    by_policy: dict[Any, list[list[Row]]] = {}
    for e in execs:  # a head-to-head run: each policy's executions are a group of their own for the figures
        by_policy.setdefault(e[0].policy, []).append(e)
    sizes = {policy: len(members) for policy, members in by_policy.items()}
    if len(set(sizes.values())) > 1:
        said = ", ".join(f"{policy} {n}" for policy, n in sizes.items())
        add(head.line, "group", f"problem {pid!r} has its policies' executions in unequal numbers ({said})")
        return
    for members in by_policy.values():
        _check_figures(members, add, system)


def _check_policies(execs: list[list[Row]], k: int, add: Add, policies: tuple[str, ...]) -> bool:
    """Each execution's policy is the one its `sample_index` says (a head-to-head run numbers the i-th policy's
    executions i*K..i*K+K-1); a folder of one model has none. False: the figures cannot be checked by policy."""
    for e in execs:
        head = e[0]
        index = head.sample_index
        if not policies:
            want = None
        elif k % len(policies) or index is None or not 0 <= index < k:
            return True  # said above (the group's size or its indexes): the policy cannot be told
        else:
            want = policies[index // (k // len(policies))]
        if head.policy != want:
            whose = f"policy {want!r}'s" if want is not None else "of a run of one model (no policy)"
            add(
                head.line,
                "group",
                f"problem {head.problem_id!r}: execution {index} is {whose}, its records say policy {head.policy!r}",
            )
            return False
    return True


def _check_figures(execs: list[list[Row]], add: Add, system: SystemInfo) -> None:
    rows = [r for e in execs for r in e]
    finals = [e[0].final_reward for e in execs]
    if any(f is None for f in finals) or any(r.raw_reward is None for r in rows):
        return  # a type fault is already reported; figures cannot be recomputed
    fs = typing.cast(list[float], finals)
    mean, std = spread(fs)
    pass_fail = words(system, warn=False)[0].pass_fail and system.graded
    passed = pass_at_all(fs, pass_fail)  # over the executions' outcomes (agentroll.record.group)
    # a folder written before pass@k was over the outcomes held it over the "solver" samples: still its own truth
    legacy = float(any(r.stage == "solver" and r.raw_reward == 1.0 for r in rows))
    for r in rows:
        for name, got, want in zip(
            ("group_reward_mean", "group_reward_std", "group_pass_at_k"), r.figures, (mean, std, passed), strict=True
        ):
            if (want is None and got is None) or (name == "group_pass_at_k" and got == legacy):
                continue
            if want is None or not _close(got, want):
                expected = "null" if want is None else f"{want:.6g}"
                add(
                    r.line,
                    "group",
                    f"{name} {got} does not describe this group's {len(execs)} executions (expected {expected})",
                )
                return


def check_structure(
    rows: list[Row | None],
    k_setting: int | None,
    add: Add,
    system: SystemInfo = LEGACY,
    policies: tuple[str, ...] = (),
) -> list[tuple[list[list[Row]], int]]:
    """Cut a shard's rows into executions (consecutive records of one rollout) and groups (consecutive
    executions of one problem), checking each; an unreadable line ends the execution it is in. Returns the
    groups, each with its number of records. `policies`: a head-to-head run's, in order (none: one model)."""
    execs: list[list[Row]] = []
    current: list[Row] = []
    for row in [*rows, None]:
        if current and (row is None or row.rollout_id != current[0].rollout_id):
            execs.append(current)
            current = []
        if row is not None:
            current.append(row)
    for e in execs:
        _check_execution(e, add, system)
    groups: list[list[list[Row]]] = []
    for e in execs:
        if groups and e[0].problem_id == groups[-1][0][0].problem_id:
            groups[-1].append(e)
        else:
            groups.append([e])
    for g in groups:
        _check_group(g, k_setting, add, system, policies)
    return [(g, sum(len(e) for e in g)) for g in groups]


class SystemChecks:
    """The system's own checks (`Vocabulary.check`), fed each execution as it is read: only a whole one (as many
    records as its `rollout_size`), every record of the schema (as `Sample`s); the rest is said already. Only the
    current execution is kept."""

    def __init__(self, vocabulary: Vocabulary, add: Add) -> None:
        self.vocabulary, self.add = vocabulary, add
        self.rollout: Any = None
        self.lines: list[int] = []
        self.samples: list[Sample] | None = []  # None: some record was not well-formed

    def record(self, line: int, record: dict[str, Any] | None, well_formed: bool) -> None:
        """A record (None: an unreadable line, which ends the execution it is in)."""
        if record is None or (self.lines and record.get("rollout_id") != self.rollout):
            self.finish()
        if record is None:
            return
        self.rollout = record.get("rollout_id")
        self.lines.append(line)
        if self.samples is not None and well_formed:
            self.samples.append(Sample(**record))
        else:
            self.samples = None

    def finish(self) -> None:
        samples, lines = self.samples, self.lines
        self.lines, self.samples = [], []
        if not samples or len(samples) != samples[0].rollout_size:
            return
        try:
            findings = list(self.vocabulary.check(samples))
        except Exception as exc:  # a user's check: its failure is said where it happened, validate goes on
            self.add(lines[0], "execution", f"the system's check raised {type(exc).__name__}: {exc}")
            return
        for found in findings:
            self.add(lines[found.at] if 0 <= found.at < len(lines) else lines[0], found.kind, found.message)
