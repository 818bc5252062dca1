"""`--to megatron`: one `RolloutGroup` per (problem, stage) group and line, its rollouts `TokenRollout`s, as
Megatron-LM's RL agent API declares them (megatron/rl/agent/api.py).

Each sample is a one-turn trajectory: the prompt and response ids, `generation_mask` true on the response
tokens (the model's, per the loss mask), `logprobs` over the generated tokens only (Megatron aligns them to the
positions the mask marks). Megatron computes GRPO advantages itself over each `RolloutGroup`, so our groups
are what make its baseline per stage; `reward` is the record's reward. The run's policy epoch is not recorded:
every token is stamped epoch 0 (`policy_epoch` / `kv_cache_epoch` `[[(0, 0)]]`), no KV-cache evictions.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .common import JsonlWriter, Problem, Record

FILE = "megatron.jsonl"


def token_rollout(record: Record, advantage: float | None) -> dict[str, Any]:
    prompt_ids, response_ids = record["prompt_token_ids"], record["response_token_ids"]
    out: dict[str, Any] = {
        "trajectory": [prompt_ids + response_ids],
        "reward": record["reward"],
        "generation_mask": [[False] * len(prompt_ids) + [bool(m) for m in record["loss_mask"]]],
        "logprobs": [record["response_logprobs"]],
        "env_id": f"agentroll/{record['stage']}",
        "problem_id": record["problem_id"],
        "policy_epoch": [[(0, 0)]],  # per turn, (first token index, epoch) boundaries
        "kv_cache_epoch": [[(0, 0)]],
        "num_evictions": [0],
        # later Megatron (a model with extra='allow' takes it either way): a single-turn trajectory must end in
        # EOS, fill the context, or stop at its stamped cap; a truncated response stopped at the cap it was given
        "generation_cap": len(response_ids) if record["status"] == "truncated" else None,
    }
    if advantage is not None:
        out["advantage"] = advantage
    return out


def write(problems: Iterable[Problem], out: Path) -> int:
    with JsonlWriter(out / FILE) as writer:
        for problem in problems:
            for index_in_batch, group in enumerate(problem.groups):
                rollouts = [token_rollout(r, None if group.advantages is None else group.advantages[i])
                            for i, r in enumerate(group.records)]
                writer.write({"rollouts": rollouts, "batch_id": problem.index, "index_in_batch": index_in_batch})
    return writer.rows
