"""`agentroll validate DIR`: does a folder hold what the writer promises, byte for byte and record for record?

The shards are read here, line by line, not through `agentroll.readers` (which stop at the first damage and
share the writer's notion of a group): every fault is named by its shard and 1-based line, and one fault does
not hide the next. Faults are listed shard by shard in manifest order, a shard's line faults by line before
its whole-file ones (size, sha256, counts, keys), so the first fault points at a line when one can. Checks:

- the manifest: readable, our format and schema version, counts that add up, no shard listed twice;
- each shard: present, its byte size and sha256 as the manifest says, whole lines; a compressed one
  (`.jsonl.zst`) decompresses, its frames holding whole groups (line numbers count its decompressed lines);
- the system (`settings.system`; a folder without one is three-stage): a name, its stage names, per-stage
  settings only for those stages;
- each record: exactly the fields of `agentroll.schema.Sample`, each of its JSON type; values the writer can
  write (a stage of the system, status, 0/1 loss mask, schema_version); as many logprobs and mask entries as
  response tokens; a multi-turn record's history mask and logprobs as long as its prompt, 0/1, logprob 0.0
  where the mask is 0, present exactly when it continues an earlier call (turn >= 1);
- executions: `rollout_size` consecutive records of one rollout, stages in the system's order, one
  `final_reward`: for three-stage the selector's pick (one selector at most, its raw reward the listed
  rewrite's), for single the record's raw reward (one record), for critique-revise the reviser's (the solver's
  when no room was left to revise), for tool-use the last turn's (every turn's raw reward);
- tool calls: each `tool_calls` entry has exactly its six fields and a known status;
- conversations: a record that `continues` another continues an earlier record of its execution, by one turn,
  token for token (that record's prompt + response start its prompt), its history mask and logprobs exactly
  that record's model tokens (its history over its prompt, its loss mask and logprobs over its response; a
  frozen record's may be 0), 0 on what was injected after;
- groups (as `writer.scan_groups` defines them): `group_size` executions of one problem, sample indexes
  0..K-1, group figures that describe exactly those executions (pass@k when the system has solvers), no
  problem twice in the folder;
- the shard's record, execution and group counts against its manifest entry, and its keys file (resume
  trusts it) against the groups found;
- routed experts: each reference within its shard's routes sidecar, each blob a `.npy` integer array, the
  parts of a record of one dtype and (layers, experts per token), prompt + response - 1 rows once joined; the
  sidecar's size and sha256 as the manifest says (docs/routed-experts.md).

A merged folder (`agentroll merge`) is checked the same way, its shard paths taken relative to it.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from ..folder import raw as folder_files
from ..folder import routes
from ..folder.layout import MANIFEST, ZSTD, Layout
from ..schema import SCHEMA_VERSION, STAGES, Sample
from .system import CRITIQUE_REVISE, LEGACY, SINGLE, SystemInfo, system_fault, system_of

MAX_FAULTS = 1000  # kept in the report; more are counted (`faults_total`), so a ruined folder cannot eat memory
WRITTEN_STATUSES = ("completed", "truncated")  # "aborted" is retried, never written (docs/schema.md)
TOOL_USE = "tool-use"  # every turn carries the final answer's raw reward (systems/tool_use.py)
TOOL_CALL_KEYS = frozenset({"name", "arguments", "result", "duration_s", "error", "status"})
TOOL_STATUSES = ("ok", "malformed", "unknown", "failed", "timeout", "not_run")
_TOLERANCE = 1e-9


@dataclass(frozen=True, slots=True)
class Fault:
    """One thing wrong. `shard` is the shard's path as the manifest names it (None: the manifest itself);
    `line` is 1-based (None: the shard or manifest as a whole)."""

    kind: str  # manifest, missing, bytes, sha256, json, schema, value, lengths, execution, conversation, group,
    #            duplicate, count, keys, zstd, routes
    message: str
    shard: str | None = None
    line: int | None = None

    @property
    def where(self) -> str:
        if self.shard is None:
            return MANIFEST
        return f"{self.shard}:{self.line}" if self.line is not None else self.shard

    def __str__(self) -> str:
        return f"{self.where}: {self.kind}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"shard": self.shard, "line": self.line, "kind": self.kind, "message": self.message}


@dataclass(slots=True)
class ValidationReport:
    """What `validate` found. Counts are of what the shards hold (records: lines that are JSON objects)."""

    folder: str
    merged: bool = False
    shards: int = 0
    records: int = 0
    executions: int = 0
    groups: int = 0
    faults: list[Fault] = field(default_factory=list)  # in reading order, at most MAX_FAULTS
    faults_total: int = 0
    warnings: list[str] = field(default_factory=list)  # worth knowing, not wrong (a run in progress...)

    @property
    def ok(self) -> bool:
        return self.faults_total == 0

    @property
    def first(self) -> Fault | None:
        return self.faults[0] if self.faults else None

    def add(self, fault: Fault) -> None:
        self.faults_total += 1
        if len(self.faults) < MAX_FAULTS:
            self.faults.append(fault)

    def lines(self, limit: int = 20) -> list[str]:
        """The CLI's text: a verdict, the first fault with its shard and line, then up to `limit` others."""
        counts = f"{self.shards} shards, {self.records} records, {self.executions} executions, {self.groups} groups"
        out = [f"warning: {w}" for w in self.warnings]
        if self.ok:
            return [*out, f"{self.folder}: ok ({'merged; ' if self.merged else ''}{counts})"]
        assert self.first is not None
        out.append(f"{self.folder}: {self.faults_total} fault{'s' * (self.faults_total != 1)} ({counts})")
        out.append(f"first fault: {self.first}")
        rest = self.faults[1 : 1 + limit]
        out += [f"  {fault}" for fault in rest]
        more = self.faults_total - 1 - len(rest)
        if more > 0:
            out.append(f"  ... and {more} more")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "folder": self.folder,
            "ok": self.ok,
            "merged": self.merged,
            "shards": self.shards,
            "records": self.records,
            "executions": self.executions,
            "groups": self.groups,
            "faults_total": self.faults_total,
            "faults": [f.to_dict() for f in self.faults],
            "warnings": list(self.warnings),
        }


