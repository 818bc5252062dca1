"""Run counters and the system's own report: the summary table and the manifest both read them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
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

    def __add__(self, other: StageStats) -> StageStats:
        """Two runs' counters as one (datatrove's stats add up the same way)."""
        return StageStats(**{k: getattr(self, k) + getattr(other, k) for k in self.__slots__})

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StageStats:
        """`to_dict`'s output (a manifest's `last_run.stats.stages[NAME]`) back as counters."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if isinstance(data.get(f.name), int | float)})


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
    calls_replayed: int = 0  # answered from the call journal of an earlier, stopped run (not asked again)
    problems_beyond_target: int = 0  # read, but left when --target-groups was reached (a rerun with more goes on)
    # tool use: every call the model made, and those that went wrong (the model was shown the error)
    tool_calls: int = 0
    tool_calls_malformed: int = 0  # unreadable: broken JSON, no name, no closing tag
    tool_calls_unknown: int = 0  # named no tool on offer
    tool_calls_failed: int = 0  # bad arguments, the tool raised, or the python tool's program failed
    tool_calls_timed_out: int = 0
    tool_calls_not_run: int = 0  # made on the last turn allowed (max_turns) or with no room left to go on
    # the system's own report, over every execution generated (written or filtered)
    final_reward_sum: float = 0.0
    majority_correct: int = 0
    best_of_n_correct: int = 0
    selections: int = 0
    system_correct: int = 0
    stages: dict[str, StageStats] = field(default_factory=lambda: {s: StageStats() for s in STAGES})

    def stage(self, name: str) -> StageStats:
        """A stage's counters, made on first use: a system may name any stages."""
        found = self.stages.get(name)
        if found is None:
            found = self.stages[name] = StageStats()
        return found

    def use_stages(self, names: tuple[str, ...]) -> None:
        """Report the system's stages, in its order (three-stage's by default)."""
        self.stages = {name: self.stages.get(name) or StageStats() for name in names}

    @property
    def mean_final_reward(self) -> float | None:
        """The executions' outcomes (final reward) on average, over the settled groups."""
        return _ratio(self.final_reward_sum, self.executions)

    @property
    def groups_settled(self) -> int:
        return (
            self.groups_written
            + self.groups_filtered
            + self.groups_failed
            + self.groups_invalid
            + self.problems_skipped_done
        )

    def add_execution(self, samples: list[Sample]) -> None:
        self.executions += 1
        for sample in samples:
            self.stage(sample.stage).add(sample)
        solvers = [s for s in samples if s.stage == "solver"]
        self.majority_correct += majority_correct(solvers)
        self.best_of_n_correct += any(s.raw_reward == 1.0 for s in solvers)
        self.selections += any(s.stage == "selector" for s in samples)
        self.system_correct += samples[0].final_reward == 1.0
        self.final_reward_sum += samples[0].final_reward if samples else 0.0

    def report(self) -> dict[str, float | None]:
        """Does the system earn its cost? Each stage's accuracy (mean raw reward; the selector's over its picks),
        majority vote and best of N over the solvers, the system's accuracy (final rewards of 1), and tokens per
        stage. For three-stage: solver, majority vote, best of N, rewriter, selector pick, system."""
        out: dict[str, float | None] = {}
        for name, st in self.stages.items():
            if name == "selector":
                out["selector_pick_accuracy"] = _ratio(st.raw_reward_sum, self.selections)
            else:
                out[f"{name}_accuracy"] = st.mean_raw_reward
            if name == "solver":
                out["majority_vote_accuracy"] = _ratio(self.majority_correct, self.executions)
                out["best_of_n_accuracy"] = _ratio(self.best_of_n_correct, self.executions)
        out["system_accuracy"] = _ratio(self.system_correct, self.executions)
        out.update({f"{name}_tokens": float(s.prompt_tokens + s.response_tokens) for name, s in self.stages.items()})
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in self.__slots__ if k != "stages"}
        out["stages"] = {name: s.to_dict() for name, s in self.stages.items()}
        out["report"] = self.report()
        out["selector_accuracy"] = out["report"].get("selector_pick_accuracy")  # for readers of older manifests
        total = sum(s.samples for s in self.stages.values())
        out["truncation_rate"] = _ratio(sum(s.truncated for s in self.stages.values()), total)
        return out

    def __add__(self, other: RunStats) -> RunStats:
        """Two runs' figures as one, e.g. the partitions of a --ray job; the report is recomputed from the sums.
        Stages keep this run's order, then the other's new ones."""
        total = RunStats(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self) if f.name != "stages"}
        )
        total.stages = {
            name: self.stages.get(name, StageStats()) + other.stages.get(name, StageStats())
            for name in {**self.stages, **other.stages}
        }
        return total

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunStats:
        """`to_dict`'s output (a manifest's `last_run.stats`) back as counters; derived figures are dropped."""
        stats = cls(
            **{
                f.name: data[f.name]
                for f in fields(cls)
                if f.name != "stages" and isinstance(data.get(f.name), int | float)
            }
        )
        if isinstance(data.get("stages"), dict):
            stats.stages = {name: StageStats.from_dict(s) for name, s in data["stages"].items()}
        return stats
