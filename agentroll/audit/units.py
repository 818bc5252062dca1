"""What is teacher-forced: a folder's records as units of one forward pass each, and the checks that need no model.

A unit is one conversation up to a record no later record continues (a single call is a one-turn
conversation): its tokens are that last record's prompt + response, which hold every earlier turn token for
token (docs/schema.md, "Multi-turn"). One forward pass over them gives the trainer's logprob of every token
the model sampled in any turn; each turn's tokens are compared with that turn's own record, under its own
sampling parameters. A record is audited in one unit only, the first that holds it. When a conversation does
not extend its earlier turns token for token (a fault of its own), each of its records is its own unit.

Folders are read twice, through `agentroll.read_records`: once to list the units (a few numbers each), once to
build the chosen ones, so a sample of a large folder never holds the folder in memory.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..convert.trajectory import executions
from ..folder import read_records

Record = dict[str, Any]
IDENTITY = ("problem_id", "rollout_id", "stage", "turn", "worker", "sample_index")


def identity(record: Record) -> dict[str, Any]:
    """How a report names a record."""
    return {key: record.get(key) for key in IDENTITY}


@dataclass(slots=True)
class Turn:
    """One audited record inside a unit: its response starts at `begin` in the unit's tokens."""

    record: Record
    begin: int
    faults: list[tuple[str, str]] = field(default_factory=list)  # (kind, message)


@dataclass(slots=True)
class Unit:
    tokens: list[int]
    turns: list[Turn]  # the records compared in this pass (may be empty: context only)
    stage: str  # of the last record: what --sample stratifies by
    first: Record  # the conversation's first record (whose prompt a template check re-renders)


@dataclass(slots=True)
class Selection:
    """Which records an audit compares: `stages` (None: all), frozen ones only with `include_frozen`, and only
    records of the run's own model (`settings.model`) unless their stage is named in `stages`."""

    stages: frozenset[str] | None
    include_frozen: bool
    model: str | None
    skipped: dict[str, dict[str, int]] = field(default_factory=dict)  # stage -> reason -> records
    policy: str | None = None  # a head-to-head folder: only this policy's records
    teacher: bool = False  # only records a teacher scored (`audit --against teacher`)

    def wants(self, record: Record, count: bool = True) -> bool:
        stage = str(record.get("stage"))
        reason = None
        if self.policy is not None and record.get("policy") != self.policy:
            reason = f"another policy ({record.get('policy')})"
        elif self.stages is not None and stage not in self.stages:
            reason = "stage not asked for"
        elif not self.include_frozen and record.get("trainable", True) is False:
            reason = "frozen (trainable: false)"
        elif self.stages is None and self.model and record.get("model") not in (None, self.model):
            reason = f"another model ({record.get('model')})"
        elif self.teacher and record.get("teacher_logprobs") is None:
            reason = "not scored by a teacher"
        if reason is not None and count:
            bucket = self.skipped.setdefault(stage, {})
            bucket[reason] = bucket.get(reason, 0) + 1
        return reason is None


def _parent(execution: list[Record], i: int) -> int | None:
    parent = execution[i].get("continues")
    return parent if type(parent) is int and 0 <= parent < i else None


def _extends(later: Record, earlier: Record) -> bool:
    head = earlier["prompt_token_ids"] + earlier["response_token_ids"]
    return later["prompt_token_ids"][: len(head)] == head


def _chains(execution: list[Record]) -> list[list[int]]:
    """Each conversation of an execution as its records' positions, first turn first; a record no later record
    continues ends one. A conversation whose turns do not extend each other is split into one-record chains."""
    continued = {p for i in range(len(execution)) if (p := _parent(execution, i)) is not None}
    out = []
    for end in range(len(execution)):
        if end in continued:
            continue
        chain = [end]
        while (parent := _parent(execution, chain[-1])) is not None:
            chain.append(parent)
        chain.reverse()
        last = execution[end]
        if all(_extends(last, execution[j]) for j in chain[:-1]):
            out.append(chain)
        else:
            out.extend([j] for j in chain)
    return out


def index(folder: str | os.PathLike[str], selection: Selection) -> list[tuple[int, int, str]]:
    """Every unit with something to compare, as (execution number, last record's position, its stage); fills
    `selection.skipped` on the way."""
    found = []
    for number, execution in enumerate(executions(read_records(folder))):
        wanted = [selection.wants(record) for record in execution]  # counts the skipped ones, once each
        seen: set[int] = set()
        for chain in _chains(execution):
            fresh = [j for j in chain if j not in seen and wanted[j]]
            seen.update(chain)
            if fresh:
                found.append((number, chain[-1], str(execution[chain[-1]].get("stage"))))
    return found


def stratified(units: list[tuple[int, int, str]], n: int | None, seed: int) -> list[tuple[int, int, str]]:
    """`n` units spread over the stages in proportion to their counts (largest remainder, at least one per stage
    while `n` allows), drawn with `random.Random(seed)`: the same sample every time. None: all of them."""
    if n is None or n >= len(units):
        return units
    by_stage: dict[str, list[tuple[int, int, str]]] = {}
    for unit in units:
        by_stage.setdefault(unit[2], []).append(unit)
    stages = sorted(by_stage, key=lambda s: (-len(by_stage[s]), s))
    share = {s: n * len(by_stage[s]) / len(units) for s in stages}
    take = {s: min(len(by_stage[s]), int(share[s])) for s in stages}
    for s in stages:  # a stage too small for its proportional share still gets one
        if take[s] == 0 and sum(take.values()) < n:
            take[s] = 1
    for s in sorted(stages, key=lambda s: (-(share[s] - int(share[s])), s)):
        if sum(take.values()) >= n:
            break
        if take[s] < len(by_stage[s]):
            take[s] += 1
    for s in stages:  # stages that were full left some over: the largest with room take them
        take[s] += min(len(by_stage[s]) - take[s], n - sum(take.values()))
    rng = random.Random(seed)
    chosen = [u for s in stages for u in rng.sample(by_stage[s], take[s])]
    return sorted(chosen)


