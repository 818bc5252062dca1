"""The logprob vLLM would have recorded for a sampled token, from the trainer's logits (needs torch).

What vLLM's v1 sampler computes (vllm/v1/sample/sampler.py and ops/topk_topp_sampler.py, 0.32.0):

- `raw_logprobs` (the default): `log_softmax` of the model's logits, in float32, before anything else:
  temperature, top-k, top-p and min-p do not enter.
- `processed_logprobs`: the logits in float32, divided by the temperature; then min-p (drop a token whose
  probability is below min_p times the largest); then top-k (drop a token whose logit is below the k-th largest;
  ties at the k-th are kept); then top-p (sorted ascending, drop a token while the cumulative probability up to
  and including it is <= 1 - top_p; the most likely token always stays); `log_softmax` over what is left.
  A greedy request (temperature < 1e-5) skips temperature and the filters when its whole batch is greedy, and
  not otherwise (temperature 1 and its filters apply): with any filter set, what it recorded depends on the
  batch vLLM ran it in, so such tokens are not compared. Penalties (never set by agentroll) would shift the
  logits before temperature: a run with them is not compared in processed mode either.

The filters are exact functions of the logits, but the trainer's logits are not the server's: a token at the
edge of a cut (its logit within `cut_noise` of the k-th, its cumulative probability within the matching margin
of 1 - top_p, ...) might have been cut on one side and kept on the other. So the kept set is computed three
times, nominal, loose and tight (every edge token kept, or dropped); a sampled token outside even the loose set
could not have been sampled ("outside"); one whose value moves by more than `ambiguity` between loose and tight
is not compared ("ambiguous cut"); every other token is compared with the nominal value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

GREEDY_EPS = 1e-5  # vLLM's _SAMPLING_EPS
OK, AMBIGUOUS, OUTSIDE, UNCOMPARABLE = 0, 1, 2, 3
PENALTIES, MASKED = 4, 5  # set by the caller: a run with penalties; a token outside a trainable record's loss mask


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0

    @classmethod
    def of(cls, record: dict[str, Any]) -> Sampling:
        s = record.get("sampling") or {}
        return cls(
            float(s.get("temperature", 1.0)),
            float(s.get("top_p", 1.0)),
            int(s.get("top_k", -1)),
            float(s.get("min_p", 0.0)),
        )

    def filters(self, vocab: int) -> bool:
        return self.top_p < 1.0 or 0 < self.top_k < vocab or self.min_p > 0.0


def raw(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log_softmax(logits)[token] per row, in float32."""
    z = logits.float()
    return z.gather(1, tokens[:, None])[:, 0] - torch.logsumexp(z, dim=-1)


def _kept(s: torch.Tensor, sampling: Sampling, edge: int, delta: float) -> torch.Tensor:
    """The tokens vLLM's filters keep, per row of temperature-scaled logits `s`. `edge` 0 is vLLM's own rule;
    -1 (loose) also keeps every token that logits off by up to `delta` could have kept, +1 (tight) only the
    tokens that such logits would keep for certain."""
    keep = torch.ones_like(s, dtype=torch.bool)
    vocab = s.shape[-1]
    if sampling.min_p > 0.0:
        gap = s - s.max(dim=-1, keepdim=True).values  # prob < min_p * max prob  <=>  gap < log(min_p)
        keep &= (gap >= math.log(sampling.min_p) + edge * 2 * delta) | (gap == 0)
    if 0 < sampling.top_k < vocab:
        masked = s.masked_fill(~keep, -math.inf)
        top = masked.topk(sampling.top_k + 1, dim=-1).values
        kth, next_ = top[:, -2:-1], top[:, -1:]
        if edge == 0:
            keep &= masked >= kth  # vLLM drops logits < the k-th: ties with it stay
        elif edge < 0:
            keep &= masked >= kth - 2 * delta
        else:  # above the (k+1)-th by the margin: no perturbation can push it out of the top k
            keep &= (masked > next_ + 2 * delta) | ((masked >= kth) & torch.isinf(next_))
    if sampling.top_p < 1.0:
        masked = s.masked_fill(~keep, -math.inf)
        ordered, order = masked.sort(dim=-1)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        margin = math.expm1(2 * delta)  # logits off by delta move a partial sum of probabilities by at most this
        drop = cumulative <= 1.0 - sampling.top_p + edge * margin
        drop[:, -1] = False
        keep &= ~torch.zeros_like(drop).scatter(1, order, drop)
    return keep


def processed(
    logits: torch.Tensor, tokens: torch.Tensor, sampling: Sampling, cut_noise: float, ambiguity: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, codes) per row: the processed logprob of each token and whether it can be compared (`OK`),
    was at the edge of a cut (`AMBIGUOUS`), lies outside what the filters keep (`OUTSIDE`, value -inf), or
    cannot be reproduced (`UNCOMPARABLE`: greedy with filters)."""
    z = logits.float()
    rows = torch.arange(z.shape[0], device=z.device)
    if sampling.temperature < GREEDY_EPS:
        codes = torch.full_like(tokens, UNCOMPARABLE if sampling.filters(z.shape[-1]) else OK)
        return raw(z, tokens), codes
    s = z / sampling.temperature
    if not sampling.filters(z.shape[-1]):
        return raw(s, tokens), torch.full_like(tokens, OK)
    delta = cut_noise / sampling.temperature
    values = []
    inside = []
    for edge in (0, -1, 1):
        keep = _kept(s, sampling, edge, delta)
        picked = s[rows, tokens]
        values.append(picked - torch.logsumexp(s.masked_fill(~keep, -math.inf), dim=-1))
        inside.append(keep[rows, tokens])
    nominal, loose, tight = values
    codes = torch.full_like(tokens, OK)
    spread = (loose - tight).abs()
    codes[~inside[2] | ~(spread <= ambiguity)] = AMBIGUOUS
    codes[~inside[1]] = OUTSIDE
    nominal = torch.where(inside[0], nominal, torch.full_like(nominal, -math.inf))
    return nominal, codes


def replayed(
    logits: torch.Tensor, tokens: torch.Tensor, sampling: Sampling, kept: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, codes) per row, the processed logprob renormalised over the kept set the server recorded
    (`--return-sampling-mask`) instead of one worked out from the logits: no edge to guess, so every token is
    compared (`OK`), or lies outside its set (`OUTSIDE`, value -inf)."""
    z = logits.float()
    s = z / sampling.temperature if sampling.temperature >= GREEDY_EPS else z
    keep = torch.zeros_like(s, dtype=torch.bool)
    for row, ids in enumerate(kept):
        keep[row, [i for i in ids if 0 <= i < s.shape[-1]]] = True
    rows = torch.arange(s.shape[0], device=s.device)
    inside = keep[rows, tokens]
    values = s[rows, tokens] - torch.logsumexp(s.masked_fill(~keep, -math.inf), dim=-1)
    values = torch.where(inside, values, torch.full_like(values, -math.inf))
    return values, torch.where(inside, torch.full_like(tokens, OK), torch.full_like(tokens, OUTSIDE))


def sampled_logprobs(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    mode: str,
    sampling: Sampling,
    cut_noise: float,
    ambiguity: float,
    kept: list[list[int]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, codes) as `processed`, for either logprobs mode (raw: every token comparable); processed values
    over the recorded kept sets (`replayed`) where the record has them."""
    if mode == "raw_logprobs":
        return raw(logits, tokens), torch.full_like(tokens, OK)
    if kept is not None:
        return replayed(logits, tokens, sampling, kept)
    return processed(logits, tokens, sampling, cut_noise, ambiguity)
