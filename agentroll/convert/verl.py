"""`--to verl`: one row per conversation (or call) with the fields of verl's `AgentLoopOutput`
(verl/experimental/agent_loop/agent_loop.py), plus `uid`, the GRPO group.

`prompt_ids` is the first prompt; `response_ids` everything after it (each turn's tokens and the tokens injected
between turns), `response_mask` 1 on the model's tokens and 0 on the injected ones, `response_logprobs` the
sampled logprobs (0.0 off the model's tokens), as verl's own multi-turn agent loop lays a conversation out.
`reward_score` is the record's reward: with it set, verl takes it as the score (`rm_scores`) instead of calling a
reward function. `num_turns` counts chat messages as verl does (its single-turn loop writes 2: the user's and the
assistant's), so a conversation of T calls has 2T. `metrics` are `AgentLoopMetrics` defaults (no timings are
known offline), `extra_fields` say where the row came from. Routed experts are carried as `routed_experts`
(rows over prompt + response, as verl pads them), as nested lists: verl reads their `.shape`, so a replay loop
makes them an array (`np.asarray`, docs/convert.md).

A teacher's scores (`--teacher`, `agentroll distill`) go where verl's distillation teacher loop puts them
(verl-project/verl 1dda039, `verl/experimental/agent_loop/agent_loop.py`, `teacher_loop/teacher_manager.py`):
`extra_fields.teacher_ids` / `extra_fields.teacher_logprobs`, one row per token of prompt + response, row i the
teacher's prediction of token i + 1 (`convert.teacher.shifted`), which `AgentLoopOutput` moves into the batch.

verl's GRPO groups by `non_tensor_batch["uid"]` (`core_algos.compute_grpo_outcome_advantage`, Bessel std, a
group of one keeps its reward) and takes groups of any size, so `uid` = "problem_id/stage" is all it needs;
verl computes the advantages itself, and `--advantage` is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .common import JsonlWriter, Problem, Record, group_name
from .teacher import shifted
from .trajectory import Trajectory

FILE = "verl.jsonl"
METRICS = {"generate_sequences": 0.0, "tool_calls": 0.0, "num_preempted": -1}  # AgentLoopMetrics' defaults


def row(record: Record, found: Trajectory, teacher_topk: bool | None = None) -> dict[str, Any]:
    start = found.start
    routes = record.get("routed_experts")
    scores = shifted(found, teacher_topk)
    teacher = {} if scores is None else {"teacher_ids": scores[0], "teacher_logprobs": scores[1]}
    return {
        "uid": group_name(record),
        "prompt_ids": found.tokens[:start],
        "response_ids": found.tokens[start:],
        "response_mask": found.mask[start:],
        "response_logprobs": found.logprobs[start:],
        "routed_experts": None if routes is None else routes.tolist(),
        "multi_modal_data": None,
        "reward_score": record["reward"],
        "num_turns": 2 * found.turns,
        "metrics": dict(METRICS),
        "extra_fields": {
            "problem_id": record["problem_id"],
            "stage": record["stage"],
            "rollout_id": record["rollout_id"],
            "status": record["status"],
            "raw_reward": record["raw_reward"],
            "label": record.get("label"),
            **teacher,  # AgentLoopOutput moves them out of extra_fields into the batch (its teacher loop's place)
        },
    }


def write(problems: Iterable[Problem], out: Path, include_frozen: bool, teacher_topk: bool | None = None) -> int:
    with JsonlWriter(out / FILE) as writer:
        for problem in problems:
            for group in problem.groups:
                for record, found, _ in group.items(include_frozen):
                    writer.write(row(record, found, teacher_topk))
    return writer.rows
