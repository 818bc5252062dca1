"""Run counters that add up: the summary table and the manifest both read them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .schema import STAGES, Sample


@dataclass(slots=True)
class StageStats:
    samples: int = 0
    raw_reward_sum: float = 0.0
    truncated: int = 0
    aborted: int = 0
    with_content: int = 0
    prompt_tokens: int = 0
    response_tokens: int = 0
    failed_calls: int = 0
    skipped_calls: int = 0  # no room left in the context window: the call is not made

    def add(self, sample: Sample) -> None:
        self.samples += 1
        self.raw_reward_sum += sample.raw_reward
        self.truncated += sample.status == "truncated"
        self.aborted += sample.status == "aborted"
        self.with_content += sample.content is not None
        self.prompt_tokens += len(sample.prompt_token_ids)
        self.response_tokens += len(sample.response_token_ids)

    @property
    def mean_raw_reward(self) -> float | None:
        return self.raw_reward_sum / self.samples if self.samples else None


@dataclass(slots=True)
class RunStats:
    problems: int = 0
    problems_skipped_done: int = 0
    executions: int = 0
    executions_empty: int = 0  # every call failed or was skipped: nothing to write, retried on a rerun
    invalid_rows: int = 0
    records_written: int = 0
    stages: dict[str, StageStats] = field(default_factory=lambda: {s: StageStats() for s in STAGES})

    def add_samples(self, samples: list[Sample]) -> None:
        for sample in samples:
            self.stages[sample.stage].add(sample)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: getattr(self, k)
            for k in ("problems", "problems_skipped_done", "executions", "executions_empty", "invalid_rows",
                      "records_written")
        }
        out["stages"] = {
            name: {**{k: getattr(s, k) for k in s.__slots__}, "mean_raw_reward": s.mean_raw_reward}
            for name, s in self.stages.items()
        }
        selector = self.stages["selector"]
        out["selector_accuracy"] = selector.mean_raw_reward
        total = sum(s.samples for s in self.stages.values())
        out["truncation_rate"] = sum(s.truncated for s in self.stages.values()) / total if total else None
        return out
