"""`--to prime-rl`: the files prime-rl's trainer reads, `rollouts/step_N/rank_R.bin`, each a msgpack
`list[MicroBatch]` (src/prime_rl/transports/rollouts/types.py, filesystem.py `FileSystemMicroBatchReceiver`).

Each conversation (or call) is one `TrainingSample` made into one `MicroBatch`, as prime-rl's
`trainer/batch.py` `prepare_sample` makes it: `input_ids` the whole token sequence, `loss_mask` true on the
model's tokens, `advantages` the sample's advantage on those tokens and 0.0 elsewhere, `inference_logprobs` the
sampled logprobs (0.0 elsewhere), `position_ids` 0..n-1, `sequence_lengths` and `seq_lens` [n], `temperatures`
per token (the sampling temperature of the call that produced it), `env_names` "agentroll/<stage>", and
`routed_experts` ({data, shape [n, layers, topk], dtype}, the last position's row zero, as prime-rl pads it)
when the records have routes, and the sampling mask (`--return-sampling-mask`) as the last field, `[ids,
counts]` of int32 bytes (`convert.masks`: prime-rl's sampling replay). Samples are not packed together (a
micro batch is one sample).

prime-rl's trainer takes advantages as given (its orchestrator computes them: GRPO is reward minus the group
mean, `orchestrator/algo/grpo.py`), so `--advantage mean` is the default and `none` is refused, unless
`--loss ref_kl` (on-policy distillation, its `opd`: the teacher's `ref_logprobs`, no rl credit).
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
from . import masks
from .common import Problem, Record
from .teacher import aligned, covering
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


LOSSES = ("rl", "ref_kl", "rl+ref_kl")  # prime-rl's loss components a sample's trained tokens feed


def micro_batch(
    record: Record, found: Trajectory, advantage: float, settings: dict[str, Any], loss: str = "rl"
) -> list[Any]:
    """A `MicroBatch` in its wire form: its fields in declaration order (the Struct is `array_like`), the trailing
    defaults left out (`omit_defaults`). `ref_logprobs` are the teacher's scores (`--teacher`, `agentroll
    distill`) where the records hold them; `loss` routes the trained tokens as prime-rl's orchestrator stamps
    them (`algo/routing.py` `stamp_loss_routing`): `rl` (no weight streams: GRPO's wire), `ref_kl` (its `opd`: rl
    weights 0, ref_kl weights 1 on the trained tokens), or both (ref_kl weights 1, the rl component as it is)."""
    n = len(found.tokens)
    mask = [bool(m) for m in found.mask]
    distill = loss != "rl"
    scores = covering(record, found, f"--loss {loss}") if distill else aligned(found)
    fields: list[Any] = [
        found.tokens,
        mask,
        [advantage if m and loss != "ref_kl" else 0.0 for m in mask],
        found.logprobs,
        list(range(n)),
        [n],
        _temperatures(found, settings),
        [f"agentroll/{record['stage']}"] * n,
        [n],
        None if scores is None else scores.logprobs,  # ref_logprobs
        None,  # routed_experts
        None,  # mm_kwargs
        None,  # mm_token_type_ids
        [0.0] * n if loss == "ref_kl" else None,  # rl_weights
        None,  # ce_weights
        [1.0 if m else 0.0 for m in mask] if distill else None,  # ref_kl_weights
        masks.prime_rl(found),  # sampling_mask: [ids, counts], int32 bytes (sampling replay)
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
        fields[10] = [rows.tobytes(), list(rows.shape), str(rows.dtype)]
    while fields[-1] is None:  # omit_defaults: what is left out decodes as its default
        fields.pop()
    return fields


def _dummy(batch: list[Any]) -> list[Any]:
    """A zero-loss copy (no trained token, advantage 0, no ref_kl weight): what pads a rank's list."""
    n = len(batch[0])
    out = [batch[0], [False] * n, [0.0] * n, *batch[3:]]
    if len(out) > 15 and out[15] is not None:
        out[15] = [0.0] * n  # ref_kl weights
    return out


def write(
    problems: Iterable[Problem],
    out: Path,
    groups_per_file: int | None,
    ranks: int,
    settings: dict[str, Any],
    loss: str = "rl",
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
                step.append(micro_batch(record, found, float(advantage or 0.0), settings, loss))
                rows += 1
        step_problems += 1
        if groups_per_file is not None and step_problems == groups_per_file:
            if step:
                flush()
            step, step_problems = [], 0
    if step:
        flush()
    return rows, files
