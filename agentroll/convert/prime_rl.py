"""`--to prime-rl`: the files prime-rl's trainer reads, `rollouts/step_N/rank_R.bin`, each a msgpack
`list[MicroBatch]` (src/prime_rl/transports/rollouts/types.py, filesystem.py `FileSystemMicroBatchReceiver`).

Each conversation (or call) is one `TrainingSample` made into one `MicroBatch`, as prime-rl's
`trainer/batch.py` `prepare_sample` makes it: `input_ids` the whole token sequence, `loss_mask` true on the
model's tokens, `advantages` the sample's advantage on those tokens and 0.0 elsewhere, `inference_logprobs` the
sampled logprobs (0.0 elsewhere), `position_ids` 0..n-1, `sequence_lengths` and `seq_lens` [n], `temperatures`
per token (the sampling temperature of the call that produced it), `env_names` "agentroll/<stage>", and
`routed_experts` ({data, shape [n, layers, topk], dtype}, the last position's row zero, as prime-rl pads it)
when the records have routes. Samples are not packed together (a micro batch is one sample).

prime-rl's trainer takes advantages as given (its orchestrator computes them: GRPO is reward minus the group
mean, `orchestrator/algo/grpo.py`), so `--advantage mean` is the default and `none` is refused.
`--groups-per-file N` puts N problems in each step (default: one step); `--ranks R` writes one file per data
rank, the samples dealt round-robin and each rank's list padded to the same length with zero-loss copies (the
sender asserts equal lengths; prime-rl pads with such dummies too).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .common import Problem, Record
from .trajectory import Trajectory

DIR = "rollouts"


def require_msgspec() -> Any:
    try:
        import msgspec
    except ImportError:
        raise UsageError("--to prime-rl writes msgpack files (what prime-rl reads): pip install msgspec") from None
    return msgspec


def _temperatures(found: Trajectory, settings: dict[str, Any]) -> list[float]:
    default = float((settings.get("sampling") or {}).get("temperature", 1.0))

    def temperature(record: Record) -> float:
        return float((record.get("sampling") or {}).get("temperature", default))

    out = [temperature(found.chain[0])] * len(found.tokens)
    for turn, (begin, end) in zip(found.chain, found.spans(), strict=True):
        out[begin:end] = [temperature(turn)] * (end - begin)
    return out


def micro_batch(record: Record, found: Trajectory, advantage: float, settings: dict[str, Any]) -> list[Any]:
    """A `MicroBatch` in its wire form: its fields in declaration order (the Struct is `array_like`), the trailing
    defaults left out (`omit_defaults`)."""
    n = len(found.tokens)
    mask = [bool(m) for m in found.mask]
    fields: list[Any] = [
        found.tokens,
        mask,
        [advantage if m else 0.0 for m in mask],
        found.logprobs,
        list(range(n)),
        [n],
        _temperatures(found, settings),
        [f"agentroll/{record['stage']}"] * n,
        [n],
    ]
    routes = record.get("routed_experts")
    if routes is not None:
        import numpy as np

        rows = np.ascontiguousarray(routes)
        if rows.ndim != 3 or rows.shape[0] > n:
            raise UsageError(
                f"problem {record['problem_id']}, {record['stage']}: routed experts of shape "
                f"{rows.shape}, where prime-rl needs ({n}, layers, topk)"
            )
        rows = np.concatenate([rows, np.zeros((n - rows.shape[0], *rows.shape[1:]), dtype=rows.dtype)])
        fields += [None, [rows.tobytes(), list(rows.shape), str(rows.dtype)]]  # ref_logprobs, routed_experts
    return fields


def _dummy(batch: list[Any]) -> list[Any]:
    """A zero-loss copy (no trained token, advantage 0): what pads a rank's list."""
    n = len(batch[0])
    return [batch[0], [False] * n, [0.0] * n, *batch[3:]]


def write(
    problems: Iterable[Problem], out: Path, groups_per_file: int | None, ranks: int, settings: dict[str, Any]
) -> tuple[int, list[Path]]:
    msgspec = require_msgspec()
    encoder = msgspec.msgpack.Encoder()
    files: list[Path] = []
    rows, step_problems = 0, 0
    step: list[list[Any]] = []

    def flush() -> None:
        folder = out / DIR / f"step_{len(files) // ranks}"
        folder.mkdir(parents=True, exist_ok=True)
        lists = [step[r::ranks] for r in range(ranks)]
        longest = max(len(batches) for batches in lists)
        for rank, batches in enumerate(lists):
            batches = batches + [_dummy(step[0])] * (longest - len(batches))
            path = folder / f"rank_{rank}.bin"
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_bytes(encoder.encode(batches))
            os.replace(tmp, path)
            files.append(path)

    for problem in problems:
        for group in problem.groups:
            for record, found, advantage in group.items(True):
                step.append(micro_batch(record, found, float(advantage or 0.0), settings))
                rows += 1
        step_problems += 1
        if groups_per_file is not None and step_problems == groups_per_file:
            if step:
                flush()
            step, step_problems = [], 0
    if step:
        flush()
    return rows, files
