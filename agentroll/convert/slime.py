"""`--to slime`: what slime's `--load-debug-rollout-data` loads: `torch.save({"rollout_id": i, "samples": [...]})`
files, each sample a `Sample.to_dict()` of slime/utils/types.py, read back with `Sample.from_dict`.

slime formats the path with each training step's rollout id (`rollout_{rollout_id}.pt`), so a file is one
step: `--groups-per-file N` puts N problems in each (slime's `--rollout-batch-size`); by default one file holds
them all. `slime.jsonl` has the same samples, one per line. Within a file the samples of a (problem, stage)
group are consecutive and share `group_index`; those of one execution share `rollout_id` (slime's unit of
loss aggregation: one execution, several training samples, as its subagent rollouts).

slime normalises rewards itself by reshaping them into rows of `--n-samples-per-prompt`, which cannot express
our per-stage groups (K*N solvers, up to K*N rewriters, K selectors per problem). With `--advantage grpo` the
per-stage advantage is written as `reward` and the reward itself as `metadata["raw_reward"]` (which slime logs
as the raw reward): run slime with `--disable-rewards-normalization` then.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .common import JsonlWriter, Problem, Record

FILE = "slime.jsonl"
PT_PATTERN = r"rollout_\d+\.pt"


def require_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise UsageError("--to slime writes torch .pt files (what slime loads): pip install torch") from None
    return torch


def sample(record: Record, reward: float, index: int, group_index: int, rollout_id: int) -> dict[str, Any]:
    metadata = dict(record.get("metadata") or {})
    metadata.setdefault("source_name", f"agentroll/{record['stage']}")  # slime's per-source metrics: per stage
    metadata["raw_reward"] = record["reward"]
    metadata["agentroll"] = {k: record[k] for k in ("problem_id", "rollout_id", "sample_index", "stage", "worker",
                                                     "raw_reward", "reward", "final_reward")}
    label = record.get("label")
    return {
        "group_index": group_index,
        "index": index,
        "rollout_id": rollout_id,
        "prompt": record["prompt"],
        "tokens": record["prompt_token_ids"] + record["response_token_ids"],
        "response": record["response"],
        "response_length": len(record["response_token_ids"]),
        "label": None if label is None else str(label),
        "reward": reward,
        "loss_mask": record["loss_mask"],
        "rollout_log_probs": record["response_logprobs"],
        "status": record["status"],  # completed / truncated: values of slime's Sample.Status
        "metadata": metadata,
    }


def write(problems: Iterable[Problem], out: Path, groups_per_file: int | None) -> tuple[int, list[Path]]:
    torch = require_torch()
    files: list[Path] = []
    batch: list[dict[str, Any]] = []
    batch_problems = group_index = index = 0
    executions: dict[str, int] = {}

    def flush() -> None:
        path = out / f"rollout_{len(files)}.pt"
        tmp = path.with_name(f".{path.name}.tmp")
        torch.save({"rollout_id": len(files), "samples": batch}, tmp)
        tmp.replace(path)
        files.append(path)

    with JsonlWriter(out / FILE) as writer:
        for problem in problems:
            for group in problem.groups:
                for i, record in enumerate(group.records):
                    rollout_id = executions.setdefault(record["rollout_id"], len(executions))
                    reward = record["reward"] if group.advantages is None else group.advantages[i]
                    item = sample(record, reward, index, group_index, rollout_id)
                    writer.write(item)
                    batch.append(item)
                    index += 1
                group_index += 1
            batch_problems += 1
            if groups_per_file is not None and batch_problems == groups_per_file:
                flush()
                batch, batch_problems = [], 0
        if batch or not files:
            flush()
    return writer.rows, [*files, out / FILE]
