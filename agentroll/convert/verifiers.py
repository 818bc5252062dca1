"""`--to verifiers`: `results.jsonl` and `metadata.json` as verifiers saves an evaluation
(verifiers/legacy/utils/save_utils.py `save_outputs`, `save_metadata`), one `RolloutOutput` per conversation (or
call), with a `trajectory` of one `TrajectoryStep` per call (verifiers/legacy/types.py).

A step's `tokens` are the call's own: `prompt_ids` (the conversation so far, as verifiers' clients send it),
`prompt_mask` 0 throughout (as every verifiers client writes it), `completion_ids`, `completion_mask` (1 on the
model's tokens; 0 on a frozen turn's unless `include_frozen`), `completion_logprobs`, `is_truncated`, and with
`--return-sampling-mask` `kept_tokens` (verifiers' `KeptTokens`: `ids`, `counts` base64 int32, `convert.masks`).
`prompt` / `completion` are single text messages holding the rendered prompt and the response (the records keep
no chat messages; trainers take the tokens). `example_id` numbers the (problem, stage) groups: verifiers and
prime-rl group rollouts by it (metadata's `rollouts_per_example` is outputs // examples, as verifiers computes
it: our groups differ in size). `reward` is the record's; `advantage` (on the output and every step) follows
verifiers' rubric, reward minus the group's mean (`--advantage mean`, the default), or `grpo` / `none`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import masks
from .common import JsonlWriter, Problem, Record, policy_of
from .trajectory import Trajectory

FILE = "results.jsonl"
METADATA = "metadata.json"
_SPAN = {"start": 0.0, "end": 0.0, "duration": 0.0}
_SPANS = {"spans": [], "duration": 0.0}
TIMING = {
    "start_time": 0.0,
    "setup": _SPAN,
    "generation": _SPAN,
    "scoring": _SPAN,
    "model": _SPANS,
    "env": _SPANS,
    "total": 0.0,
    "overhead": 0.0,
}  # RolloutTiming as dumped; nothing is timed offline


def _message(role: str, content: str) -> list[dict[str, str]]:
    return [{"role": role, "content": content}]


def step(turn: Record, found: Trajectory, begin: int, end: int, advantage: float | None) -> dict[str, Any]:
    truncated = turn["status"] == "truncated"
    return {
        "prompt": _message("user", str(turn["prompt"])),
        "completion": _message("assistant", str(turn["response"])),
        "response": {
            "id": f"{turn['rollout_id']}/{turn['stage']}/{turn['worker']}",
            "created": 0,
            "model": str(turn.get("model", "")),
            "usage": None,
            "message": {
                "role": "assistant",
                "content": str(turn["response"]),
                "finish_reason": "length" if truncated else "stop",
                "is_truncated": truncated,
                "tokens": None,
            },
        },
        "tokens": {
            "prompt_ids": turn["prompt_token_ids"],
            "prompt_mask": [0] * begin,
            "completion_ids": turn["response_token_ids"],
            "completion_mask": found.mask[begin:end],
            "completion_logprobs": turn["response_logprobs"],
            "overlong_prompt": False,
            "is_truncated": truncated,
            "routed_experts": None,
            **({} if (kept := masks.verifiers(turn)) is None else {"kept_tokens": kept}),
        },
        "reward": turn["reward"],
        "advantage": advantage,
        "is_truncated": truncated,
        "trajectory_id": str(turn["rollout_id"]),
        "extras": {"stage": turn["stage"], "turn": turn.get("turn", 0), "trainable": turn.get("trainable", True)},
    }


def output(record: Record, found: Trajectory, example_id: int, advantage: float | None) -> dict[str, Any]:
    truncated = record["status"] == "truncated"
    label = record.get("label")
    return {
        "example_id": example_id,
        "prompt": _message("user", str(found.first["prompt"])),
        "completion": _message("assistant", str(record["response"])),
        "answer": "" if label is None else str(label),
        "info": {
            "problem_id": record["problem_id"],
            "stage": record["stage"],
            "rollout_id": record["rollout_id"],
            **policy_of(record),
        },
        "reward": record["reward"],
        "advantage": advantage,
        "error": None,
        "timing": TIMING,
        "is_completed": not truncated,
        "is_truncated": truncated,
        "stop_condition": "length" if truncated else "completed",
        "metrics": {"raw_reward": record["raw_reward"], **parts_of(record)},
        "tool_defs": None,
        "trajectory": [
            step(turn, found, begin, end, advantage)
            for turn, (begin, end) in zip(found.chain, found.spans(), strict=True)
        ],
    }


def write(problems: Iterable[Problem], out: Path, include_frozen: bool, settings: dict[str, Any]) -> int:
    example_id, rewards = 0, []
    with JsonlWriter(out / FILE) as writer:
        for problem in problems:
            for group in problem.groups:
                for record, found, advantage in group.items(include_frozen):
                    writer.write(output(record, found, example_id, advantage))
                    rewards.append(float(record["reward"]))
                example_id += 1
    metadata = {  # GenerateMetadata, less what save_metadata leaves out (path_to_save, date)
        "env_id": "agentroll",
        "env_args": {"system": settings.get("system")},
        "model": str(settings.get("model", "")),
        "base_url": "",
        "num_examples": example_id,
        "rollouts_per_example": writer.rows // example_id if example_id else 0,  # as verifiers computes it
        "sampling_args": settings.get("sampling") or {},
        "time": 0.0,
        "avg_reward": sum(rewards) / len(rewards) if rewards else 0.0,
        "avg_metrics": {},
        "avg_error": 0.0,
        "pass_at_k": {},
        "pass_all_k": {},
        "pass_threshold": 1.0,
        "usage": None,
        "version_info": {"vf_version": "", "vf_commit": None, "env_version": None, "env_commit": None},
        "state_columns": ["advantage"],
        "tools": None,
    }
    tmp = out / f".{METADATA}.tmp"
    tmp.write_text(json.dumps(metadata))
    os.replace(tmp, out / METADATA)
    return writer.rows


def parts_of(record: Record) -> dict[str, float]:
    """`--reward-component`: each part's own (unweighted) value by its name, as a verifiers rubric's metrics hold
    each reward function's score (the reward is their weighted sum)."""
    parts = record.get("reward_components") or {}
    return {name: float(part["value"]) for name, part in parts.items()}