def build(folder: str | os.PathLike[str], chosen: list[tuple[int, int, str]], selection: Selection) -> Iterator[Unit]:
    """The chosen units, in folder order, with the faults found without a model on each turn."""
    wanted: dict[int, set[int]] = {}
    for number, end, _ in chosen:
        wanted.setdefault(number, set()).add(end)
    for number, execution in enumerate(executions(read_records(folder, masks=True))):
        if number not in wanted:
            continue
        seen: set[int] = set()
        for chain in _chains(execution):
            fresh = [j for j in chain if j not in seen and selection.wants(execution[j], count=False)]
            seen.update(chain)
            if chain[-1] not in wanted[number] or not fresh:
                continue
            last = execution[chain[-1]]
            turns = [Turn(execution[j], len(execution[j]["prompt_token_ids"])) for j in fresh]
            for turn in turns:
                turn.faults += history_faults(last, turn) if turn.record is not last else []
            yield Unit(
                last["prompt_token_ids"] + last["response_token_ids"],
                turns,
                str(last.get("stage")),
                execution[chain[0]],
            )


def history_faults(last: Record, turn: Turn) -> list[tuple[str, str]]:
    """An earlier turn's tokens as the last turn's history should hold them (what a trainer reads for the whole
    conversation): the turn's loss mask, and its logprob wherever the mask is 1 (a frozen turn may be 0)."""
    mask, logprobs = last.get("history_mask"), last.get("history_logprobs")
    if mask is None or logprobs is None:
        return [
            (
                "history",
                f"turn {last.get('turn')} continues turn {turn.record.get('turn')} but has no "
                "history_mask / history_logprobs",
            )
        ]
    frozen = turn.record.get("trainable", True) is False
    own, loss = turn.record["response_logprobs"], turn.record["loss_mask"]
    for j, (value, m) in enumerate(zip(own, loss, strict=False)):
        p = turn.begin + j
        if p >= len(mask) or p >= len(logprobs):
            return [
                (
                    "history",
                    f"turn {last.get('turn')}'s history is shorter than turn {turn.record.get('turn')}'s response",
                )
            ]
        if mask[p] != m and not (frozen and mask[p] == 0):
            return [
                (
                    "history",
                    f"turn {last.get('turn')}'s history_mask is {mask[p]} on token {j} of turn "
                    f"{turn.record.get('turn')}'s response, whose loss_mask is {m}",
                )
            ]
        if mask[p] == 1 and logprobs[p] != value:
            return [
                (
                    "history",
                    f"turn {last.get('turn')}'s history_logprobs hold {logprobs[p]} for token {j} of "
                    f"turn {turn.record.get('turn')}'s response, whose record holds {value}",
                )
            ]
    return []


def record_faults(record: Record, eos: frozenset[int], max_context: int | None) -> list[tuple[str, str]]:
    """What a record says about how it ended, against its own tokens (vLLM stops at the first EOS or stop token
    id, which it keeps in the ids; `length` means max_tokens, or the context window, was reached)."""
    faults: list[tuple[str, str]] = []
    ids, logprobs = record["response_token_ids"], record["response_logprobs"]
    if len(logprobs) != len(ids):
        return [("lengths", f"{len(ids)} response tokens but {len(logprobs)} logprobs")]
    if not record["prompt_token_ids"]:
        return [("lengths", "an empty prompt: no logit predicts the first response token")]
    finish, stop, status = record.get("finish_reason"), record.get("stop_reason"), record.get("status")
    expected = {"stop": "completed", "length": "truncated"}.get(str(finish))
    if expected is None or status != expected:
        faults.append(("status", f"status {status!r} with finish_reason {finish!r}"))
    max_tokens = (record.get("sampling") or {}).get("max_tokens")
    early = [j for j, t in enumerate(ids[:-1]) if t in eos]
    if early:
        faults.append(
            ("eos", f"EOS token {ids[early[0]]} at response position {early[0]} of {len(ids)}: vLLM stops at the first")
        )
    if finish == "stop":
        if not ids and not isinstance(stop, str):
            faults.append(("eos", "finish_reason stop with an empty response (the stop token is kept in the ids)"))
        elif stop is None and eos and ids[-1] not in eos:
            faults.append(
                (
                    "eos",
                    f"finish_reason stop, stop_reason null, but the last token {ids[-1]} is not an "
                    f"EOS token ({', '.join(map(str, sorted(eos)))})",
                )
            )
        elif isinstance(stop, int) and not isinstance(stop, bool) and ids and ids[-1] != stop:
            faults.append(("eos", f"stop_reason {stop} but the last token is {ids[-1]}"))
        if isinstance(max_tokens, int) and len(ids) > max_tokens:
            faults.append(("length", f"{len(ids)} response tokens, more than max_tokens {max_tokens}"))
    elif finish == "length":
        if ids and ids[-1] in eos:
            faults.append(("eos", f"finish_reason length but the last token {ids[-1]} is EOS (vLLM would say stop)"))
        total = len(record["prompt_token_ids"]) + len(ids)
        full = max_context is not None and total >= max_context
        if isinstance(max_tokens, int) and len(ids) != max_tokens and not full:
            faults.append(
                (
                    "length",
                    f"finish_reason length after {len(ids)} tokens, but max_tokens is "
                    f"{max_tokens} and the context ({total} of {max_context}) is not full",
                )
            )
    return faults
