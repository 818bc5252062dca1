"""Multi-turn conversations as whole trajectories, from the records of one execution.

A record that continues an earlier one (`continues`: its position among the execution's records, in write
order) holds the whole conversation so far in its `prompt_token_ids`, with `history_mask` 1 on the tokens the
model sampled in earlier turns and `history_logprobs` their logprobs (docs/schema.md). So a conversation's
trajectory is its last turn's record: tokens = prompt + response, mask = history_mask + loss_mask, logprobs =
history_logprobs + response_logprobs. A record no later record continues is its own one-turn trajectory (every
record of a three-stage folder).

Frozen turns (`trainable: false`, e.g. a judge served by another model) are not the policy's tokens: unless
`include_frozen`, a trajectory masks their tokens out (mask 0, logprob 0.0), a frozen record is never a
trajectory's last turn (the trajectory ends at its last trainable turn), and a trajectory contained in a longer
one is not emitted again. With `include_frozen` the caller asked to train on them: a frozen call's response
tokens count as generated (mask 1, its own logprobs), although its record's `loss_mask` is 0 throughout
(`own_mask`), since a sample kept only to be masked out would train nothing.

A call the overlong filter dropped (`--overlong-filter drop`, `shaping.dropped`) is not a frozen stage: it is
never a trajectory's last turn and its tokens inside a longer conversation are never trained, `include_frozen`
or not.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..settings.shaping import dropped

Record = dict[str, Any]


@dataclass(slots=True)
class Trajectory:
    """One conversation up to its last (trainable) turn, `record`. `start` is the length of the first turn's
    prompt: the model's part of the conversation begins there. `turns`: records folded in (1: a single call)."""

    record: Record
    position: int  # of `record` in its execution
    first: Record  # the conversation's first turn (`record` itself for a single call)
    start: int
    turns: int
    tokens: list[int]
    mask: list[int]
    logprobs: list[float]
    chain: list[Record] = field(default_factory=list)  # the conversation's records, first turn to `record`

    def spans(self) -> list[tuple[int, int]]:
        """Per turn, (its prompt's length, its end) in `tokens`: turn j's response is `tokens[a:b]`."""
        return [
            (len(r["prompt_token_ids"]), len(r["prompt_token_ids"]) + len(r["response_token_ids"])) for r in self.chain
        ]


def executions(records: Iterable[Record]) -> Iterator[list[Record]]:
    """Consecutive records of one `rollout_id`: the executions, in write order."""
    current: list[Record] = []
    for record in records:
        if current and record.get("rollout_id") != current[0].get("rollout_id"):
            yield current
            current = []
        current.append(record)
    if current:
        yield current


def _parent(execution: list[Record], i: int) -> int | None:
    record = execution[i]
    parent = record.get("continues")
    if parent is None:
        return None
    if type(parent) is not int or not 0 <= parent < i:
        raise ValueError(
            f"execution {record.get('rollout_id')}: record {i} ({record.get('stage')}) continues "
            f"{parent!r}, not an earlier record of its execution"
        )
    return parent


def _chain(execution: list[Record], i: int) -> list[int]:
    """`i` and the records it continues, back to the first turn: [i, parent, ..., first]."""
    chain = [i]
    while (parent := _parent(execution, chain[-1])) is not None:
        chain.append(parent)
    return chain


def trainable(record: Record) -> bool:
    return record.get("trainable", True) is not False


def kept(record: Record, include_frozen: bool) -> bool:
    """Whether a converter trains the record: a trainable one, or a frozen one with `include_frozen`; never one
    the overlong filter dropped."""
    return not dropped(record) and (include_frozen or trainable(record))


def own_mask(record: Record, include_frozen: bool) -> list[int]:
    """The record's response mask as a converter trains it: its `loss_mask`, or, for a frozen record kept with
    `include_frozen`, 1 on every response token (they were generated, by the frozen model)."""
    if include_frozen and not trainable(record) and not dropped(record):
        return [1] * len(record["response_token_ids"])
    return [int(m) for m in record["loss_mask"]]


