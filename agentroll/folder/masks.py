"""Sampling masks (`--return-sampling-mask`: per response token the vocabulary ids vLLM kept under top-k / top-p
/ min-p) in a shard's binary sidecar, beside its routed experts (docs/routed-experts.md).

A record's mask is stored CSR-style as two `.npy` blobs: `counts` (one per response token: how many ids its step
kept) and `ids` (every step's kept ids one after another, each step ascending), each in the smallest unsigned
dtype that holds it. The record's `sampling_mask` is then `{"counts": [offset, nbytes], "ids": [offset, nbytes]}`.
Step i's set is `ids[offsets[i]:offsets[i + 1]]` with `offsets = [0, *cumsum(counts)]`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

PARTS = ("counts", "ids")


def spans(ref: Any) -> dict[str, tuple[int, int]]:
    """A mask reference's two blob spans; ValueError when it is not one."""
    if not isinstance(ref, dict) or set(ref) != set(PARTS):
        raise ValueError(f"not a sampling-mask reference ({{'counts', 'ids'}}): {ref!r}")
    out = {}
    for name in PARTS:
        span = ref[name]
        if not (
            isinstance(span, list | tuple)
            and len(span) == 2
            and all(type(x) is int for x in span)
            and span[0] >= 0
            and span[1] > 0
        ):
            raise ValueError(f"sampling-mask part {name!r} is {span!r}, not [offset, nbytes]")
        out[name] = (span[0], span[1])
    return out


def end(ref: Any) -> int:
    """The sidecar bytes a mask reference needs."""
    return max(offset + size for offset, size in spans(ref).values())


def _smallest(values: np.ndarray) -> np.ndarray:
    import numpy as np

    top = int(values.max()) if values.size else 0
    for dtype in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(dtype).max:
            return values.astype(dtype)
    return values.astype(np.uint64)


def pack(mask: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(counts, ids) of a per-token mask; ValueError when it is not a list of lists of token ids."""
    import numpy as np

    if not isinstance(mask, list) or not all(isinstance(step, list | tuple) for step in mask):
        raise ValueError(f"sampling_mask must be a list of lists of token ids, not {type(mask).__name__}")
    flat = [t for step in mask for t in step]
    if not all(type(t) is int and t >= 0 for t in flat):
        raise ValueError("sampling_mask holds something other than token ids")
    counts = np.array([len(step) for step in mask], dtype=np.int64)
    return _smallest(counts), _smallest(np.array(flat, dtype=np.int64))


def unpack(counts: np.ndarray, ids: np.ndarray) -> list[list[int]]:
    """The per-token lists of a (counts, ids) pair; ValueError when they do not fit together."""
    import numpy as np

    for name, array in (("counts", counts), ("ids", ids)):
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "iu" or array.ndim != 1:
            raise ValueError(f"sampling-mask {name} must be a 1-d integer array")
    if int(counts.sum()) != len(ids):
        raise ValueError(f"sampling-mask counts add up to {int(counts.sum())}, but it holds {len(ids)} ids")
    offsets = [0, *np.cumsum(counts).tolist()]
    flat = ids.tolist()
    return [flat[offsets[i] : offsets[i + 1]] for i in range(len(counts))]


def load(ref: Any, read: Callable[[int, int], bytes]) -> list[list[int]]:
    """The per-token mask a reference points at; `read(offset, nbytes)` gives sidecar bytes."""
    import io

    import numpy as np

    arrays = []
    for name, span in spans(ref).items():
        try:
            arrays.append(np.load(io.BytesIO(read(*span)), allow_pickle=False))
        except (ValueError, OSError, EOFError) as exc:
            raise ValueError(f"sampling-mask {name} is not a .npy array ({exc})") from exc
    return unpack(*arrays)


def outside(mask: list[list[int]], token_ids: list[int]) -> int | None:
    """The first response position whose sampled token is not in its step's kept set (None: every one is)."""
    for i, (step, token) in enumerate(zip(mask, token_ids, strict=False)):
        if token not in step:
            return i
    return None


def with_counts(shard: Path, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records with each mask reference as its per-step counts (how many ids survived at each response
    token), read from the shard's sidecar under its partial or finished name: what the viewer shows. A reference
    that cannot be read stays as it is (`validate` says why)."""
    import io
    import os

    import numpy as np

    from .layout import final_name, routes_path

    if not any(isinstance(r.get("sampling_mask"), dict) for r in records):
        return records
    side = routes_path(shard)
    if not side.exists():
        side = routes_path(shard.with_name(final_name(shard.name)))
    try:
        fd = os.open(side, os.O_RDONLY)
    except OSError:
        return records
    out = []
    try:
        for record in records:
            ref = record.get("sampling_mask")
            if isinstance(ref, dict):
                try:
                    offset, size = spans(ref)["counts"]
                    counts = np.load(io.BytesIO(os.pread(fd, size, offset)), allow_pickle=False)
                    record = {**record, "sampling_mask": [int(c) for c in counts.tolist()]}
                except (ValueError, OSError, EOFError):
                    pass
            out.append(record)
    finally:
        os.close(fd)
    return out
