"""`--to megatron`: one `RolloutGroup` per (problem, stage) group and line, its rollouts `TokenRollout`s, as
Megatron-LM's RL agent API declares them (megatron/rl/agent/api.py).

Each sample is a one-turn trajectory: the prompt and response ids, `generation_mask` true on the response
tokens (the model's, per the loss mask), `logprobs` over the generated tokens only (Megatron aligns them to the
positions the mask marks). Megatron computes GRPO advantages itself over each `RolloutGroup`, so our groups
are what make its baseline per stage; `reward` is the record's reward.

`policy_epoch` comes from the record's `weight_versions` (vLLM's generate API: which policy version made which
response tokens): Megatron's sparse `(start token index, epoch)` boundaries over the whole sequence, the prompt
stamped with the version that made the first response token. A version must be a whole number ("default", what
vLLM names weights never updated, is 0). Without weight versions (/v1/completions) every token is epoch 0.
`kv_cache_epoch` follows `policy_epoch`: vLLM does not say when a cached prefix was computed. No evictions.

Records marked `trainable: false` (a frozen stage's) are left out unless `include_frozen`. A later turn of a
multi-turn conversation is a rollout of its own: its prompt holds the earlier turns (`generation_mask` false).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import UsageError
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
        "policy_epoch": [epochs := policy_epochs(record)],  # per turn, (first token index, epoch) boundaries
        "kv_cache_epoch": [epochs],
        "num_evictions": [0],
        # later Megatron (a model with extra='allow' takes it either way): a single-turn trajectory must end in
        # EOS, fill the context, or stop at its stamped cap; a truncated response stopped at the cap it was given
        "generation_cap": len(response_ids) if record["status"] == "truncated" else None,
    }
    if advantage is not None:
        out["advantage"] = advantage
    return out


def _epoch(version: object, record: Record) -> int:
    if version == "default":
        return 0
    try:
        return int(str(version))
    except ValueError:
        raise UsageError(f"problem {record['problem_id']}: weight version {version!r} is not a whole number, which "
                         "Megatron's policy_epoch needs") from None


def policy_epochs(record: Record) -> list[tuple[int, int]]:
    """`weight_versions` spans (over response token indexes) as boundaries over prompt + response indexes."""
    spans = sorted(record.get("weight_versions") or [], key=lambda s: s["start"])
    offset = len(record["prompt_token_ids"])
    out: list[tuple[int, int]] = []
    for span in spans:
        epoch = _epoch(span.get("version"), record)
        if not out:
            out.append((0, epoch))
        elif out[-1][1] != epoch:
            out.append((offset + int(span["start"]), epoch))
    return out or [(0, 0)]


def write(problems: Iterable[Problem], out: Path) -> int:
    with JsonlWriter(out / FILE) as writer:
        for problem in problems:
            for index_in_batch, group in enumerate(problem.groups):
                rollouts = [token_rollout(r, None if group.advantages is None else group.advantages[i])
                            for i, r in enumerate(group.records)]
                writer.write({"rollouts": rollouts, "batch_id": problem.index, "index_in_batch": index_in_batch})
    return writer.rows
