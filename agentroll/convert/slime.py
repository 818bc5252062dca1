"""`--to slime`: what slime's `--load-debug-rollout-data` loads: `torch.save({"rollout_id": i, "samples": [...]})`
files, each sample a `Sample.to_dict()` of slime/utils/types.py, read back with `Sample.from_dict`.

slime formats the path with each training step's rollout id (`rollout_{rollout_id}.pt`), so a file is one
step: `--groups-per-file N` puts N problems in each (slime's `--rollout-batch-size`); by default one file holds
them all. Every file holds N whole problems: slime's scheduler (slime/utils/dp_schedule.py) asserts a step has
at least `--global-batch-size` rollouts, so the problems after the last whole file are not written (counted as
`left_over_problems`). `slime.jsonl` has the same samples, one per line. Within a file the samples of a (problem, stage)
group are consecutive and share `group_index`; those of one execution share `rollout_id` (slime's unit of
loss aggregation: one execution, several training samples, as its subagent rollouts).

slime normalises rewards itself by reshaping them into rows of `--n-samples-per-prompt`, which cannot express
our per-stage groups (K*N solvers, up to K*N rewriters, K selectors per problem). With `--advantage grpo` the
per-stage advantage is written as `reward` (what slime's `get_reward_value` returns) and the reward itself as
`metadata["raw_reward"]`, which slime's train data takes as its `raw_reward` instead (ray/rollout.py
`_convert_samples_to_train_data`): run slime with `--disable-rewards-normalization` then.

A multi-turn conversation is one slime sample, as slime's own multi-turn rollouts make it (slime/utils/types.py
`Sample.append_response_tokens`, examples/search-r1): `tokens` = the first turn's prompt + everything after it
(each turn's model tokens and the tokens injected between turns), `response_length` what follows the first
prompt, `loss_mask` 1 on the model's tokens and 0 on the injected ones over that response part, and
`rollout_log_probs` the sampled logprobs there (0.0 on injected tokens). It is built from the conversation's
last turn (`history_mask` + `loss_mask` from the first prompt's end); the turns it holds are not written again.
`trajectories=False` writes every call as its own sample instead. Frozen records (`trainable: false`) are left
out, and their tokens inside a conversation masked, unless `include_frozen` (then trained as generated).

Routed experts (`--return-routed-experts`) become `rollout_routed_experts`, the (len(tokens) - 1, layers, topk)
int32 tensor slime's routing replay takes; a conversation's are its last turn's, which cover it all.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .common import JsonlWriter, Problem, Record, policy_of
from .trajectory import Trajectory, after_first_prompt, first_prompt, own_mask

FILE = "slime.jsonl"
PT_PATTERN = r"rollout_\d+\.pt"


def require_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise UsageError("--to slime writes torch .pt files (what slime loads): pip install torch") from None
    return torch


def sample(
    record: Record, reward: float, index: int, group_index: int, rollout_id: int, conversation: Trajectory | None = None
) -> dict[str, Any]:
    """One slime sample: the record's call, or with `conversation` (of several turns) the whole conversation
    that the record ends."""
    metadata = dict(record.get("metadata") or {})
    metadata.setdefault("source_name", f"agentroll/{record['stage']}")  # slime's per-source metrics: per stage
    metadata["raw_reward"] = record["reward"]
    metadata["agentroll"] = {
        k: record[k]
        for k in ("problem_id", "rollout_id", "sample_index", "stage", "worker", "raw_reward", "reward", "final_reward")
    } | policy_of(record)
    label = record.get("label")
    out = {
        "group_index": group_index,
        "index": index,
        "rollout_id": rollout_id,
        "prompt": record["prompt"],
        "tokens": record["prompt_token_ids"] + record["response_token_ids"],
        "response": record["response"],
        "response_length": len(record["response_token_ids"]),
        "label": None if label is None else str(label),
        "reward": reward,
        "loss_mask": own_mask(record, True),  # a frozen record is here only with include_frozen
        "rollout_log_probs": record["response_logprobs"],
        "status": record["status"],  # completed / truncated: values of slime's Sample.Status
        "metadata": metadata,
    }
    if conversation is not None and conversation.turns > 1:
        start = conversation.start
        metadata["agentroll"]["turns"] = conversation.turns
        out.update(
            tokens=conversation.tokens,
            response_length=len(conversation.tokens) - start,
            loss_mask=conversation.mask[start:],
            rollout_log_probs=conversation.logprobs[start:],
            prompt=first_prompt(conversation),
            response=after_first_prompt(conversation),
        )
    routes = record.get("routed_experts")
    if routes is not None:
        out["rollout_routed_experts"] = _routes(routes, len(out["tokens"]), record)
    return out


def _routes(routes: Any, tokens: int, record: Record) -> Any:
    """The record's routes as the int32 tensor slime replays: one row per token but the last."""
    torch = require_torch()
    if getattr(routes, "ndim", None) != 3 or routes.shape[0] != tokens - 1:
        raise UsageError(
            f"problem {record['problem_id']}, {record['stage']}: routed experts of shape "
            f"{getattr(routes, 'shape', None)}, where slime needs ({tokens - 1}, layers, topk)"
        )
    return torch.from_numpy(routes.astype("int32"))


def write(problems: Iterable[Problem], out: Path, groups_per_file: int | None) -> tuple[int, list[Path], int]:
    """Samples written, the files, and the problems left over after the last whole file of `groups_per_file`."""
    torch = require_torch()
    files: list[Path] = []
    batch: list[dict[str, Any]] = []
    batch_problems = group_index = index = 0
    executions: dict[str, int] = {}

    with JsonlWriter(out / FILE) as writer:

        def flush() -> None:
            path = out / f"rollout_{len(files)}.pt"
            tmp = path.with_name(f".{path.name}.tmp")
            torch.save({"rollout_id": len(files), "samples": batch}, tmp)
            tmp.replace(path)
            files.append(path)
            for item in batch:
                writer.write(_plain(item))

        for problem in problems:
            for group in problem.groups:
                for i, record in enumerate(group.records):
                    rollout_id = executions.setdefault(record["rollout_id"], len(executions))
                    reward = record["reward"] if group.advantages is None else group.advantages[i]
                    batch.append(
                        sample(
                            record,
                            reward,
                            index,
                            group_index,
                            rollout_id,
                            None if group.trajectories is None else group.trajectories[i],
                        )
                    )
                    index += 1
                group_index += 1
            batch_problems += 1
            if groups_per_file is not None and batch_problems == groups_per_file:
                flush()
                batch, batch_problems = [], 0
        if groups_per_file is None:
            flush()
    return writer.rows, [*files, out / FILE], batch_problems if groups_per_file is not None else 0


def _plain(item: dict[str, Any]) -> dict[str, Any]:
    """A sample for the JSONL copy: a routes tensor as nested lists."""
    routes = item.get("rollout_routed_experts")
    return item if routes is None else {**item, "rollout_routed_experts": routes.tolist()}
