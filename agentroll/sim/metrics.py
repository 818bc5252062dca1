"""GET /metrics: a subset of vLLM's Prometheus series, byte for byte in prometheus_client's text format.

Names, HELP texts, label names and their order, the `_created` companions of counters and the float spelling
are vLLM 0.32's (docs/simulated-server.md lists the series). Anything that scrapes a real vLLM — a dashboard,
an autoscaler, agentroll's benchmarks — can scrape the simulator.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")
_WAITING_HELP = (
    "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; "
    "'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of "
    "all reasons equals vllm:num_requests_waiting."
)


@dataclass
class Counters:
    """What the engine has done so far, as vLLM counts it: finished sequences by reason (client disconnects are
    not counted, as in vLLM), and prompt and generated tokens."""

    created: float
    prompt_tokens: int = 0
    generation_tokens: int = 0
    finished: Counter[str] = field(default_factory=Counter)


def go_float(value: float) -> str:
    """prometheus_client's float spelling (Go's): 3.0, 1.7960693389804e+09, +Inf."""
    value = float(value)
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    text = repr(value)
    dot = text.find(".")
    if value > 0 and dot > 6:
        mantissa = f"{text[0]}.{text[1:dot]}{text[dot + 1 :]}".rstrip("0.")
        return f"{mantissa}e+0{dot - 1}"
    return text


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(
    model: str, running: int, waiting: int, kv_usage: float, counters: Counters, first_request_at: float | None
) -> bytes:
    base = f'engine="0",model_name="{_escape(model)}"'
    lines: list[str] = []

    def series(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(
            f"{name}{{{labels}}} {go_float(value)}" if labels else f"{name} {go_float(value)}"
            for labels, value in samples
        )

    def counter(stem: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        series(f"{stem}_total", "counter", help_text, samples)
        series(f"{stem}_created", "gauge", help_text, [(labels, counters.created) for labels, _ in samples])

    series("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", [(base, running)])
    series("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", [(base, waiting)])
    series(
        "vllm:num_requests_waiting_by_reason",
        "gauge",
        _WAITING_HELP,
        [(f'{base},reason="capacity"', waiting), (f'{base},reason="deferred"', 0)],
    )
    series("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", [(base, kv_usage)])
    counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", [(base, 0)])
    counter("vllm:prompt_tokens", "Number of prefill tokens processed.", [(base, counters.prompt_tokens)])
    counter("vllm:generation_tokens", "Number of generation tokens processed.", [(base, counters.generation_tokens)])
    counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        [
            (f'engine="0",finished_reason="{r}",model_name="{_escape(model)}"', counters.finished[r])
            for r in FINISHED_REASONS
        ],
    )
    series(
        "agentroll_sim_first_request_unix",
        "gauge",
        "When the simulator received its first completion request (0 before), for start-up benchmarks.",
        [("", first_request_at or 0.0)],
    )
    return ("\n".join(lines) + "\n").encode()