# -- record schema, derived from `Sample` so that a new field is checked without touching this file ---------

Check = Callable[[Any], str | None]  # None: fine; else what the value is instead


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _describe(hint: Any) -> str:
    if hint is Any:
        return "any JSON value"
    if hint is type(None):
        return "null"
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(hint))
    if origin is list:
        return f"an array of {_plural(_describe(typing.get_args(hint)[0]))}"
    if origin is dict or hint is dict:
        return "an object"
    return {int: "an integer", float: "a number", str: "a string", bool: "a boolean"}.get(hint, str(hint))


def _plural(description: str) -> str:
    """ "an integer or null" -> "integers or nulls"; "an array of integers" -> "arrays of integers"."""
    if description.startswith("an array of "):
        return "arrays of " + description.removeprefix("an array of ")
    return " or ".join(part.split(" ", 1)[-1] + "s" for part in description.split(" or "))


def _scalar(hint: Any) -> Callable[[Any], bool]:
    # JSON types: an integer is never a boolean; a number may be written without a fraction
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        parts = [_scalar(a) for a in typing.get_args(hint)]
        return lambda v: any(p(v) for p in parts)
    if typing.get_origin(hint) is list:
        inner = _scalar(typing.get_args(hint)[0])
        return lambda v: type(v) is list and all(inner(x) for x in v)
    if hint is int:
        return lambda v: type(v) is int
    if hint is float:
        return lambda v: type(v) is float or type(v) is int
    if hint is str:
        return lambda v: type(v) is str
    if hint is bool:
        return lambda v: type(v) is bool
    if hint is type(None):
        return lambda v: v is None
    if hint is dict or typing.get_origin(hint) is dict:
        return lambda v: type(v) is dict
    if hint is Any:
        return lambda v: True
    raise TypeError(f"no JSON check for {hint!r}")


def _check_for(hint: Any) -> Check:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        parts = [_check_for(a) for a in typing.get_args(hint)]

        def check_union(v: Any) -> str | None:
            got = [p(v) for p in parts]
            if None in got:
                return None
            return next((g for g in got if g != _json_type(v)), _json_type(v))  # an array's item fault, if any

        return check_union
    if origin is list:
        item = _check_for(typing.get_args(hint)[0])

        def check_list(v: Any) -> str | None:
            if type(v) is not list:
                return _json_type(v)
            for i, x in enumerate(v):
                got = item(x)
                if got is not None:
                    return f"an array whose item {i} is {got}"
            return None

        return check_list
    ok = _scalar(hint)
    return lambda v: None if ok(v) else _json_type(v)


_HINTS = typing.get_type_hints(Sample)
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Sample))
_CHECKS: dict[str, tuple[Check, str]] = {name: (_check_for(_HINTS[name]), _describe(_HINTS[name])) for name in FIELDS}


