"""Routed experts (a MoE model's routing per token): the `.npy` blobs of a shard's routes sidecar, and the
references records keep to them. docs/routed-experts.md describes the layout.

vLLM returns, per completion, an integer array shaped (prompt + response - 1, layers, experts per token): row i
is the routing of sequence position i (the last sampled token is never forwarded). The writer splits it at the
prompt length P: the prompt part (rows [:P]) is stored once per shard for every record with the same prompt
token ids, the response part (rows [P:]) once per record. A record's `routed_experts` then holds one of

    {"prompt": [offset, nbytes] | null, "response": [offset, nbytes]}   split; prompt null when P is 0
    {"rows": [offset, nbytes]}                                          whole: rows are not P + R - 1, or R is 0

each span a complete `np.save` blob in the sidecar. numpy is imported when routes are first used.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import OutputError
from .masks import load as load_mask
from .masks import pack as pack_mask

if TYPE_CHECKING:
    import numpy as np

    from ..record.group import Group

Span = tuple[int, int]  # (offset, nbytes) in the sidecar
PROMPT_CACHE = 64  # decoded prompt parts a reader keeps (records of one group share their prompts)


def spans(ref: Any) -> dict[str, Span | None]:
    """A reference's blob spans by part name (`prompt` may be None); ValueError when it is not a reference."""
    if not isinstance(ref, dict) or set(ref) not in ({"prompt", "response"}, {"rows"}):
        raise ValueError(f"not a routes reference ({{'prompt', 'response'}} or {{'rows'}}): {ref!r}")
    out: dict[str, Span | None] = {}
    for name, span in ref.items():
        if span is None and name == "prompt":
            out[name] = None
        elif (
            isinstance(span, list | tuple)
            and len(span) == 2
            and all(type(x) is int for x in span)
            and span[0] >= 0
            and span[1] > 0
        ):
            out[name] = (span[0], span[1])
        else:
            raise ValueError(f"routes part {name!r} is {span!r}, not [offset, nbytes]")
    return out


def end(ref: Any) -> int:
    """The sidecar bytes a reference needs: the end of its last blob."""
    return max((offset + size for offset, size in filter(None, spans(ref).values())), default=0)


def encode(array: np.ndarray) -> bytes:
    """An array as a complete `.npy` file (what `np.load` reads back)."""
    import numpy as np

    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(array), allow_pickle=False)
    return buffer.getvalue()


def checked(array: Any) -> np.ndarray:
    """The array if it is routing (integers, 3 dimensions), else ValueError."""
    import numpy as np

    if not isinstance(array, np.ndarray) or array.dtype.kind not in "iu" or array.ndim != 3:
        what = f"{array.dtype} {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
        raise ValueError(f"routed experts must be an integer array (tokens, layers, experts per token), not {what}")
    return array


def decode(blob: bytes | bytearray | memoryview) -> np.ndarray:
    """A `.npy` blob as its routing array; ValueError when it is not one."""
    import numpy as np

    try:
        array = np.load(io.BytesIO(blob), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"not a .npy array ({exc})") from exc
    return checked(array)


def split(array: np.ndarray, prompt_len: int, response_len: int) -> tuple[np.ndarray | None, np.ndarray] | None:
    """(prompt rows or None when P is 0, response rows) of an array of P + R - 1 rows (R >= 1); None otherwise:
    such an array is stored whole."""
    if response_len < 1 or array.shape[0] != prompt_len + response_len - 1:
        return None
    return (array[:prompt_len] if prompt_len else None), array[prompt_len:]


def join(prompt: np.ndarray | None, response: np.ndarray) -> np.ndarray:
    """The full array of a split reference: prompt rows, then response rows."""
    import numpy as np

    if prompt is None:
        return response
    if prompt.dtype != response.dtype or prompt.shape[1:] != response.shape[1:]:
        raise ValueError(
            f"prompt routes {prompt.dtype} {prompt.shape} and response routes {response.dtype} "
            f"{response.shape} do not join"
        )
    return np.concatenate([prompt, response])


