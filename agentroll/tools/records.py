"""One record on its own, for `validate`: exactly the fields of `agentroll.record.schema.Sample`, each of its JSON type
(derived from `Sample`, so a new field is checked without touching this file), values the writer can write,
aligned lengths, and a multi-turn record's history mask and logprobs."""

from __future__ import annotations

import itertools
import math
import types
import typing
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from ..errors import json_kind as json_type
from ..record.schema import OPTIONAL_FIELDS, SCHEMA_VERSION, Sample

WRITTEN_STATUSES = ("completed", "truncated")  # "aborted" is retried, never written (docs/schema.md)


Check = Callable[[Any], str | None]  # None: fine; else what the value is instead


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
            return next((g for g in got if g != json_type(v)), json_type(v))  # an array's item fault, if any

        return check_union
    if origin is list:
        item = _check_for(typing.get_args(hint)[0])

        def check_list(v: Any) -> str | None:
            if type(v) is not list:
                return json_type(v)
            for i, x in enumerate(v):
                got = item(x)
                if got is not None:
                    return f"an array whose item {i} is {got}"
            return None

        return check_list
    ok = _scalar(hint)
    return lambda v: None if ok(v) else json_type(v)


_HINTS = typing.get_type_hints(Sample)
FIELDS: tuple[str, ...] = tuple(f.name for f in fields(Sample))
_CHECKS: dict[str, tuple[Check, str]] = {name: (_check_for(_HINTS[name]), _describe(_HINTS[name])) for name in FIELDS}
# a record may lack a field of schema.OPTIONAL_FIELDS (written before it was added); a head-to-head folder's
# records need their `policy` all the same (`executions`: each execution's policy is its index's)


def record_faults(record: dict[str, Any], stages: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    """(kind, message) for everything wrong with one record on its own: fields, types, values, lengths.
    `stages`: the system's stage names (None: any non-empty name)."""
    faults: list[tuple[str, str]] = []
    missing = [name for name in FIELDS if name not in record and name not in OPTIONAL_FIELDS]
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
            for name in ("response_ranks", "top_token_ids", "top_logprobs", *TEACHER)
            if name in typed and r[name] is not None and len(r[name]) != n
        ]
        if wrong:
            faults.append(("lengths", f"{' and '.join(wrong)} entries where response_token_ids has {n}"))
        for ids, logprobs in (("top_token_ids", "top_logprobs"), ("teacher_top_ids", "teacher_top_logprobs")):
            _top_faults(r, typed, ids, logprobs, faults)
        _teacher_faults(r, typed, faults)
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
    return faults


TEACHER = ("teacher_logprobs", "teacher_ranks", "teacher_top_ids", "teacher_top_logprobs")


def _top_faults(r: dict[str, Any], typed: set[str], ids: str, logprobs: str, faults: list[tuple[str, str]]) -> None:
    """The k most likely tokens per position: as many ids as logprobs, in rank order (logprobs falling)."""
    if not {ids, logprobs} <= typed or r[ids] is None or not r[logprobs]:
        return
    bad = next(
        (
            j
            for j, (a, b) in enumerate(zip(r[ids], r[logprobs], strict=False))
            if len(a) != len(b) or any(x < y for x, y in itertools.pairwise(b))
        ),
        None,
    )
    if bad is not None:
        faults.append(
            (
                "value",
                f"{ids}/{logprobs} at response position {bad}: not the same length, or not in rank order "
                "(logprobs falling)",
            )
        )


def _teacher_faults(r: dict[str, Any], typed: set[str], faults: list[tuple[str, str]]) -> None:
    """A teacher's scores come together (`teacher_ranks` with `teacher_logprobs`, the top k with both), as
    logprobs (never above 0) and ranks from 1."""
    present = [name for name in TEACHER if name in typed and r[name] is not None]
    if not present:
        return
    if "teacher_logprobs" not in present or "teacher_ranks" not in present:
        faults.append(("value", f"{', '.join(present)} without teacher_logprobs and teacher_ranks"))
        return
    if ("teacher_top_ids" in present) != ("teacher_top_logprobs" in present):
        faults.append(("value", "teacher_top_ids and teacher_top_logprobs are not both null or both arrays"))
    above = next((j for j, x in enumerate(r["teacher_logprobs"]) if x > 0), None)
    if above is not None:
        faults.append(("value", f"teacher_logprobs item {above} is {r['teacher_logprobs'][above]}, above 0"))
    low = next((j for j, x in enumerate(r["teacher_ranks"]) if x < 1), None)
    if low is not None:
        faults.append(("value", f"teacher_ranks item {low} is {r['teacher_ranks'][low]}, below 1"))


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