def record_faults(record: dict[str, Any], stages: tuple[str, ...] | None = STAGES) -> list[tuple[str, str]]:
    """(kind, message) for everything wrong with one record on its own: fields, types, values, lengths.
    `stages`: the system's stage names (None: any non-empty name)."""
    faults: list[tuple[str, str]] = []
    missing = [name for name in FIELDS if name not in record]
    extra = [name for name in record if name not in _CHECKS]
    if missing:
        faults.append(("schema", f"missing field{'s' * (len(missing) > 1)} {', '.join(missing)}"))
    if extra:
        faults.append(("schema", f"unknown field{'s' * (len(extra) > 1)} {', '.join(extra)}"))
    typed = set()
    for name, (check, expected) in _CHECKS.items():
        if name in record:
            got = check(record[name])
            if got is None:
                typed.add(name)
            else:
                faults.append(("schema", f"field {name!r} is {got}, expected {expected}"))

    def value(name: str, ok: bool, message: str) -> None:
        if name in typed and not ok:
            faults.append(("value", message))

    r = record
    value(
        "schema_version",
        r.get("schema_version") == SCHEMA_VERSION,
        f"schema_version {r.get('schema_version')!r}, expected {SCHEMA_VERSION}",
    )
    if stages is not None:
        value("stage", r.get("stage") in stages, f"stage {r.get('stage')!r} is not one of {', '.join(stages)}")
    else:
        value("stage", r.get("stage") != "", "stage '' is empty")
    value(
        "status",
        r.get("status") in WRITTEN_STATUSES,
        f"status {r.get('status')!r}: the writer only writes {' or '.join(WRITTEN_STATUSES)}",
    )
    if "loss_mask" in typed:
        bad = next((i for i, m in enumerate(r["loss_mask"]) if m not in (0, 1)), None)
        value(
            "loss_mask",
            bad is None,
            f"loss_mask item {bad} is {r['loss_mask'][bad] if bad is not None else ''}, not 0 or 1",
        )
    value("group_size", "group_size" not in typed or r["group_size"] >= 1, f"group_size {r.get('group_size')} < 1")
    value(
        "rollout_size",
        "rollout_size" not in typed or r["rollout_size"] >= 1,
        f"rollout_size {r.get('rollout_size')} < 1",
    )
    if {"sample_index", "group_size"} <= typed:
        value(
            "sample_index",
            0 <= r["sample_index"] < r["group_size"],
            f"sample_index {r['sample_index']} is outside 0..{r['group_size'] - 1} (group_size {r['group_size']})",
        )
    for name in ("raw_reward", "reward", "final_reward"):
        value(name, name not in typed or math.isfinite(r[name]), f"{name} {r.get(name)!r} is not finite")
    if {"response_token_ids", "response_logprobs", "loss_mask"} <= typed:
        n = len(r["response_token_ids"])
        wrong = [f"{name} has {len(r[name])}" for name in ("response_logprobs", "loss_mask") if len(r[name]) != n]
        wrong += [
            f"{name} has {len(r[name])}"
            for name in ("response_ranks", "top_token_ids", "top_logprobs")
            if name in typed and r[name] is not None and len(r[name]) != n
        ]
        if wrong:
            faults.append(("lengths", f"{' and '.join(wrong)} entries where response_token_ids has {n}"))
        if {"top_token_ids", "top_logprobs"} <= typed and r["top_token_ids"] is not None and r["top_logprobs"]:
            bad = next(
                (
                    j
                    for j, (a, b) in enumerate(zip(r["top_token_ids"], r["top_logprobs"], strict=False))
                    if len(a) != len(b) or any(x < y for x, y in itertools.pairwise(b))
                ),
                None,
            )
            if bad is not None:
                faults.append(
                    (
                        "value",
                        f"top_token_ids/top_logprobs at response position {bad}: not the same "
                        "length, or not in rank order (logprobs falling)",
                    )
                )
        spans = r.get("weight_versions") if "weight_versions" in typed else None
        if spans:
            ok = (
                all(isinstance(x, dict) and type(x.get("start")) is int and type(x.get("end")) is int for x in spans)
                and spans[0]["start"] == 0
                and spans[-1]["end"] == n
                and all(a["end"] == b["start"] for a, b in itertools.pairwise(spans))
            )
            value("weight_versions", ok, f"weight_versions do not cover the {n} response tokens in order")
    _history_faults(r, typed, faults)
    if "tool_calls" in typed and r["tool_calls"] is not None:
        bad = next(
            (
                i
                for i, c in enumerate(r["tool_calls"])
                if set(c) != TOOL_CALL_KEYS
                or c.get("status") not in TOOL_STATUSES
                or not isinstance(c.get("duration_s"), int | float)
            ),
            None,
        )
        value(
            "tool_calls",
            bad is None,
            f"tool_calls item {bad} is not {{{', '.join(sorted(TOOL_CALL_KEYS))}}} "
            f"with a status of {', '.join(TOOL_STATUSES)}",
        )
    return faults


def _history_faults(r: dict[str, Any], typed: set[str], faults: list[tuple[str, str]]) -> None:
    """A multi-turn record's own consistency: `history_mask` and `history_logprobs` both null (a first turn:
    `turn` 0, `continues` null) or both as long as the prompt, the mask 0/1, the logprobs 0.0 where it is 0."""
    if not {"turn", "continues", "history_mask", "history_logprobs", "prompt_token_ids"} <= typed:
        return  # a schema fault, already said
    turn, continues, mask, logprobs = r["turn"], r["continues"], r["history_mask"], r["history_logprobs"]
    if turn < 0:
        faults.append(("value", f"turn {turn} < 0"))
    if continues is not None and continues < 0:
        faults.append(("value", f"continues {continues} < 0"))
    if (mask is None) != (logprobs is None):
        faults.append(("value", "history_mask and history_logprobs are not both null or both arrays"))
        return
    if mask is None:
        if turn != 0 or continues is not None:
            faults.append(
                (
                    "value",
                    f"turn {turn}, continues {continues!r} without a history_mask: a record that "
                    "continues an earlier one has one, a first turn (turn 0, continues null) none",
                )
            )
        return
    if continues is None or turn == 0:
        faults.append(
            (
                "value",
                f"a history_mask on turn {turn}, continues {continues!r}: only a record that "
                "continues an earlier one (turn >= 1) has one",
            )
        )
    n = len(r["prompt_token_ids"])
    wrong = [
        f"{name} has {len(v)}" for name, v in (("history_mask", mask), ("history_logprobs", logprobs)) if len(v) != n
    ]
    if wrong:
        faults.append(("lengths", f"{' and '.join(wrong)} entries where prompt_token_ids has {n}"))
        return
    bad = next((i for i, m in enumerate(mask) if m not in (0, 1)), None)
    if bad is not None:
        faults.append(("value", f"history_mask item {bad} is {mask[bad]}, not 0 or 1"))
        return
    bad = next((i for i, (m, x) in enumerate(zip(mask, logprobs, strict=True)) if m == 0 and x != 0), None)
    if bad is not None:
        faults.append(
            (
                "value",
                f"history_logprobs item {bad} is {logprobs[bad]} where history_mask is 0 (an "
                "injected token has logprob 0.0)",
            )
        )


# -- executions and groups -----------------------------------------------------------------------------------


def _int(v: Any) -> int | None:
    return v if type(v) is int else None


def _num(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) else None


@dataclass(slots=True)
class _Row:
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
    judgment: int | None
    listed_as: int | None
    figures: tuple[float | None, float | None, float | None]  # group_reward_mean, _std, group_pass_at_k

    @classmethod
    def of(cls, line: int, r: dict[str, Any]) -> _Row:
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
            _int(r.get("judgment")),
            _int(r.get("listed_as")),
            (_num(r.get("group_reward_mean")), _num(r.get("group_reward_std")), _num(r.get("group_pass_at_k"))),
        )


