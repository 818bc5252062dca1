"""`--to skyrl`: one row per conversation (or call), each key one of SkyRL's `GeneratorOutput` fields
(skyrl/train/generators/base.py) holding this trajectory's entry, so that collecting a batch of rows key by key
gives a `GeneratorOutput` (docs/convert.md has the function).

`prompt_token_ids` is the first prompt, `response_ids` everything after it, `loss_masks` 1 on the model's tokens
and 0 on the tokens injected between turns, `rollout_logprobs` the sampled logprobs (0.0 off the model's
tokens), `rewards` the record's reward (a float: SkyRL's per-trajectory form), `stop_reasons` vLLM's
`stop`/`length`, `trajectory_ids` a `TrajectoryID`'s fields: `instance_id` = "problem_id/stage", the group SkyRL's
GRPO normalizes over (`ppo_utils.compute_grpo_outcome_advantage`, Bessel std, a group of one keeps its reward),
`repetition_id` the sample's place in it. SkyRL computes the advantages itself: `--advantage` is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .common import JsonlWriter, Problem, Record, group_name
from .trajectory import Trajectory

FILE = "skyrl.jsonl"


def row(record: Record, found: Trajectory, repetition: int) -> dict[str, Any]:
    start = found.start
    return {
        "prompt_token_ids": found.tokens[:start],
        "response_ids": found.tokens[start:],
        "rewards": record["reward"],
        "loss_masks": found.mask[start:],
        "stop_reasons": "length" if record["status"] == "truncated" else "stop",
        "rollout_logprobs": found.logprobs[start:],
        "trajectory_ids": {"instance_id": group_name(record), "repetition_id": repetition},
        "env_metrics": {
            "problem_id": record["problem_id"],
            "stage": record["stage"],
            "rollout_id": record["rollout_id"],
            "raw_reward": record["raw_reward"],
        },
    }


def write(problems: Iterable[Problem], out: Path, include_frozen: bool) -> int:
    with JsonlWriter(out / FILE) as writer:
        for problem in problems:
            for group in problem.groups:
                for repetition, (record, found, _) in enumerate(group.items(include_frozen)):
                    writer.write(row(record, found, repetition))
    return writer.rows
