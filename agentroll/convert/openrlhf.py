"""`--to openrlhf`: one row per conversation (or call), the dict an OpenRLHF agent executor returns
(openrlhf/utils/agent.py, `AgentExecutorBase.execute`), which its samples generator turns into an `Experience`
(openrlhf/trainer/ppo_utils/samples_generator.py `_process_response_into_experience`).

`observation_tokens` is the whole conversation, `action_ranges` the `[start, end)` spans of the model's tokens
in it (its action mask), `rollout_log_probs` a logprob per token, full length, 0.0 off the action spans (as
OpenRLHF's executors fill it), `truncated` the last call's `length` stop, `prompt` the first prompt's text and
`label` the record's label. `reward` is the record's reward, or with `--advantage` the (problem, stage)
advantage (run OpenRLHF with the `reinforce` estimator, which adds no baseline of its own); `scores` always the
record's reward (OpenRLHF logs it and filters on it). `problem_id`, `stage`, `rollout_id` and `group`
("problem_id/stage", "problem_id/policy/stage" in a head-to-head folder: the prompt key a replay executor
serves) say where the row came from (`extra_logs` stays empty: OpenRLHF makes a tensor of each of its values).

OpenRLHF's baselines (`group_norm`, `rloo`, ...) reshape rewards into rows of `n_samples_per_prompt`: they are our
groups only when every group has that many rows (convert one stage), hence `--advantage` for the others.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .common import JsonlWriter, Problem, Record, group_name
from .trajectory import Trajectory, first_prompt, runs

FILE = "openrlhf.jsonl"


def row(record: Record, found: Trajectory, advantage: float | None) -> dict[str, Any]:
    ranges = [[a, b] for a, b, on in runs(found.mask, found.start, len(found.tokens)) if on]
    label = record.get("label")
    return {
        "prompt": first_prompt(found),
        "label": None if label is None else str(label),
        "images": None,
        "mm_train_inputs": None,
        "reward": record["reward"] if advantage is None else advantage,
        "scores": record["reward"],
        "observation_tokens": found.tokens,
        "action_ranges": ranges,
        "rollout_log_probs": [x if m else 0.0 for x, m in zip(found.logprobs, found.mask, strict=True)],
        "truncated": record["status"] == "truncated",
        "extra_logs": {},
        "problem_id": record["problem_id"],
        "stage": record["stage"],
        "rollout_id": record["rollout_id"],
        "group": group_name(record),
    }


def write(problems: Iterable[Problem], out: Path, include_frozen: bool) -> int:
    with JsonlWriter(out / FILE) as writer:
        for problem in problems:
            for group in problem.groups:
                for record, found, advantage in group.items(include_frozen):
                    writer.write(row(record, found, advantage))
    return writer.rows
