"""`--to trl`: one row per sample with what TRL's GRPO `rollout_func` returns for a completion, so a replay
`rollout_func` can hand recorded rollouts to `GRPOTrainer` token for token.

TRL requires `prompt_ids`, `completion_ids` and `logprobs` (lists per completion) and reads an optional
`env_mask` (1 on the model's own tokens); any other key it forwards to the reward functions, which is how
`reward` (and `advantage`) reach them, and a teacher's scores (`teacher_logprobs`, and `teacher_top_ids` /
`teacher_top_logprobs` with --teacher-logprobs K: per completion token) for a distillation loss. `prompt` is the
rendered prompt text, for the prompt column of the dataset the trainer iterates; the rows of one (problem, stage)
group are consecutive (in a head-to-head folder, (problem, policy, stage), each row naming its `policy`).

Records marked `trainable: false` (a frozen stage's) are left out unless `include_frozen`. A later turn of a
multi-turn conversation is a row of its own: its `prompt_ids` hold the earlier turns (not trained on here).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .common import JsonlWriter, Problem, Record, policy_of
from .trajectory import own_mask

FILE = "trl.jsonl"


def row(record: Record, advantage: float | None) -> dict[str, Any]:
    out = {
        "problem_id": record["problem_id"],
        "stage": record["stage"],
        **policy_of(record),
        "prompt": record["prompt"],
        "prompt_ids": record["prompt_token_ids"],
        "completion_ids": record["response_token_ids"],
        "logprobs": record["response_logprobs"],
        "env_mask": own_mask(record, True),  # a frozen record is here only with include_frozen: trained as generated
        "reward": record["reward"],
    }
    if advantage is not None:
        out["advantage"] = advantage
    if record.get("teacher_logprobs") is not None:  # a teacher's scores: columns a trainer's loss may read
        out["teacher_logprobs"] = record["teacher_logprobs"]
        if record.get("teacher_top_ids") is not None:
            out["teacher_top_ids"], out["teacher_top_logprobs"] = (
                record["teacher_top_ids"],
                record["teacher_top_logprobs"],
            )
    return out


def write(problems: Iterable[Problem], out: Path) -> int:
    with JsonlWriter(out / FILE) as writer:
        for problem in problems:
            for group in problem.groups:
                for i, record in enumerate(group.records):
                    writer.write(row(record, None if group.advantages is None else group.advantages[i]))
    return writer.rows
