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

import math
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
    """Scores token sequences for one server: `vocab_size` ids, `decoded` their texts (vLLM's `decoded_token`).

    The one model of the simulator: `prompt_logprobs` (a teacher's scores) and `sampled` (the logprobs of an
    answer it generates) read the same function of (the ids before a position, the id at it), so a folder the
    simulator wrote, scored by the simulator, differs by 0 at every token, as a real vLLM scoring its own
    samples does (raw logprobs)."""

    def __init__(self, seed: int, vocab_size: int, decoded: Sequence[str]) -> None:
        self.seed, self.vocab_size, self.decoded = seed, vocab_size, decoded
        self.keys = [str(i) for i in range(vocab_size)]
        # strides coprime with the vocabulary: MAX_LOGPROBS consecutive steps from a base never repeat an id
        self.strides = [s for s in range(7, vocab_size, 2) if _gcd(s, vocab_size) == 1][:64] or [1]
        # the highest top value a step allows: the listed probabilities add up to at most 0.95, as a real
        # distribution's top list adds up to less than 1
        self.ceilings = [
            math.log(0.95) - math.log(sum(math.exp(-j * (0.05 + n / 200.0)) for j in range(MAX_LOGPROBS)))
            for n in range(100)
        ]

    def _contexts(self, ids: Sequence[int]) -> list[int]:
        """The context after each prefix ids[:i + 1]: a chained hash (an int tuple's hash, the same in every
        process), so a prompt's contexts are the first of its continuation's."""
        context = _mix(self.seed * 7919 + 17)
        out = []
        for token in ids:
            context = hash((context, token)) & MASK
            out.append(context)
        return out

    def prompt_logprobs(self, ids: list[int], k: int) -> list[dict[str, Any] | None]:
        """One entry per position of `ids` (the first null), as vLLM answers `prompt_logprobs: k`."""
        out: list[dict[str, Any] | None] = [None]
        keys, decoded, rank = self.keys, self.decoded, self._rank
        for context, token in zip(self._contexts(ids[:-1]), ids[1:], strict=True):
            own, own_rank, listed = rank(context, token, k)
            entry = {keys[token]: {"logprob": own, "rank": own_rank, "decoded_token": decoded[token]}}
            for other, value, r in listed:
                entry.setdefault(keys[other], {"logprob": value, "rank": r, "decoded_token": decoded[other]})
            out.append(entry)
        return out

    def sampled(
        self, prompt_ids: list[int], ids: list[int], k: int
    ) -> tuple[list[float], list[list[tuple[int, float, int]]], list[int]]:
        """The logprobs of an answer `ids` to `prompt_ids`: per token its logprob, the k most likely (id,
        logprob, rank) in rank order and its rank, the values `prompt_logprobs` gives the same positions of
        prompt + answer. A prefix of an answer (an abort) has the prefix of its values."""
        values: list[float] = []
        tops: list[list[tuple[int, float, int]]] = []
        ranks: list[int] = []
        contexts = self._contexts([*prompt_ids, *ids[:-1]])[len(prompt_ids) - 1 :] if ids else []
        for context, token in zip(contexts, ids, strict=True):
            own, own_rank, listed = self._rank(context, token, k)
            values.append(own)
            tops.append(listed)
            ranks.append(own_rank)
        return values, tops, ranks

    def _rank(self, context: int, token: int, k: int) -> tuple[float, int, list[tuple[int, float, int]]]:
        """The position's distribution: the top MAX_LOGPROBS ids (a base and a stride the context picks) with
        falling logprobs; the own token at a rank drawn from the context and itself (the top one half the time,
        in the top list three times in ten more, else far below it). Its value and rank, and the first k of the
        top list (made only when asked for: the own token's value and rank do not depend on it)."""
        steps = (context >> 41) % 100
        top_value = min(-0.02 - ((context >> 29) % 1000) / 800.0, self.ceilings[steps])
        step = 0.05 + steps / 200.0
        draw = hash((token, context)) & MASK
        roll = draw % 100
        rank = 1 if roll < 50 else 2 + draw % (MAX_LOGPROBS - 1) if roll < 80 else MAX_LOGPROBS + 1 + draw % 997
        own_value = (
            top_value - (rank - 1) * step
            if rank <= MAX_LOGPROBS
            else top_value - MAX_LOGPROBS * step - 0.5 - (draw >> 20) % 1000 / 250.0
        )
        if not k:
            return round(own_value, 6), rank, []
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
        top = [(listed[j], round(top_value - j * step, 6), j + 1) for j in range(min(k, MAX_LOGPROBS))]
        return round(own_value, 6), rank, top


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a