def _close(a: float | None, b: float) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=_TOLERANCE, abs_tol=_TOLERANCE)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' * (n != 1)}"


def _lines(rows: list[_Row]) -> str:
    return f"lines {rows[0].line}-{rows[-1].line}" if len(rows) > 1 else f"line {rows[0].line}"


def _check_execution(rows: list[_Row], add: Callable[[int, str, str], None], system: SystemInfo = LEGACY) -> None:
    head = rows[0]
    rid = str(head.rollout_id)[:12]
    if head.rollout_size is not None and head.rollout_size != len(rows):
        add(
            head.line,
            "execution",
            f"execution {rid} ({_lines(rows)}) has {_count(len(rows), 'consecutive record')}, "
            f"its rollout_size says {head.rollout_size}",
        )
    for name in ("problem_id", "problem_hash", "sample_index", "group_size", "rollout_size", "final_reward"):
        other = next((r for r in rows if getattr(r, name) != getattr(head, name)), None)
        if other is not None:
            add(
                other.line,
                "execution",
                f"{name} {getattr(other, name)!r} differs from {getattr(head, name)!r} "
                f"at line {head.line}, in execution {rid}",
            )
    order = STAGES if system.three_stage else system.stages
    if order is not None:
        rank = {stage: i for i, stage in enumerate(order)}
        previous = 0
        for r in rows:
            now = rank.get(r.stage, previous)
            if now < previous:
                said = (
                    "solvers, rewriters, selector is the order"
                    if system.three_stage
                    else f"the {system.name} system's stage order is {', '.join(order)}"
                )
                add(r.line, "execution", f"a {r.stage} record after a {order[previous]} in execution {rid} ({said})")
                break
            previous = now
    if system.three_stage:
        _check_three_stage(rows, rid, add)
    elif system.name == TOOL_USE:
        last = rows[-1]
        other = next((r for r in rows if r.raw_reward != last.raw_reward), None)
        if other is not None:
            add(
                other.line,
                "execution",
                f"raw_reward {other.raw_reward} differs from the final turn's "
                f"({last.raw_reward}, line {last.line}) in tool-use execution {rid}",
            )
        if (
            last.raw_reward is not None
            and head.final_reward is not None
            and not _close(head.final_reward, last.raw_reward)
        ):
            add(
                head.line,
                "execution",
                f"final_reward {head.final_reward} is not the raw_reward of the final turn "
                f"({last.raw_reward}, line {last.line}) in execution {rid}",
            )
    elif system.name in (SINGLE, CRITIQUE_REVISE):
        if system.name == SINGLE and len(rows) != 1:
            add(rows[1].line, "execution", f"execution {rid} has {len(rows)} records: the single system writes one")
        # critique-revise: the reviser's answer, or the solver's when no room was left to revise
        last = next((r for r in rows if r.stage == "reviser"), rows[0])
        if (
            last.raw_reward is not None
            and head.final_reward is not None
            and not _close(head.final_reward, last.raw_reward)
        ):
            add(
                head.line,
                "execution",
                f"final_reward {head.final_reward} is not the raw_reward of the execution's "
                f"{last.stage} ({last.raw_reward}, line {last.line}) in execution {rid}",
            )


def _check_three_stage(rows: list[_Row], rid: str, add: Callable[[int, str, str], None]) -> None:
    head = rows[0]
    selectors = [r for r in rows if r.stage == "selector"]
    if len(selectors) > 1:
        add(selectors[1].line, "execution", f"a second selector record in execution {rid}")
    outcome = selectors[0].raw_reward if selectors else 0.0
    if outcome is not None and head.final_reward is not None and not _close(head.final_reward, outcome):
        add(
            head.line,
            "execution",
            f"final_reward {head.final_reward} is not the selector's raw_reward ({outcome}) in execution {rid}",
        )
    selector = selectors[0] if selectors else None
    if selector is not None and selector.judgment is not None and selector.raw_reward is not None:
        listed = {r.listed_as: r for r in rows if r.stage == "rewriter" and r.listed_as is not None}
        picked = listed.get(selector.judgment)
        expected = picked.raw_reward if picked is not None else 0.0
        if expected is not None and not _close(selector.raw_reward, expected):
            what = f"the raw_reward of the rewrite listed as {selector.judgment}" if picked else "0 (no such rewrite)"
            add(selector.line, "execution", f"selector raw_reward {selector.raw_reward} is not {what}: {expected}")