def load(ref: Any, read: Callable[[int, int], bytes], cache: dict[Span, np.ndarray] | None = None) -> np.ndarray:
    """The full array a reference points at. `read(offset, nbytes)` gives sidecar bytes; `cache` (per sidecar)
    keeps decoded prompt parts, so records sharing a prompt decode it once."""
    parts = spans(ref)
    whole, response = parts.get("rows"), parts.get("response")
    if whole is not None:
        return decode(read(*whole))
    assert response is not None  # spans() gives rows, or prompt and response
    prompt = None
    span = parts["prompt"]
    if span is not None:
        prompt = cache.get(span) if cache is not None else None
        if prompt is None:
            prompt = decode(read(*span))
            if cache is not None:
                if len(cache) >= PROMPT_CACHE:
                    cache.clear()
                cache[span] = prompt
    return join(prompt, decode(read(*response)))


def _blob_key(blob: bytes) -> bytes:
    """Prompt parts are shared by their bytes: the same prompt ids routed otherwise (the weights changed between
    two calls) are two blobs."""
    return hashlib.blake2b(blob, digest_size=16).digest()


def _as_array(value: Any) -> np.ndarray:
    if isinstance(value, bytes | bytearray | memoryview):
        return decode(value)
    if isinstance(value, dict):
        raise ValueError(
            "routed_experts is a reference into another folder's routes sidecar: read the folder "
            "with routes=True to write its routes again"
        )
    return checked(value)


@dataclass(slots=True)
class Placement:
    """A group's routes laid out after what the sidecar holds: the bytes to append, and each sample's
    reference by (execution index, sample index)."""

    data: bytes
    refs: dict[tuple[int, int], dict[str, Any]]
    prompts: dict[bytes, Span]  # prompt parts this group adds
    masks: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)  # sampling masks' references

    def block(self, group: Group) -> bytes:
        """The group's JSONL block with each routed sample's routes as its reference (the group's own samples
        keep what they hold)."""
        from ..record.group import Group

        def placed(i: int, j: int, s: Any) -> Any:
            if (i, j) in self.refs:
                s = replace(s, routed_experts=self.refs[(i, j)])
            return replace(s, sampling_mask=self.masks[(i, j)]) if (i, j) in self.masks else s

        executions = [[placed(i, j, s) for j, s in enumerate(samples)] for i, samples in enumerate(group.executions)]
        return Group(group.problem, executions).encode()


