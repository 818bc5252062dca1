"""Length shaping, applied after the system's own shaping: DAPO's soft overlong punishment and overlong filter.

Soft overlong punishment (a buffer of B tokens below a response's budget L, its `max_tokens` as sent): a response
of at most L - B tokens is not touched; one in the buffer loses `penalty` x (length - (L - B)) / B; one that
used the whole budget (truncated) loses `penalty`. The overlong filter keeps truncated samples out of training:
`mask` zeroes their loss mask (the record stays, token-exact), `drop` also marks them `trainable: false`, so
every converter leaves them out (`dropped`: not a frozen stage, which `--include-frozen` would bring back). Each
touched record says so in `reward_info`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from agentroll.errors import UsageError
from agentroll.record.schema import Sample

FILTERS = ("none", "mask", "drop")
DROP_NOTE = "overlong filter: drop"  # the `reward_info` note of a sample `drop` took out of training


def dropped(record: Mapping[str, Any]) -> bool:
    """Whether `--overlong-filter drop` took this record (a dict) out of training: truncated, `trainable: false`,
    and its `reward_info` notes it. The record schema has no field for it, and a frozen stage's record is
    `trainable: false` too, but only a dropped one carries the note."""
    info = record.get("reward_info") or ""
    return (
        record.get("trainable", True) is False
        and record.get("status") == "truncated"
        and DROP_NOTE in str(info).split("; ")
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class LengthShaping:
    buffer: int = 0  # --overlong-buffer: tokens below the budget where the soft punishment starts (0: off)
    penalty: float = 1.0  # --overlong-penalty: what a response at its budget loses
    filter: str = "none"  # --overlong-filter: none | mask | drop

    def __post_init__(self) -> None:
        if isinstance(self.buffer, bool) or not isinstance(self.buffer, int) or self.buffer < 0:
            raise UsageError(f"--overlong-buffer must be a whole number of tokens, 0 or more, got {self.buffer!r}")
        if isinstance(self.penalty, bool) or not isinstance(self.penalty, int | float) or not self.penalty >= 0:
            raise UsageError(f"--overlong-penalty must be a number, 0 or more, got {self.penalty!r}")
        if self.filter not in FILTERS:
            raise UsageError(f"--overlong-filter must be one of {', '.join(FILTERS)}, not {self.filter!r}")

    @property
    def active(self) -> bool:
        return self.buffer > 0 or self.filter != "none"

    def settings(self) -> dict[str, Any] | None:
        """What the settings guard keeps (None when off: folders made before it stay resumable)."""
        return asdict(self) if self.active else None

    def punishment(self, length: int, budget: int) -> float:
        """The soft punishment of a response of `length` tokens out of `budget` (a number, 0 or negative)."""
        if self.buffer <= 0 or budget <= 0:
            return 0.0
        start = max(0, budget - self.buffer)
        if length <= start:
            return 0.0
        return -self.penalty * min(1.0, (length - start) / max(1, budget - start))

    @staticmethod
    def unnoted(info: str | None) -> str | None:
        """A record's `reward_info` without the notes `apply` added (before it is applied again)."""
        if not info:
            return info
        kept = [part for part in info.split("; ") if not part.startswith("overlong")]
        return "; ".join(kept) or None

    def apply(self, samples: list[Sample]) -> None:
        """Shape one execution's samples in place (after the system shaped them)."""
        for sample in samples:
            notes = []
            budget = int(sample.sampling.get("max_tokens") or 0)
            cut = self.punishment(len(sample.response_token_ids), budget)
            if cut:
                sample.reward += cut
                notes.append(f"overlong {cut:+.3f} ({len(sample.response_token_ids)} of {budget} tokens)")
            if sample.status == "truncated" and self.filter != "none":
                sample.loss_mask = [0] * len(sample.loss_mask)
                if self.filter == "drop":
                    sample.trainable = False
                notes.append(DROP_NOTE if self.filter == "drop" else f"overlong filter: {self.filter}")
            if notes:
                sample.reward_info = "; ".join([*([sample.reward_info] if sample.reward_info else []), *notes])
        if self.filter != "none":
            _unmask_history(samples)


def _unmask_history(samples: list[Sample]) -> None:
    """A later turn of a conversation repeats an earlier turn's response in its prompt, marked by `history_mask`
    as the model's own: where the filter zeroed that turn's loss mask, its tokens must not be trained through the
    later turn's history either (whole-conversation converters read it). Samples are the execution's records in
    write order (`continues` indexes them), so an earlier turn is settled before the turns that continue it."""
    for sample in samples:
        if sample.continues is None or sample.history_mask is None:
            continue
        earlier = samples[sample.continues]
        p = len(earlier.prompt_token_ids)
        allowed = [*(earlier.history_mask or [0] * p), *earlier.loss_mask]
        for i, keep in enumerate(allowed[: len(sample.history_mask)]):
            if not keep and sample.history_mask[i]:
                sample.history_mask[i] = 0
                if sample.history_logprobs is not None:
                    sample.history_logprobs[i] = 0.0
