"""How vLLM writes logprobs and routed experts on the wire: the legacy completions shape, /generate's shape with
ranks, the values under `processed_logprobs`, and `routed_experts` as base64 `.npy`; and the simulated values
themselves (`Draws`)."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from typing import Any

from .checks import MAX_LOGPROBS
from .masks import kept_count, kept_ids


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


class Draws:
    """Logprobs as seeded noise shaped like vLLM's: one noise table per server (`seed`), sliced per answer, so a
    seeded request draws the same values again; the top k are distinct ids ranked around the sampled one."""

    def __init__(self, seed: int, length: int, vocab_size: int, mode: str) -> None:
        noise = random.Random(seed + 1)
        self.noise = [round(-noise.expovariate(1.5) - 0.001, 6) for _ in range(length)]  # < 0: no ties
        self.vocab_size, self.mode = vocab_size, mode

    def __call__(
        self,
        ids: list[int],
        drawn: list[int],
        k: int,
        request: dict[str, Any],
        rng: random.Random,
        want_ranks: bool = True,
        kept: list[list[int]] | None = None,
    ) -> tuple[list[float], list[list[tuple[int, float, int]]], list[int]]:
        """Per token: its logprob, the k most likely tokens (id, logprob, rank) in rank order, and its own rank.
        Drawn for the whole sequence `drawn` and cut to `ids`, its prefix: an abort changes no other draw. Under
        `processed_logprobs` the values are those after temperature (scaled) and top-k (the rest are -inf).
        `kept` (a server returning sampling masks) is filled with each token's kept set, ascending: the top_k
        best ranked, cut by top_p; the sampled token then ranks within top_k, as it must to have been drawn."""
        start = rng.randrange(len(self.noise) - len(drawn))
        values = self.noise[start : start + len(drawn)]
        tops: list[list[tuple[int, float, int]]] = []
        ranks: list[int] = []
        if not k and kept is None:  # no alternatives: no draws (a rank that follows the value, likelier ranking higher)
            tops = [[] for _ in values]
            ranks = [1 + int(-2 * v) for v in values] if want_ranks else []
        n = MAX_LOGPROBS  # the same top list whatever k is asked, as a real distribution has; cut to k below
        worst = n + 4 if kept is None else max(1, min(n + 4, int(request.get("top_k") or 1)))
        for i, value in enumerate(values if k or kept is not None else ()):
            rank = 1 if rng.random() < 0.6 or worst < 2 else rng.randint(2, worst)  # the sampled token's rank
            above = sorted((value * (1 - 0.5 * rng.random()) for _ in range(min(rank - 1, n))), reverse=True)
            below = sorted((value - rng.random() for _ in range(n - len(above) - (rank <= n))), reverse=True)
            ranked = [*above, *([value] if rank <= n else []), *below]
            mass = math.exp(value) * (rank > n) + sum(map(math.exp, ranked))
            if mass > 0.95:  # probabilities: what is listed adds up to less than 1
                shift = math.log(mass / 0.95)
                values[i], ranked = round(value - shift, 6), [v - shift for v in ranked]
            sampled = drawn[i]
            picks = rng.sample(range(self.vocab_size - 1), len(ranked))  # distinct ids, none the sampled one
            others = [
                (sampled if r == rank else t + (t >= sampled), round(v, 6), r)
                for r, (v, t) in enumerate(zip(ranked, picks, strict=True), 1)
            ]
            if kept is not None:
                ranked_ids = [t for t, _, _ in others] if rank <= n else [*(t for t, _, _ in others), sampled]
                count = kept_count(rank, request, self.vocab_size, rng)
                kept.append(kept_ids(ranked_ids, count, self.vocab_size, rng))
            tops.append(others[:k])
            ranks.append(rank)
        if self.mode == "processed_logprobs":
            values, tops = processed(values, tops, ranks or [1] * len(values), request)
        return values[: len(ids)], tops[: len(ids)], ranks[: len(ids)]


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
