"""`--to dpo`: preference pairs within a (problem, stage) group, for TRL's `DPOTrainer` and token-exact DPO.

A pair is a higher-reward and a lower-reward response to the identical `prompt_token_ids`: all solvers of a
problem share their prompt; a rewriter shares it with the other rewriters of its execution (they saw the same
solutions); a selector, alone in its execution, pairs only when two executions showed it the same rewrites.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .common import ChatMessages, JsonlWriter, Problem, Record, StageGroup, prompt_messages, response_messages

FILE = "dpo.jsonl"


def pairs(group: StageGroup, cap: int | None = None) -> list[tuple[Record, Record]]:
    """(chosen, rejected) pairs of the group: every two samples with the same prompt ids and different rewards.
    Under a cap, the largest reward gaps come first, then pairs of earlier samples, ordered by the later of the
    two, so that the pairs kept spread over the group's samples instead of repeating its first one."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, record in enumerate(group.records):
        by_prompt.setdefault(tuple(record["prompt_token_ids"]), []).append(i)
    rewards = [float(r["reward"]) for r in group.records]
    found = [
        (rewards[a] - rewards[b], a, b)
        for members in by_prompt.values()
        for a in members
        for b in members
        if rewards[a] > rewards[b]
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
    }


def write(problems: Iterable[Problem], out: Path, chat: ChatMessages | None, max_pairs_per_group: int | None) -> int:
    with JsonlWriter(out / FILE) as writer:
        for problem in problems:
            for group in problem.groups:
                for chosen, rejected in pairs(group, max_pairs_per_group):
                    writer.write(row(chosen, rejected, chat))
    return writer.rows
