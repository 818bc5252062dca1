"""vLLM 0.32's sampling mask (`vllm serve --return-sampling-mask`, "sampling distribution replay"): the server
option, the refusal of a request it cannot bound, and the per-token kept sets /generate sends.

As vLLM's source has it: the option is the server's (no request field asks for a mask); once it is on, every
request needs temperature > 0 and top_k > 0 (a 400 otherwise, checked as the request is taken, on every API);
/inference/v1/generate's choices then carry `sampling_mask`, a list with one list per output token of the
vocabulary ids that survived top-k / top-p / min-p, in ascending id order. /v1/completions never carries it.
"""

from __future__ import annotations

import random
from typing import Any

from .checks import MAX_LOGPROBS
from .scoring import Scorer
from .wire import bad_request

NEEDS_TEMPERATURE = "sampling distribution replay requires temperature > 0"
NEEDS_TOP_K = (
    "sampling distribution replay requires top_k > 0 to bound sampling mask size, reduce transfer overhead, "
    "and avoid potential OOMs"
)


def check_replay(params: dict[str, Any]) -> None:
    """vLLM's refusal, temperature first (an omitted temperature is 1.0, an omitted top_k 0)."""
    temperature = params.get("temperature")
    if (1.0 if temperature is None else temperature) <= 0:
        raise bad_request(NEEDS_TEMPERATURE)
    if (params.get("top_k") or 0) <= 0:
        raise bad_request(NEEDS_TOP_K)


def kept_count(rank: int, params: dict[str, Any], vocab_size: int, rng: random.Random) -> int:
    """How many of the best-ranked tokens survive a step: top_k, fewer when top_p < 1 cuts the nucleus (never
    below the sampled token's rank: the sampled token was kept)."""
    top_k = min(int(params.get("top_k") or 0), vocab_size)
    top_p = params.get("top_p")
    if top_p is None or top_p >= 1:
        return top_k
    return rng.randint(min(rank, top_k), top_k)


def kept_sets(
    scorer: Scorer, prompt_ids: list[int], ids: list[int], params: dict[str, Any], rng: random.Random
) -> list[list[int]]:
    """Each answer token's kept set, ascending: the best-ranked ids of the scorer's distribution at its step (the
    one `prompt_logprobs` and the sampled logprobs read), cut by top_k and top_p. The simulator's answers are
    scripted, not drawn, so a token the scorer ranks below the cut takes the last kept place: the sampled token
    always lies in its step's set, as it does on a real server."""
    _, tops, ranks = scorer.sampled(prompt_ids, ids, MAX_LOGPROBS)
    vocab_size = scorer.vocab_size
    sets = []
    for token, top, rank in zip(ids, tops, ranks, strict=True):
        count = max(1, kept_count(rank, params, vocab_size, rng))
        kept = [t for t, _, _ in top][:count]
        if token not in kept:
            kept = [*kept[: count - 1], token]
        seen = set(kept)
        while len(kept) < count:  # past the listed ranking: distinct ids
            other = rng.randrange(vocab_size)
            if other not in seen:
                seen.add(other)
                kept.append(other)
        sets.append(sorted(kept))
    return sets
