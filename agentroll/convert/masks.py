"""Sampling masks (`--return-sampling-mask`) in the exporters' own fields: per token of a trajectory the ids the
sampler kept, as the trainers read them.

- prime-rl (sampling replay, PrimeIntellect-ai/prime-rl#3431; read at its branch `feat/sampling-replay`
  d09488d, where the type was still called `KeptTokens`): the `MicroBatch`'s last field, `[ids, counts]`, two
  raw int32 byte strings; `counts` has one entry per `input_ids` position (0: no mask there), `ids` every kept
  set in position order (`trainer/rl/data.py` pads them to `[seq, max_kept]` with -1).
- verifiers (PrimeIntellect-ai/verifiers#1978, a60a606): `KeptTokens(ids, counts)`, base64 of int32 arrays,
  `counts` one per completion token (`v1/clients/train.py` `response_from_generate`, decoded by
  `v1/graph.py` `_attribute_kept_tokens`).
"""

from __future__ import annotations

import base64
from typing import Any

from .trajectory import Trajectory


def kept_sets(found: Trajectory) -> list[list[int]] | None:
    """Per token of the trajectory, the ids kept when it was sampled ([] where it was not sampled under a mask:
    a prompt token, a turn without one, a token out of the loss mask); None when no turn has a mask."""
    if all(not isinstance(turn.get("sampling_mask"), list) for turn in found.chain):
        return None
    out: list[list[int]] = [[] for _ in found.tokens]
    for turn, (begin, end) in zip(found.chain, found.spans(), strict=True):
        mask = turn.get("sampling_mask")
        if isinstance(mask, list) and len(mask) == end - begin:
            for at, step in enumerate(mask, begin):
                if found.mask[at]:
                    out[at] = [int(t) for t in step]
    return out


def csr(sets: list[list[int]]) -> tuple[bytes, bytes]:
    """(ids, counts) as int32 bytes: every set's ids in position order, and each position's count."""
    import numpy as np

    counts = np.array([len(s) for s in sets], dtype=np.int32)
    ids = np.array([t for s in sets for t in s], dtype=np.int32)
    return ids.tobytes(), counts.tobytes()


def prime_rl(found: Trajectory) -> list[bytes] | None:
    """prime-rl's `MicroBatch` sampling mask in its wire form (`array_like`: `[ids, counts]`), or None."""
    sets = kept_sets(found)
    return None if sets is None else list(csr(sets))


def verifiers(turn: dict[str, Any]) -> dict[str, str] | None:
    """verifiers' `KeptTokens` of one call (counts per completion token), base64 as its generate client
    carries them, or None."""
    mask = turn.get("sampling_mask")
    if not isinstance(mask, list):
        return None
    ids, counts = csr(mask)
    return {"ids": base64.b64encode(ids).decode(), "counts": base64.b64encode(counts).decode()}
