"""How vLLM writes logprobs and routed experts on the wire: the legacy completions shape, /generate's shape with
ranks, the values under `processed_logprobs`, and `routed_experts` as base64 `.npy` (the values themselves are
`scoring.Scorer`'s)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any


def processed(
    values: list[float], tops: list[list[tuple[int, float, int]]], ranks: list[int], request: dict[str, Any]
) -> tuple[list[float], list[list[tuple[int, float, int]]]]:
    temperature = request.get("temperature")
    scale = 1.0 / temperature if temperature else 1.0
    top_k = request.get("top_k") or -1

    def cut(v: float, r: int) -> float:
        return -9999.0 if 0 < top_k < r else round(v * scale, 6)

    return (
        [cut(v, r) for v, r in zip(values, ranks, strict=True)],
        [[(t, cut(v, r), r) for t, v, r in top] for top in tops],
    )


def completion_logprobs(
    ids: list[int],
    values: list[float],
    tops: list[list[tuple[int, float, int]]],
    request: dict[str, Any],
    id_strings: list[str],
    decode: Callable[[int], str],
) -> dict[str, Any]:
    """vLLM's legacy completion logprobs: per token its string, its logprob, its text offset, and the sampled
    token followed by the k most likely ones (a dict: a repeated token appears once). `id_strings`: each id as
    `token_id:N`; `decode`: one id's text."""
    as_ids = bool(request.get("return_tokens_as_token_ids"))
    tokens = [id_strings[t] for t in ids] if as_ids else [decode(t) for t in ids]
    if not any(tops):  # logprobs 0: the sampled token alone
        entries = [{token: value} for token, value in zip(tokens, values, strict=True)]
    else:
        entries = []
        for token, value, others in zip(tokens, values, tops, strict=True):
            entry = {token: value}
            for other, other_value, _ in others:
                name = id_strings[other] if as_ids else decode(other)
                entry.setdefault(name, other_value)
            entries.append(entry)
    offsets = [0, *itertools.accumulate(len(t) for t in tokens)][:-1]
    return {"text_offset": offsets, "token_logprobs": values, "tokens": tokens, "top_logprobs": entries}


def generate_logprobs(
    ids: list[int], values: list[float], tops: list[list[tuple[int, float, int]]], ranks: list[int], k: int
) -> dict[str, Any]:
    """/generate's logprobs: integer ids with ranks; `top_logprobs` is the first max(k, 1) entries of the
    sampled token followed by the top k (vLLM's own cut: a sampled token outside the top k pushes one out)."""
    content = []
    for token, value, others, rank in zip(ids, values, tops, ranks, strict=True):
        entry = {"token_id": token, "logprob": value, "rank": rank}
        listed: dict[int, dict[str, Any]] = {token: entry}
        for other, other_value, other_rank in others:
            listed.setdefault(other, {"token_id": other, "logprob": other_value, "rank": other_rank})
        content.append({**entry, "top_logprobs": list(listed.values())[: max(k, 1)]})
    return {"content": content}


def routed_experts(moe: tuple[int, int, int] | None, prompt_ids: list[int], output_ids: list[int]) -> str | None:
    """vLLM's `routed_experts` (`--enable-return-routed-experts` on a MoE model): base64 of a .npy array
    (prompt + output - 1, layers, experts per token). The experts are a function of a position's token,
    index and layer, so two requests that share a prompt share its rows, as a real model's would."""
    if moe is None or not output_ids:
        return None
    import base64
    import io

    import numpy as np

    layers, experts, per_token = moe
    tokens = np.asarray(prompt_ids + output_ids[:-1], dtype=np.int64)
    position = np.arange(len(tokens), dtype=np.int64)
    base = (tokens * 31 + position * 7)[:, None, None] + np.arange(layers)[None, :, None] * 13
    routed = (base + np.arange(per_token)[None, None, :]) % experts
    buffer = io.BytesIO()
    np.save(buffer, routed.astype(np.uint8 if experts <= 256 else np.uint16))
    return base64.b64encode(buffer.getvalue()).decode()
