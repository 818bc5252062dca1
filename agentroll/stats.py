"""Run counters and the system's own report: the summary table and the manifest both read them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .parsing import last_boxed
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

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.__slots__}, "mean_raw_reward": self.mean_raw_reward}


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole else None


def majority_correct(solvers: list[Sample]) -> bool:
    """Does the most common boxed answer among the solvers score 1? Ties go to the answer seen first."""
    votes: Counter[str] = Counter()
    reward_of: dict[str, float] = {}
    for s in solvers:
        answer = last_boxed(s.content) if s.content else None
        if answer is not None:
            key = " ".join(answer.split())
            votes[key] += 1
            reward_of.setdefault(key, s.raw_reward)
    return bool(votes) and reward_of[votes.most_common(1)[0][0]] == 1.0


@dataclass(slots=True)
class RunStats:
    problems: int = 0  # rows read (after --partition and --limit), valid or not
    problems_skipped_done: int = 0  # already in the folder (committed or filtered by an earlier run)
    executions: int = 0  # executions of complete or filtered groups
    invalid_rows: int = 0  # bad rows skipped under --skip-invalid
    records_written: int = 0
    groups_written: int = 0
    groups_filtered: int = 0  # uniform groups left out by --filter-uniform-groups
    groups_resampled: int = 0  # extra group runs made by --resample-uniform
    groups_failed: int = 0  # a call or render failed for good: not written, redone by a rerun
    groups_invalid: int = 0  # the row could not run (e.g. its chat template rejects it)
    reward_timeouts: int = 0
    reward_errors: int = 0
    reward_invalid: int = 0  # NaN or infinite rewards refused
    # the system's own report, over every execution generated (written or filtered)
    majority_correct: int = 0
    best_of_n_correct: int = 0
    selections: int = 0
    system_correct: int = 0
    stages: dict[str, StageStats] = field(default_factory=lambda: {s: StageStats() for s in STAGES})

    @property
    def groups_settled(self) -> int:
        return (self.groups_written + self.groups_filtered + self.groups_failed + self.groups_invalid
                + self.problems_skipped_done)

    def add_execution(self, samples: list[Sample]) -> None:
        self.executions += 1
        for sample in samples:
            self.stages[sample.stage].add(sample)
        solvers = [s for s in samples if s.stage == "solver"]
        self.majority_correct += majority_correct(solvers)
        self.best_of_n_correct += any(s.raw_reward == 1.0 for s in solvers)
        self.selections += any(s.stage == "selector" for s in samples)
        self.system_correct += samples[0].final_reward == 1.0

    def report(self) -> dict[str, float | None]:
        """Does the three-stage system earn its cost? Accuracies over the run, and tokens per stage."""
        st = self.stages
        return {
            "solver_accuracy": st["solver"].mean_raw_reward,
            "majority_vote_accuracy": _ratio(self.majority_correct, self.executions),
            "best_of_n_accuracy": _ratio(self.best_of_n_correct, self.executions),
            "rewriter_accuracy": st["rewriter"].mean_raw_reward,
            "selector_pick_accuracy": _ratio(st["selector"].raw_reward_sum, self.selections),
            "system_accuracy": _ratio(self.system_correct, self.executions),
            **{f"{name}_tokens": float(s.prompt_tokens + s.response_tokens) for name, s in st.items()},
        }

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__slots__ if k != "stages"}
        out["stages"] = {name: s.to_dict() for name, s in self.stages.items()}
        out["report"] = self.report()
        out["selector_accuracy"] = out["report"]["selector_pick_accuracy"]  # kept for readers of older manifests
        total = sum(s.samples for s in self.stages.values())
        out["truncation_rate"] = _ratio(sum(s.truncated for s in self.stages.values()), total)
        return out
