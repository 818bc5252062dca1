"""The simulated model as a teacher: vLLM's `prompt_logprobs`, deterministic logprobs of the ids it is given.

A real vLLM scores a token-id prompt position by position (`prompt_logprobs: K`): the first position null, every
other one the position's own token with its logprob and rank, plus the K most likely tokens (so K or K + 1
entries, the own token first: the captures in tests/fixtures/vllm032_prompt_logprobs_*.json). The simulator's
values are a pure function of the server's seed, the ids before a position and the id at it, so the same
sequence is scored the same on every call, by any server of that seed, whatever K is asked (a real model's
logprob of a token does not depend on how many alternatives are listed), and a teacher's scores of a run's
records can be checked against a second scoring of the same folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .checks import MAX_LOGPROBS
from .wire import bad_request

MASK = (1 << 64) - 1


def check_prompt_logprobs(request: dict[str, Any], vocab_size: int) -> int | None:
    """`prompt_logprobs` as vLLM 0.32 checks it (the completion request's validator, then SamplingParams): an
    integer, positive or -1 (the whole vocabulary), at most --max-logprobs (20 by default)."""
    k = request.get("prompt_logprobs")
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int | float):
        raise bad_request(
            f"`prompt_logprobs` must be an integer. (parameter=prompt_logprobs, value={k})", "prompt_logprobs"
        )
    if k < 0 and k != -1:
        raise bad_request(
            f"`prompt_logprobs` must be a positive value or -1. (parameter=prompt_logprobs, value={k})",
            "prompt_logprobs",
        )
    wanted = vocab_size if k == -1 else int(k)
    if wanted > MAX_LOGPROBS:
        raise bad_request(
            f"Requested prompt logprobs of {wanted}, which is greater than max allowed: {MAX_LOGPROBS} "
            f"(parameter=prompt_logprobs, value={wanted})",
            "prompt_logprobs",
        )
    return wanted


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of an integer."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


class Scorer:
    """Scores token sequences for one server: `vocab_size` ids, `decoded` their texts (vLLM's `decoded_token`)."""

    def __init__(self, seed: int, vocab_size: int, decoded: Sequence[str]) -> None:
        self.seed, self.vocab_size, self.decoded = seed, vocab_size, decoded
        self.keys = [str(i) for i in range(vocab_size)]
        # strides coprime with the vocabulary: MAX_LOGPROBS consecutive steps from a base never repeat an id
        self.strides = [s for s in range(7, vocab_size, 2) if _gcd(s, vocab_size) == 1][:64] or [1]

    def prompt_logprobs(self, ids: list[int], k: int) -> list[dict[str, Any] | None]:
        """One entry per position of `ids` (the first null), as vLLM answers `prompt_logprobs: k`."""
        out: list[dict[str, Any] | None] = [None]
        context = _mix(self.seed * 7919 + 17)
        entry = self._entry
        for i in range(1, len(ids)):
            context = hash((context, ids[i - 1])) & MASK  # an int tuple's hash: the same in every process
            out.append(entry(context, ids[i], k))
        return out

    def _entry(self, context: int, token: int, k: int) -> dict[str, Any]:
        """The position's distribution: the top MAX_LOGPROBS ids (a base and a stride the context picks) with
        falling logprobs; the own token at a rank drawn from the context and itself (the top one half the time,
        in the top list three times in ten more, else far below it). The list is made only when it is asked for
        (k > 0): the own token's value and rank do not depend on it."""
        top_value = -0.02 - ((context >> 29) % 1000) / 800.0
        step = 0.05 + ((context >> 41) % 100) / 200.0
        draw = hash((token, context)) & MASK
        roll = draw % 100
        rank = 1 if roll < 50 else 2 + draw % (MAX_LOGPROBS - 1) if roll < 80 else MAX_LOGPROBS + 1 + draw % 997
        own_value = (
            top_value - (rank - 1) * step
            if rank <= MAX_LOGPROBS
            else top_value - MAX_LOGPROBS * step - 0.5 - (draw >> 20) % 1000 / 250.0
        )
        keys, decoded = self.keys, self.decoded
        entry = {keys[token]: {"logprob": round(own_value, 6), "rank": rank, "decoded_token": decoded[token]}}
        if not k:
            return entry
        vocab = self.vocab_size
        base, stride = context % vocab, self.strides[(context >> 17) % len(self.strides)]
        listed = [(base + j * stride) % vocab for j in range(MAX_LOGPROBS)]
        if rank <= MAX_LOGPROBS:  # the own token takes its rank's place; the id there moves to the own token's
            if token in listed:
                at = listed.index(token)
                listed[at], listed[rank - 1] = listed[rank - 1], token
            else:
                listed[rank - 1] = token
        elif token in listed:  # ranked below the list: another id takes its place there
            other = (token + 1) % vocab
            while other in listed:
                other = (other + 1) % vocab
            listed[listed.index(token)] = other
        for j in range(min(k, MAX_LOGPROBS)):
            other = listed[j]
            entry.setdefault(
                keys[other], {"logprob": round(top_value - j * step, 6), "rank": j + 1, "decoded_token": decoded[other]}
            )
        return entry


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