def single(record: Record, include_frozen: bool = False, position: int = 0) -> Trajectory:
    """One call as a one-turn trajectory: the prompt (mask 0, logprob 0.0) then the response."""
    prompt, response = record["prompt_token_ids"], record["response_token_ids"]
    return Trajectory(
        record,
        position,
        record,
        len(prompt),
        1,
        prompt + response,
        [0] * len(prompt) + own_mask(record, include_frozen),
        [0.0] * len(prompt) + [float(x) for x in record["response_logprobs"]],
        [record],
    )


def ends(execution: list[Record], include_frozen: bool = False) -> list[int]:
    """Positions of the records that end a trajectory, in write order: the records trained (`kept`) that no
    other such record continues, directly or through other turns."""
    chosen = [i for i, r in enumerate(execution) if kept(r, include_frozen)]
    inside = {j for i in chosen for j in _chain(execution, i)[1:]}
    return [i for i in chosen if i not in inside]


def trajectory(execution: list[Record], i: int, include_frozen: bool = False) -> Trajectory:
    """The conversation that record `i` of the execution ends. Raises ValueError for a record whose history
    does not fit its prompt, or whose `continues` is no earlier record."""
    record = execution[i]
    prompt, response = record["prompt_token_ids"], record["response_token_ids"]
    history, history_logprobs = record.get("history_mask"), record.get("history_logprobs")
    whole = history is None and history_logprobs is None
    if not whole and not (
        history is not None and history_logprobs is not None and len(history) == len(history_logprobs) == len(prompt)
    ):
        raise ValueError(
            f"execution {record.get('rollout_id')}: record {i} ({record.get('stage')}) has a "
            f"history_mask/history_logprobs that does not cover its {len(prompt)} prompt tokens"
        )
    if not len(response) == len(record["loss_mask"]) == len(record["response_logprobs"]):
        raise ValueError(
            f"execution {record.get('rollout_id')}: record {i} ({record.get('stage')}): "
            f"{len(response)} response tokens, {len(record['response_logprobs'])} logprobs, "
            f"{len(record['loss_mask'])} loss mask entries"
        )
    mask = [int(m) for m in history] if history is not None else [0] * len(prompt)
    logprobs = [float(x) for x in history_logprobs] if history_logprobs is not None else [0.0] * len(prompt)
    mask += own_mask(record, include_frozen)
    logprobs += [float(x) for x in record["response_logprobs"]]
    chain = _chain(execution, i)
    for j in chain[1:]:
        earlier = execution[j]
        if not trainable(earlier):
            begin = len(earlier["prompt_token_ids"])
            end = min(begin + len(earlier["response_token_ids"]), len(prompt))
            train = kept(earlier, include_frozen)
            for k in range(begin, end):  # a frozen turn: left out, or (include_frozen) trained as generated
                if train:
                    mask[k], logprobs[k] = 1, float(earlier["response_logprobs"][k - begin])
                else:
                    mask[k], logprobs[k] = 0, 0.0
    first = execution[chain[-1]]
    return Trajectory(
        record,
        i,
        first,
        len(first["prompt_token_ids"]),
        len(chain),
        prompt + response,
        mask,
        logprobs,
        [execution[j] for j in reversed(chain)],
    )


def trajectories(execution: list[Record], include_frozen: bool = False) -> list[Trajectory]:
    """Every trajectory of an execution (see `ends`), in write order."""
    return [trajectory(execution, i, include_frozen) for i in ends(execution, include_frozen)]


def first_prompt(found: Trajectory) -> str:
    """The conversation's first prompt, as text."""
    return str(found.first.get("prompt", ""))


def after_first_prompt(found: Trajectory) -> str:
    """Everything after the first prompt, as text: what the last turn's prompt adds to it, then its response
    (informative only: trainers take the ids)."""
    first, prompt = first_prompt(found), str(found.record.get("prompt", ""))
    return (prompt[len(first) :] if prompt.startswith(first) else "") + str(found.record.get("response", ""))


def runs(mask: list[int], begin: int, end: int) -> list[tuple[int, int, bool]]:
    """`mask[begin:end]` as maximal runs (start, end, is the model's)."""
    out: list[tuple[int, int, bool]] = []
    for k in range(begin, end):
        on = bool(mask[k])
        if out and out[-1][2] == on:
            out[-1] = (out[-1][0], k + 1, on)
        else:
            out.append((k, k + 1, on))
    return out