@dataclass(slots=True)
class Packer:
    """One shard's sidecar as the writer builds it: its size and sha256, and the prompt parts it holds (by a
    hash of their `.npy` bytes)."""

    size: int = 0
    sha256: Any = field(default_factory=hashlib.sha256)
    prompts: dict[bytes, Span] = field(default_factory=dict)

    def place(self, group: Group) -> Placement | None:
        """Lay out the routes and sampling masks of `group`'s samples (None when none has either); nothing
        changes until `accept`. ValueError when a sample's routes are not a `.npy` integer array of 3 dimensions
        or its mask not a list of lists of ids."""
        blobs: list[bytes] = []
        refs: dict[tuple[int, int], dict[str, Any]] = {}
        masks: dict[tuple[int, int], dict[str, Any]] = {}
        added: dict[bytes, Span] = {}
        position = self.size

        def put(blob: bytes) -> Span:
            nonlocal position
            blobs.append(blob)
            position += len(blob)
            return (position - len(blob), len(blob))

        for i, samples in enumerate(group.executions):
            for j, sample in enumerate(samples):
                if sample.sampling_mask is not None:
                    if isinstance(sample.sampling_mask, dict):
                        raise ValueError(
                            "sampling_mask is a reference into another folder's sidecar: read the folder with "
                            "routes=True to write its masks again"
                        )
                    try:
                        counts, ids = pack_mask(sample.sampling_mask)
                    except ValueError as exc:
                        raise ValueError(f"problem {sample.problem_id!r}, rollout {sample.rollout_id}: {exc}") from exc
                    masks[(i, j)] = {"counts": put(encode(counts)), "ids": put(encode(ids))}
                if sample.routed_experts is None:
                    continue
                try:
                    array = _as_array(sample.routed_experts)
                except ValueError as exc:
                    raise ValueError(
                        f"problem {sample.problem_id!r}, rollout {sample.rollout_id}, {sample.stage} "
                        f"{sample.worker}: {exc}"
                    ) from exc
                parts = split(array, len(sample.prompt_token_ids), len(sample.response_token_ids))
                if parts is None:
                    refs[(i, j)] = {"rows": put(encode(array))}
                    continue
                prompt, response = parts
                span = None
                if prompt is not None:
                    blob = encode(prompt)
                    key = _blob_key(blob)
                    span = self.prompts.get(key) or added.get(key)
                    if span is None:
                        span = added[key] = put(blob)
                refs[(i, j)] = {"prompt": span, "response": put(encode(response))}
        return Placement(b"".join(blobs), refs, added, masks) if refs or masks else None

    def accept(self, placement: Placement) -> None:
        """The placement's bytes are on disk: count them."""
        self.size += len(placement.data)
        self.sha256.update(placement.data)
        self.prompts.update(placement.prompts)


class RoutesUnavailable(OSError):
    """A reference reaches past the end of the sidecar (or the sidecar is not there)."""


class Sidecar:
    """A shard's routes sidecar (`path` None: the shard has none), read a blob at a time; `resolve` gives
    records with their references replaced by arrays. Close it, or use it as a context manager."""

    def __init__(self, path: Path | None, shard: Path) -> None:
        self.path, self.shard = path, shard
        self._fd: int | None = None
        self._prompts: dict[Span, Any] = {}

    def __enter__(self) -> Sidecar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read(self, offset: int, nbytes: int) -> bytes:
        if self.path is None:
            raise RoutesUnavailable(f"{self.shard} has routes references, but its manifest entry lists no sidecar")
        if self._fd is None:
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                raise RoutesUnavailable(f"{self.path} (the routes of {self.shard.name}) does not exist") from None
        data = os.pread(self._fd, nbytes, offset)
        if len(data) != nbytes:
            raise RoutesUnavailable(
                f"{self.path}: a reference to bytes {offset}..{offset + nbytes} reaches past its end"
            )
        return data

    def resolve(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The records, those with routes as copies holding the full array. `RoutesUnavailable` when a blob
        is not (yet) there, `OutputError` when one is damaged."""
        out = []
        for record in records:
            mask = record.get("sampling_mask")
            if isinstance(mask, dict):
                try:
                    record = {**record, "sampling_mask": load_mask(mask, self.read)}
                except ValueError as exc:
                    raise OutputError(
                        f"{self.path}: the sampling mask of problem {record.get('problem_id')!r}, rollout "
                        f"{record.get('rollout_id')}: {exc}"
                    ) from exc
            ref = record.get("routed_experts")
            if ref is not None and not isinstance(ref, dict):
                raise OutputError(
                    f"{self.shard}: routed_experts of problem {record.get('problem_id')!r} is not a sidecar reference"
                )
            if ref is not None:
                try:
                    record = {**record, "routed_experts": load(ref, self.read, self._prompts)}
                except ValueError as exc:
                    raise OutputError(
                        f"{self.path}: the routes of problem {record.get('problem_id')!r}, rollout "
                        f"{record.get('rollout_id')}: {exc}"
                    ) from exc
            out.append(record)
        return out

    def resolve_or_fail(self, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`resolve`, a missing blob being damage (`OutputError`): for a finished shard."""
        try:
            return self.resolve(records)
        except RoutesUnavailable as exc:
            raise OutputError(str(exc)) from exc