def _check_group(
    execs: list[list[_Row]], k_setting: int | None, add: Callable[[int, str, str], None], system: SystemInfo = LEGACY
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
        add(head.line, "group", f"group_size {k} where the manifest's settings say samples_per_prompt {k_setting}")
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
    finals = [e[0].final_reward for e in execs]
    if k is None or len(execs) != k:
        return  # not a whole group (reported above): its figures cannot describe it
    if any(f is None for f in finals) or any(r.raw_reward is None for r in rows):
        return  # a type fault is already reported; figures cannot be recomputed
    fs = typing.cast(list[float], finals)
    mean = sum(fs) / len(fs)
    std = (sum((f - mean) ** 2 for f in fs) / len(fs)) ** 0.5
    passed = float(any(r.stage == "solver" and r.raw_reward == 1.0 for r in rows))
    # group_pass_at_k is over the "solver" stage's samples: a system without one says what it likes there
    solvers = system.three_stage or "solver" in (system.stages or ())
    for r in rows:
        for name, got, want in zip(
            ("group_reward_mean", "group_reward_std", "group_pass_at_k"), r.figures, (mean, std, passed), strict=True
        ):
            if name == "group_pass_at_k" and not solvers:
                continue
            if not _close(got, want):
                add(
                    r.line,
                    "group",
                    f"{name} {got} does not describe this group's {len(execs)} executions (expected {want:.6g})",
                )
                return


def check_structure(
    rows: list[_Row | None], k_setting: int | None, add: Callable[[int, str, str], None], system: SystemInfo = LEGACY
) -> list[tuple[list[list[_Row]], int]]:
    """Cut a shard's rows into executions (consecutive records of one rollout) and groups (consecutive
    executions of one problem), checking each; an unreadable line ends the execution it is in. Returns the
    groups, each with its number of records."""
    execs: list[list[_Row]] = []
    current: list[_Row] = []
    for row in [*rows, None]:
        if current and (row is None or row.rollout_id != current[0].rollout_id):
            execs.append(current)
            current = []
        if row is not None:
            current.append(row)
    for e in execs:
        _check_execution(e, add, system)
    groups: list[list[list[_Row]]] = []
    for e in execs:
        if groups and e[0].problem_id == groups[-1][0][0].problem_id:
            groups[-1].append(e)
        else:
            groups.append([e])
    for g in groups:
        _check_group(g, k_setting, add, system)
    return [(g, sum(len(e) for e in g)) for g in groups]


# -- multi-turn conversations -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Turn:
    """What a later turn of the same execution is checked against."""

    line: int
    turn: int
    trainable: bool
    prompt: list[int]
    response: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    history_mask: list[int] | None
    history_logprobs: list[float] | None


def _list(v: Any, item: type) -> typing.TypeGuard[list[Any]]:
    return type(v) is list and all(type(x) is item or (item is float and type(x) is int) for x in v)


class _Conversations:
    """The records of the execution being read (consecutive records of one rollout_id), so that a record that
    `continues` an earlier one is checked against it: a valid earlier position, the next turn, its prompt and
    response a prefix of this prompt token for token, and the history mask and logprobs exactly that earlier
    record's (its own history over its prompt, its loss mask and logprobs over its response, 0 on what came
    after). Only the current execution is kept."""

    def __init__(self, add: Callable[[int | None, str, str], None]) -> None:
        self.add = add
        self.rollout: Any = None
        self.turns: list[_Turn | None] = []

    def unreadable(self) -> None:
        """A line that is no record: it keeps its place in the execution it was in (nothing can continue it)."""
        if self.turns:
            self.turns.append(None)

    def record(self, line: int, r: dict[str, Any]) -> None:
        if r.get("rollout_id") != self.rollout or not self.turns:
            self.rollout, self.turns = r.get("rollout_id"), []
        position = len(self.turns)
        turn = self._turn(line, r)
        self.turns.append(turn)
        continues = r.get("continues")
        if turn is None or type(continues) is not int:
            return  # a first turn, or a schema fault already said
        if not 0 <= continues < position:
            self.add(
                line,
                "conversation",
                f"continues {continues} is not an earlier record of its execution (this "
                f"is its record {position}, counting from 0)",
            )
            return
        earlier = self.turns[continues]
        if earlier is None:
            return  # unreadable: its own faults are said
        where = f"the record it continues (line {earlier.line})"
        if turn.turn != earlier.turn + 1:
            self.add(line, "conversation", f"turn {turn.turn} continues {where}, which is turn {earlier.turn}")
        head = earlier.prompt + earlier.response
        if turn.prompt[: len(head)] != head:
            diff = next(
                (i for i, (a, b) in enumerate(zip(turn.prompt, head, strict=False)) if a != b),
                min(len(turn.prompt), len(head)),
            )
            self.add(
                line,
                "conversation",
                f"prompt_token_ids do not start with the prompt and response of {where}: "
                f"they differ at token {diff} (of {len(head)})",
            )
            return
        if turn.history_mask is None or turn.history_logprobs is None:
            return  # said by record_faults
        p, n = len(earlier.prompt), len(earlier.response)
        mask = list(earlier.history_mask) if earlier.history_mask is not None else [0] * p
        logprobs = list(earlier.history_logprobs) if earlier.history_logprobs is not None else [0.0] * p
        model = [*mask, *earlier.loss_mask]
        sampled = [*logprobs, *(x if m else 0.0 for x, m in zip(earlier.logprobs, earlier.loss_mask, strict=True))]
        rest = len(turn.prompt) - p - n
        expected_mask = [*model, *[0] * rest]
        expected_logprobs = [*sampled, *[0.0] * rest]
        if turn.history_mask != expected_mask:
            frozen = [*mask, *[0] * n, *[0] * rest]
            if earlier.trainable or turn.history_mask != frozen:  # a frozen turn's tokens may be marked 0
                bad = next(i for i, (a, b) in enumerate(zip(turn.history_mask, expected_mask, strict=True)) if a != b)
                part = (
                    "its prompt (that record's history_mask)"
                    if bad < p
                    else "its response (that record's loss_mask)"
                    if bad < p + n
                    else "the tokens after it (0)"
                )
                self.add(
                    line,
                    "conversation",
                    f"history_mask item {bad} is {turn.history_mask[bad]} where {where} "
                    f"says {expected_mask[bad]}: over {part}",
                )
                return
            expected_logprobs = [*logprobs, *[0.0] * (n + rest)]
        wrong = next(
            (
                i
                for i, (a, b) in enumerate(zip(turn.history_logprobs, expected_logprobs, strict=True))
                if not math.isclose(a, b, rel_tol=_TOLERANCE, abs_tol=_TOLERANCE)
            ),
            None,
        )
        if wrong is not None:
            self.add(
                line,
                "conversation",
                f"history_logprobs item {wrong} is {turn.history_logprobs[wrong]} where "
                f"{where} sampled {expected_logprobs[wrong]}",
            )

    @staticmethod
    def _turn(line: int, r: dict[str, Any]) -> _Turn | None:
        prompt, response, loss_mask = r.get("prompt_token_ids"), r.get("response_token_ids"), r.get("loss_mask")
        logprobs, mask, history = r.get("response_logprobs"), r.get("history_mask"), r.get("history_logprobs")
        if not (
            _list(prompt, int)
            and _list(response, int)
            and _list(loss_mask, int)
            and _list(logprobs, float)
            and type(r.get("turn")) is int
            and len(loss_mask) == len(logprobs) == len(response)
        ):
            return None
        if mask is None and history is None:
            return _Turn(
                line,
                r["turn"],
                r.get("trainable") is not False,
                prompt,
                response,
                loss_mask,
                [float(x) for x in logprobs],
                None,
                None,
            )
        if not (_list(mask, int) and _list(history, float) and len(mask) == len(history) == len(prompt)):
            return None
        return _Turn(
            line,
            r["turn"],
            r.get("trainable") is not False,
            prompt,
            response,
            loss_mask,
            [float(x) for x in logprobs],
            mask,
            [float(x) for x in history],
        )


# -- routed experts ----------------------------------------------------------------------------------------------


class _Routes:
    """A shard's routes sidecar under check: each record's reference as the lines are read, then the file
    against its manifest entry (`info`; None: the shard has no sidecar)."""

    def __init__(self, folder: Path, info: dict[str, Any] | None, add: Callable[[int | None, str, str], None]):
        self.info, self.add = info, add
        self.fd: int | None = None
        self.size = self.end = self.whole = 0
        self.prompts: dict[routes.Span, tuple[int, str, tuple[int, ...]] | str] = {}  # decoded once per shard
        if info is not None:
            try:
                self.fd = folder_files.open_sidecar(folder / info["file"])
                self.size = os.fstat(self.fd).st_size
            except OSError as exc:
                add(None, "missing", f"routes sidecar {info['file']}: {exc.strerror or exc}")

    def __enter__(self) -> _Routes:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def _blob(self, name: str, span: routes.Span) -> tuple[int, str, tuple[int, ...]] | str:
        assert self.fd is not None
        got = self.prompts.get(span)
        if got is None:
            try:
                array = routes.decode(folder_files.pread(self.fd, span[1], span[0]))
                got = (array.shape[0], array.dtype.str, array.shape[1:])
            except ValueError as exc:
                got = str(exc)
            if name == "prompt":
                self.prompts[span] = got
        return got

    def record(self, line: int, record: dict[str, Any]) -> None:
        ref = record.get("routed_experts")
        if ref is None:
            return
        try:
            parts = routes.spans(ref)
        except ValueError as exc:
            self.add(line, "routes", f"routed_experts: {exc}")
            return
        if self.info is None:
            self.add(line, "routes", "routed_experts references a sidecar, but the manifest lists none for this shard")
            return
        if self.fd is None:
            return  # the sidecar is missing: said once
        shapes = {}
        for name, span in parts.items():
            if span is None:
                continue
            if span[0] + span[1] > self.size:
                self.add(
                    line,
                    "routes",
                    f"routes {name} blob [{span[0]}, {span[1]}] ends past the sidecar's {self.size} bytes",
                )
                return
            self.end = max(self.end, span[0] + span[1])
            got = self._blob(name, span)
            if isinstance(got, str):
                self.add(line, "routes", f"routes {name} blob [{span[0]}, {span[1]}]: {got}")
                return
            shapes[name] = got
        if len({(dtype, tail) for _, dtype, tail in shapes.values()}) > 1:
            self.add(
                line,
                "routes",
                "routes parts differ in dtype or (layers, experts per token): "
                + ", ".join(f"{name} {dtype} {tail}" for name, (_, dtype, tail) in shapes.items()),
            )
            return
        prompt, response = record.get("prompt_token_ids"), record.get("response_token_ids")
        if not isinstance(prompt, list) or not isinstance(response, list):
            return  # a schema fault, already said
        expected = len(prompt) + len(response) - 1
        rows = sum(r for r, _, _ in shapes.values())
        if "rows" in shapes:
            self.whole += rows != expected  # stored whole, as the server sent it: a warning
        elif parts["prompt"] is None and prompt:
            self.add(line, "routes", f"routes prompt part is null, but the prompt has {len(prompt)} tokens")
        elif "prompt" in shapes and shapes["prompt"][0] != len(prompt):
            self.add(
                line, "routes", f"routes prompt part has {shapes['prompt'][0]} rows, the prompt {len(prompt)} tokens"
            )
        elif rows != expected:
            self.add(line, "routes", f"routes have {rows} rows once joined, where prompt + response - 1 is {expected}")

    def finish(self, shard: str, warnings: list[str]) -> None:
        if self.fd is None or self.info is None:
            return
        digest, offset = hashlib.sha256(), 0
        while block := folder_files.pread(self.fd, 1 << 20, offset):
            digest.update(block)
            offset += len(block)
        name = self.info["file"]
        if self.size != self.info["bytes"]:
            self.add(
                None, "bytes", f"routes sidecar {name}: {self.size} bytes where the manifest says {self.info['bytes']}"
            )
        if digest.hexdigest() != self.info["sha256"]:
            self.add(
                None,
                "sha256",
                f"routes sidecar {name}: sha256 {digest.hexdigest()} where the manifest says {self.info['sha256']}",
            )
        if self.end < self.size:
            warnings.append(f"{name}: {self.size - self.end} bytes after the last blob its records reference")
        if self.whole:
            warnings.append(
                f"{shard}: {_count(self.whole, 'record')} with routes of other than prompt + response - 1 "
                "rows (stored whole, as the server sent them)"
            )


# -- the folder ------------------------------------------------------------------------------------------------

_ENTRY_FIELDS = {"file": str, "records": int, "executions": int, "groups": int, "bytes": int, "sha256": str}


def _load_manifest(folder: Path, report: ValidationReport) -> dict[str, Any] | None:
    """The manifest as a dict, checked by `Manifest` as every other folder tool checks it (one fault, and no
    further checks, where they would refuse it); a schema other than this agentroll's is one more fault."""
    from ..errors import OutputError
    from ..folder.manifest import Manifest, in_the_way

    path = folder / MANIFEST
    try:
        data = folder_files.manifest_bytes(folder)
    except FileNotFoundError:
        report.add(Fault("manifest", f"no {MANIFEST} in {folder}: not an agentroll output folder"))
        return None
    except IsADirectoryError:
        report.add(Fault("manifest", str(in_the_way(path))))
        return None
    except OSError as exc:
        report.add(Fault("manifest", f"cannot read {path}: {exc.strerror or exc}"))
        return None
    try:
        Manifest.parse(data, path)
    except OutputError as exc:
        report.add(Fault("manifest", str(exc)))
        return None
    manifest: dict[str, Any] = orjson.loads(data)
    if manifest.get("schema_version") != SCHEMA_VERSION:
        report.add(
            Fault(
                "manifest", f"schema_version {manifest.get('schema_version')!r}, this agentroll reads {SCHEMA_VERSION}"
            )
        )
    return manifest


def _check_keys(shard: Path, name: str, found: list[list[str]], faults: list[Fault]) -> None:
    """The keys file is what a resumed run believes the shard holds: it must list exactly its groups."""
    path = Layout(shard.parent).keys(shard.name)
    if not folder_files.keys_exist(shard):
        return  # not copied along (merge --copy, rsync of dot-folders): the writer rebuilds it from the shard
    try:
        listed = orjson.loads(folder_files.keys_bytes(shard))
    except (OSError, orjson.JSONDecodeError) as exc:
        faults.append(Fault("keys", f"{path.name} is unreadable ({exc}); resume trusts it", name))
        return
    if listed != found:
        diff = next(
            (i for i, (a, b) in enumerate(zip(listed, found, strict=False)) if a != b), min(len(listed), len(found))
        )
        faults.append(
            Fault(
                "keys",
                f"{path.name} lists {len(listed)} groups, the shard holds {len(found)}; "
                f"they differ from group {diff + 1} on (resume trusts the keys file)",
                name,
            )
        )


def _hashed(f: BinaryIO, digest: Any) -> Iterator[bytes]:
    """A plain shard's lines, newline kept, hashed as they are read: a shard is read once, never held whole."""
    for raw in f:
        digest.update(raw)
        yield raw


def _zstd_lines(data: bytes, frames: set[int], add: Callable[[int | None, str, str], None]) -> Iterator[bytes]:
    """A compressed shard's lines, frame by frame (the writer closes one frame per group), noting in `frames`
    the line number each frame starts at. A frame that does not decompress (damaged, torn by a kill) is a fault
    at the line it would have started; nothing after it can be read."""
    import zstandard

    pos, line = 0, 1
    while pos < len(data):
        frames.add(line)
        frame = zstandard.ZstdDecompressor().decompressobj()
        try:
            block = frame.decompress(data[pos:])
        except zstandard.ZstdError as exc:
            add(line, "zstd", f"the frame at byte {pos} does not decompress ({exc}); the rest of the shard is lost")
            return
        if not frame.eof:
            add(line, "zstd", f"the frame at byte {pos} is incomplete (torn by a kill?); the rest of the shard is lost")
            return
        pos = len(data) - len(frame.unused_data)
        pieces = block.split(b"\n")
        for piece in pieces[:-1]:
            yield piece + b"\n"
        if pieces[-1]:
            yield pieces[-1]  # a frame that does not end its last line: reported as a torn line
        line += len(pieces) - 1 + bool(pieces[-1])
    frames.add(line)


def _read_shard(
    folder: Path,
    entry: dict[str, Any],
    k_setting: int | None,
    seen: dict[str, str],
    report: ValidationReport,
    system: SystemInfo = LEGACY,
) -> None:
    name = str(entry["file"])
    path = folder / name
    shard_faults: list[Fault] = []

    def add(line: int | None, kind: str, message: str) -> None:
        shard_faults.append(Fault(kind, message, name, line))

    if not path.is_file():
        report.add(Fault("missing", f"{path} does not exist", name))
        return
    size = path.stat().st_size
    if size != entry["bytes"]:
        add(None, "bytes", f"{size} bytes where the manifest says {entry['bytes']}")
    digest = hashlib.sha256()
    stages = STAGES if system.three_stage else system.stages
    rows: list[_Row | None] = []
    frames: set[int] | None = None  # zstd: the line numbers at which a frame starts, and the one past the end
    with folder_files.open_shard(path) as f, _Routes(folder, entry.get("routes"), add) as sidecar:
        if name.endswith(ZSTD):
            data = f.read()
            digest.update(data)
            frames = set()
            lines: Iterable[bytes] = _zstd_lines(data, frames, add)
        else:
            lines = _hashed(f, digest)
        conversations = _Conversations(add)
        for number, raw in enumerate(lines, start=1):
            if not raw.endswith(b"\n"):
                add(number, "json", "the last line has no newline (torn by a crash?)")
            if not raw.strip():
                add(number, "json", "an empty line")
                rows.append(None)
                conversations.unreadable()
                continue
            try:
                record = orjson.loads(raw)
            except orjson.JSONDecodeError as exc:
                add(number, "json", f"not JSON ({exc})")
                rows.append(None)
                conversations.unreadable()
                continue
            if not isinstance(record, dict):
                add(number, "json", f"{_json_type(record)}, not a JSON object")
                rows.append(None)
                conversations.unreadable()
                continue
            for kind, message in record_faults(record, stages):
                add(number, kind, message)
            conversations.record(number, record)
            sidecar.record(number, record)
            rows.append(_Row.of(number, record))
        sidecar.finish(name, report.warnings)
    if digest.hexdigest() != entry["sha256"]:
        add(None, "sha256", f"sha256 {digest.hexdigest()} where the manifest says {entry['sha256']}")
    groups = check_structure(rows, k_setting, lambda line, kind, message: add(line, kind, message), system)
    if frames is not None:  # frames hold whole groups: one each while written, all of them once finished
        for g, _ in groups:
            first, last = g[0][0].line, g[-1][-1].line
            if any(first < start <= last for start in frames):
                add(
                    first,
                    "zstd",
                    f"the group of problem {g[0][0].problem_id!r} (lines {first}-{last}) is split "
                    "across zstd frames (a reader stops there)",
                )
    records = sum(row is not None for row in rows)
    executions = sum(len(g) for g, _ in groups)
    for g, _ in groups:
        head = g[0][0]
        key = head.problem_id if isinstance(head.problem_id, str) else repr(head.problem_id)  # a list is no key
        if key in seen:
            add(head.line, "duplicate", f"problem {head.problem_id!r} is also at {seen[key]}")
        else:
            seen[key] = f"{name}:{head.line}"
    for what, counted in (("records", records), ("executions", executions), ("groups", len(groups))):
        if counted != entry[what]:
            add(None, "count", f"{counted} {what} where the manifest says {entry[what]}")
    _check_keys(path, name, [[str(g[0][0].problem_id), str(g[0][0].problem_hash)] for g, _ in groups], shard_faults)
    # by line, then the shard as a whole: a line fault says where, a size or sha256 mismatch only that
    shard_faults.sort(key=lambda fault: (fault.line is None, fault.line or 0))
    for fault in shard_faults:
        report.add(fault)
    report.records += records
    report.executions += executions
    report.groups += len(groups)


def validate(folder: str | Path) -> ValidationReport:
    """Check an output folder (or a merged one) against its manifest and the record schema; never raises for
    what is in the folder: every problem is a `Fault` in the report."""
    folder = Path(folder)
    report = ValidationReport(folder=str(folder))
    manifest = _load_manifest(folder, report)
    if manifest is None:
        return report
    report.merged = bool(manifest.get("merged_from"))
    wrong = system_fault(manifest)
    if wrong is not None:
        report.add(Fault("manifest", wrong))
    system = system_of(manifest)
    settings = manifest.get("settings")
    k_setting = _int(settings.get("samples_per_prompt")) if isinstance(settings, dict) else None
    entries: list[dict[str, Any]] = []
    listed: set[str] = set()
    for i, entry in enumerate(manifest["shards"]):
        bad = [k for k, t in _ENTRY_FIELDS.items() if not isinstance(entry, dict) or type(entry.get(k)) is not t]
        if bad:
            report.add(Fault("manifest", f"shard entry {i} lacks a valid {', '.join(bad)}"))
        elif entry["file"] in listed:
            report.add(Fault("manifest", f"shard {entry['file']} is listed twice"))
        else:
            listed.add(entry["file"])
            side = entry.get("routes")
            if side is not None and not (
                isinstance(side, dict)
                and type(side.get("file")) is str
                and type(side.get("bytes")) is int
                and type(side.get("sha256")) is str
            ):
                report.add(
                    Fault("manifest", f"shard {entry['file']}: its routes entry lacks a valid file, bytes or sha256")
                )
                entry = {**entry, "routes": None}
            entries.append(entry)
    for what in ("records", "executions", "groups"):
        total = sum(e[what] for e in entries)
        if manifest.get(what) != total:
            report.add(Fault("count", f"the manifest says {manifest.get(what)!r} {what}, its shards add up to {total}"))
    if manifest.get("complete") is not True:
        report.warnings.append("the manifest says the run is not complete (running, stopped, or some groups failed)")
    layout = Layout(folder)
    on_disk = {p.name for p in layout.finished()}
    for stray in sorted(on_disk - {Path(e["file"]).name for e in entries if Path(e["file"]).parent == Path(".")}):
        report.warnings.append(f"{stray} is in the folder but not in the manifest (a rerun adopts it)")
    sidecars = {e["routes"]["file"] for e in entries if isinstance(e.get("routes"), dict)}
    for stray in sorted({p.name for p in layout.sidecars()} - sidecars):
        report.warnings.append(f"{stray} is a routes sidecar in the folder but not in the manifest")
    for partial in layout.partials():
        report.warnings.append(
            f"{partial.name} is a shard being written, or left by a killed run (a rerun finishes it)"
        )
    for temporary in layout.strays():
        report.warnings.append(f"{temporary.name} is a temporary file left by a stopped run (a rerun removes it)")
    seen: dict[str, str] = {}
    for entry in entries:
        report.shards += 1
        try:
            _read_shard(folder, entry, k_setting, seen, report, system)
        except OSError as exc:  # unreadable (permissions, I/O error): a fault like a missing shard
            report.add(Fault("missing", f"cannot read {folder / entry['file']}: {exc.strerror or exc}", entry["file"]))
    return report
