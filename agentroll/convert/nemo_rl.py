"""`--to nemo-rl` and `--to nemo-rl-dpo`: what NVIDIA NeMo-RL takes.

`nemo-rl` (`nemo_rl.jsonl`): one `DatumSpec` (nemo_rl/data/interfaces.py) per conversation (or call) after its
rollout, as NeMo-RL's GRPO holds it (nemo_rl/experience/rollouts.py): a `message_log` whose messages carry
`token_ids` and, for the tokens the model sampled, `generation_logprobs`. The first prompt is a `user` message;
each call's response is an `assistant` message with its logprobs; the tokens injected between calls (the
template's turn separator, the next message) a `user` message; tokens of a response that are not the model's own
(a forced token, a frozen call's unless `include_frozen`) an `assistant` message without logprobs, which
`grpo.add_grpo_token_loss_masks_and_generation_logprobs` leaves out of the loss, as it does the earlier turns of a
prompt. Only the first prompt's and the responses' `content` is text; the other messages' is "" (trainers take
the token ids). `total_reward` is the record's reward, `length` the conversation's token count, `idx` its number.

NeMo-RL computes GRPO baselines itself per identical prompt token ids (nemo_rl/algorithms/utils.py
`calculate_baseline_and_std_per_prompt`: leave-one-out by default, Bessel std), not per (problem, stage): a
problem's solvers share their prompt, a rewriter group splits per execution. `--advantage` is refused.

`nemo-rl-dpo` (`nemo_rl_dpo.jsonl`): NeMo-RL's preference rows (nemo_rl/data/datasets/preference_datasets/
preference_dataset.py): `context` (the prompt's chat messages, recovered as for `--to dpo`), `completions`
`[{"rank": 0, "completion": [chosen]}, {"rank": 1, "completion": [rejected]}]` (lower rank preferred), with the
pairs of `--to dpo` and their token ids and rewards alongside. NeMo-RL's `preference_preprocessor` renders the
messages through the chat template itself (not the sampled ids).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .common import JsonlWriter, Problem, Record, policy_of
from .dpo import across_policies, pairs, policies_of
from .messages import ChatMessages, prompt_messages, response_messages
from .trajectory import Trajectory, first_prompt, runs

FILE = "nemo_rl.jsonl"
DPO_FILE = "nemo_rl_dpo.jsonl"


def message_log(found: Trajectory) -> list[dict[str, Any]]:
    tokens, mask, logprobs = found.tokens, found.mask, found.logprobs
    log: list[dict[str, Any]] = [{"role": "user", "content": first_prompt(found), "token_ids": tokens[: found.start]}]
    done = found.start
    for turn, (begin, end) in zip(found.chain, found.spans(), strict=True):
        if begin > done:
            log.append({"role": "user", "content": "", "token_ids": tokens[done:begin]})
        pieces = runs(mask, begin, end)
        for a, b, on in pieces:
            message: dict[str, Any] = {
                "role": "assistant",
                "content": str(turn["response"]) if len(pieces) == 1 else "",
                "token_ids": tokens[a:b],
            }
            if on:
                message["generation_logprobs"] = logprobs[a:b]
            log.append(message)
        done = end
    return log


def datum(record: Record, found: Trajectory, idx: int) -> dict[str, Any]:
    label = record.get("label")
    return {
        "message_log": message_log(found),
        "length": len(found.tokens),
        "extra_env_info": {
            "problem_id": record["problem_id"],
            "stage": record["stage"],
            "rollout_id": record["rollout_id"],
            "label": None if label is None else str(label),
            **policy_of(record),
            **({"reward_components": record["reward_components"]} if record.get("reward_components") else {}),
        },
        "loss_multiplier": 1.0,
        "idx": idx,
        "task_name": f"agentroll/{record['stage']}",
        "total_reward": record["reward"],
        "truncated": record["status"] == "truncated",
    }


def write(problems: Iterable[Problem], out: Path, include_frozen: bool) -> int:
    with JsonlWriter(out / FILE) as writer:
        for problem in problems:
            for group in problem.groups:
                for record, found, _ in group.items(include_frozen):
                    writer.write(datum(record, found, writer.rows))
    return writer.rows


def preference(chosen: Record, rejected: Record, chat: ChatMessages) -> dict[str, Any]:
    return {
        "context": prompt_messages(chat, chosen),
        "completions": [
            {"rank": 0, "completion": response_messages(chosen)},
            {"rank": 1, "completion": response_messages(rejected)},
        ],
        "problem_id": chosen["problem_id"],
        "stage": chosen["stage"],
        "prompt_token_ids": chosen["prompt_token_ids"],
        "chosen_token_ids": chosen["response_token_ids"],
        "rejected_token_ids": rejected["response_token_ids"],
        "chosen_reward": chosen["reward"],
        "rejected_reward": rejected["reward"],
        **policies_of(chosen, rejected),
    }


def write_dpo(
    problems: Iterable[Problem], out: Path, chat: ChatMessages, max_pairs: int | None, across: str | None = None
) -> int:
    """`across`: pairs across policies (`dpo.across_policies`)."""
    if across is not None:
        problems = across_policies(problems, across)
    with JsonlWriter(out / DPO_FILE) as writer:
        for problem in problems:
            for group in problem.groups:
                for chosen, rejected in pairs(group, max_pairs, across is not None):
                    writer.write(preference(chosen, rejected, chat))
    return writer.rows
