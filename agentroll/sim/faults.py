"""Fault injection: what a real deployment does to a client now and then, on demand and seeded."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Faults:
    """Rates are probabilities per request (per sequence for `stop_token_rate`); each request draws once among
    drop, error, malformed and abort, in that order, so their rates add up (keep the sum at most 1)."""

    error_rate: float = 0.0  # answered 500 or 503, alternating both vLLM error shapes (nested and pre-0.10.1 flat)
    drop_rate: float = 0.0  # connection closed with no answer, after the latency (a crash or a proxy reset)
    latency_s: float = 0.0  # seconds each completion spends running, once the scheduler admits it
    decode_latency_s: float = 0.0  # and per token it generates: decoding costs per token, a prefill barely
    malformed_rate: float = 0.0  # 200 with a body that is no completion: an HTML page, `[]`, or no `choices`
    abort_rate: float = 0.0  # 200 whose sequences end `finish_reason: "abort"`, cut short (vLLM aborted them)
    stop_token_rate: float = 0.0  # a sequence emits `<|endoftext|>` where its answer ends, before EOS
    tokenize_error_rate: float = 0.0  # POST /tokenize answered 500 or 503
    tokenize_latency_s: float = 0.0  # seconds before /tokenize answers

    def __post_init__(self) -> None:
        rates = {name: value for name, value in vars(self).items() if name.endswith("_rate")}
        for name, value in rates.items():
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be between 0 and 1, got {value}")
        if self.drop_rate + self.error_rate + self.malformed_rate + self.abort_rate > 1.0:
            raise ValueError("drop_rate + error_rate + malformed_rate + abort_rate must be at most 1")
        if self.latency_s < 0 or self.tokenize_latency_s < 0 or self.decode_latency_s < 0:
            raise ValueError("latencies must not be negative")
