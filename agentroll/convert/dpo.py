"""`--to dpo`: preference pairs within a (problem, stage) group, for TRL's `DPOTrainer` and token-exact DPO.

A pair is a higher-reward and a lower-reward response to the identical `prompt_token_ids`: all solvers of a
problem share their prompt; a rewriter shares it with the other rewriters of its execution (they saw the same
solutions); a selector, alone in its execution, pairs only when two executions showed it the same rewrites.

In a head-to-head folder (`generate --policy`) each policy's samples are a group of their own; with
`--across-policies` the chosen and the rejected response come from two different policies on the same prompt
(`across_policies`): the policies' first prompts of a problem must then be the same ids, else the conversion is
refused with the reason (their chat templates differ: there is no one prompt to prefer a response to).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .common import JsonlWriter, Problem, Record, StageGroup
from .messages import ChatMessages, prompt_messages, response_messages

FILE = "dpo.jsonl"


def pairs(group: StageGroup, cap: int | None = None, across: bool = False) -> list[tuple[Record, Record]]:
    """(chosen, rejected) pairs of the group: every two samples with the same prompt ids and different rewards
    (`across`: of two different policies). Under a cap, the largest reward gaps come first, then pairs of earlier
    samples, ordered by the later of the two, so that the pairs kept spread over the group's samples instead of
    repeating its first one."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, record in enumerate(group.records):
        by_prompt.setdefault(tuple(record["prompt_token_ids"]), []).append(i)
    rewards = [float(r["reward"]) for r in group.records]
    policies = [r.get("policy") for r in group.records]
    found = [
        (rewards[a] - rewards[b], a, b)
        for members in by_prompt.values()
        for a in members
        for b in members
        if rewards[a] > rewards[b] and (not across or policies[a] != policies[b])
    ]
    found.sort(key=lambda p: (-p[0], max(p[1], p[2]), p[1], p[2]))
    if cap is not None:
        found = found[:cap]
    return [(group.records[a], group.records[b]) for _, a, b in found]


def row(chosen: Record, rejected: Record, chat: ChatMessages | None) -> dict[str, Any]:
    """One pair: TRL's preference columns (`prompt`, `chosen`, `rejected`: conversational when `chat` is given,
    else the standard layout of text) next to the token-exact ids and logprobs of the records."""
    if chat is not None:
        prompt: Any = prompt_messages(chat, chosen)
        chosen_value: Any = response_messages(chosen)
        rejected_value: Any = response_messages(rejected)
    else:
        prompt, chosen_value, rejected_value = chosen["prompt"], chosen["response"], rejected["response"]
    return {
        "problem_id": chosen["problem_id"],
        "stage": chosen["stage"],
        "prompt": prompt,
        "prompt_token_ids": chosen["prompt_token_ids"],
        "chosen": chosen_value,
        "chosen_token_ids": chosen["response_token_ids"],
        "chosen_logprobs": chosen["response_logprobs"],
        "chosen_reward": chosen["reward"],
        "rejected": rejected_value,
        "rejected_token_ids": rejected["response_token_ids"],
        "rejected_logprobs": rejected["response_logprobs"],
        "rejected_reward": rejected["reward"],
        **policies_of(chosen, rejected),
    }


def policies_of(chosen: Record, rejected: Record) -> dict[str, Any]:
    """A head-to-head folder's pair says whose responses it holds; other folders' rows are as they were."""
    if chosen.get("policy") is None:
        return {}
    return {"chosen_policy": chosen["policy"], "rejected_policy": rejected["policy"]}


def across_policies(problems: Iterable[Problem], first_stage: str) -> Iterator[Problem]:
    """Each problem with one group per stage holding every policy's samples (for `pairs(across=True)`). The
    problem's prompt is each policy's first turn of `first_stage`: those of two policies that differ refuse the
    conversion, naming the problem, the policies and the first token where they part."""
    for problem in problems:
        merged: dict[str, StageGroup] = {}
        for group in problem.groups:
            merged.setdefault(group.stage, StageGroup(group.problem_id, group.stage, [])).records.extend(group.records)
        if first_stage in merged:
            same_prompt(merged[first_stage])
        yield Problem(problem.index, problem.problem_id, list(merged.values()))


def same_prompt(group: StageGroup) -> None:
    prompts: dict[Any, tuple[int, ...]] = {}
    for record in group.records:
        if not record.get("turn"):
            prompts.setdefault(record.get("policy"), tuple(record["prompt_token_ids"]))
    (first, ids), *others = prompts.items() if prompts else [(None, ())]
    for policy, other in others:
        if other != ids:
            at = next(
                (i for i, (x, y) in enumerate(zip(ids, other, strict=False)) if x != y), min(len(ids), len(other))
            )
            raise UsageError(
                f"--across-policies: problem {group.problem_id}: policies {first} and {policy} were given "
                f"different {group.stage} prompt ids (from token {at} on: {len(ids)} and {len(other)} tokens); "
                "their tokenizers or chat templates differ, so no pair can share a prompt. Convert each policy "
                "on its own (--policy NAME)"
            )


def write(
    problems: Iterable[Problem],
    out: Path,
    chat: ChatMessages | None,
    max_pairs_per_group: int | None,
    across: str | None = None,
) -> int:
    """`across`: pairs across policies, checking the prompts of this stage (`across_policies`)."""
    if across is not None:
        problems = across_policies(problems, across)
    with JsonlWriter(out / FILE) as writer:
        for problem in problems:
            for group in problem.groups:
                for chosen, rejected in pairs(group, max_pairs_per_group, across is not None):
                    writer.write(row(chosen, rejected, chat))
    return writer.rows
