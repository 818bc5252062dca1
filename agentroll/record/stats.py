"""Run counters and the report made of them: the summary table, the progress line and the manifest read them.

Three kinds of counter, all of which add up: the engine's (rows, groups, rewards: fields of `RunStats`), each
stage's (`StageStats`), and the system's own, which its vocabulary (`agentroll.systems.vocabulary`) tallies
per execution into `counters` (through `Tally`, what the counters ask of it). A report figure (`Figure`) is one
counter over another, so two runs' counters add up and the report is recomputed from the sums: the Ray driver and
`agentroll merge` need nothing but them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

from agentroll.record.headtohead import Comparison
from agentroll.record.schema import STAGES, Sample


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


@dataclass(slots=True)
class TeacherStats:
    """A stage's sampled tokens against a teacher's scores of them (`--teacher`, `agentroll distill`): the gap
    student minus teacher (mean and largest: where the student is most sure of what the teacher finds unlikely),
    k3, the low-variance estimate of KL(student || teacher) on the student's own samples (the reverse KL that
    on-policy distillation minimises: mean of r - 1 - log r, r = p_teacher / p_student), and the share of tokens
    whose teacher's most likely token is another one (rank above 1). Counters that add up (the largest: its max)."""

    tokens: int = 0
    gap_sum: float = 0.0
    gap_max: float | None = None
    k3_sum: float = 0.0
    other_top: int = 0

    def add(self, sample: Sample) -> None:
        teacher = sample.teacher_logprobs
        if teacher is None:
            return
        most = self.gap_max
        ranks = sample.teacher_ranks if sample.teacher_ranks is not None else [0] * len(teacher)
        for own, theirs, rank in zip(sample.response_logprobs, teacher, ranks, strict=False):
            gap = own - theirs
            self.tokens += 1
            self.gap_sum += gap
            most = gap if most is None or gap > most else most
            self.k3_sum += math.expm1(min(-gap, 700.0)) + gap  # r - 1 - log r, with log r = -gap
            self.other_top += rank != 1
        self.gap_max = most

    def __add__(self, other: TeacherStats) -> TeacherStats:
        highs = [m for m in (self.gap_max, other.gap_max) if m is not None]
        return TeacherStats(
            self.tokens + other.tokens,
            self.gap_sum + other.gap_sum,
            max(highs) if highs else None,
            self.k3_sum + other.k3_sum,
            self.other_top + other.other_top,
        )

    def figures(self) -> dict[str, float | None]:
        n = self.tokens
        return {
            "mean_gap": self.gap_sum / n if n else None,
            "max_gap": self.gap_max,
            "kl_k3": self.k3_sum / n if n else None,
            "other_top_share": self.other_top / n if n else None,
        }

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.__slots__}, **self.figures()}

    @classmethod
    def from_dict(cls, data: Any) -> TeacherStats:
        if not isinstance(data, dict):
            return cls()
        return cls(**{k: data[k] for k in cls.__slots__ if k in data and (data[k] is None or _number(data[k]))})


@dataclass(frozen=True, slots=True)
class Figure:
    """A report figure: the counter `of` over the counter `over`; None ("-") while `over` is 0, or while `needs`
    (a counter) is 0, where the figure does not apply (a majority vote with no boxed answer to vote on).

    A counter is a `RunStats` field (`executions`, `system_correct`), one the system tallies
    (`majority_correct`), or a stage's (`solver.raw_reward_sum`, `solver.samples`). `label` is how the
    summary, `stats` and the page name it. `stage`: the stage whose accuracy the figure stands for (that stage's
    default `STAGE_accuracy` is then not reported: three-stage's selector is judged by its picks). `unit`: none
    for a share (from 0 to 1, drawn with the accuracies), else what the figure counts (`per execution`: model
    calls per execution), drawn on a scale of its own."""

    key: str
    label: str
    of: str
    over: str = "executions"
    needs: str | None = None
    stage: str | None = None
    unit: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, data: Any) -> Figure | None:
        names = {f.name for f in fields(cls)}
        if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in ("key", "label", "of")):
            return None
        return cls(**{k: v for k, v in data.items() if k in names and isinstance(v, str)})


def accuracy(stage: str) -> Figure:
    """A stage's accuracy: its mean raw reward (what every stage reports unless its system says otherwise)."""
    return Figure(f"{stage}_accuracy", stage, f"{stage}.raw_reward_sum", f"{stage}.samples", stage=stage)


SYSTEM_ACCURACY = Figure("system_accuracy", "system", "system_correct")  # final rewards of 1: every system's
# figures in `to_dict` (older manifests' too), not counters (a head-to-head run's "policies" and "head_to_head"
# are objects, which counters never are)
DERIVED = frozenset({"truncation_rate", "selector_accuracy"})


class Tally(Protocol):
    """What the counters ask of a system's vocabulary (`agentroll.systems.vocabulary.Vocabulary` is one): its
    figures, the counters it shows at 0, and what one execution adds. Declared here, below the systems, so the
    record's counters never import the systems that count into them."""

    @property
    def figures(self) -> tuple[Figure, ...]: ...

    @property
    def counters(self) -> tuple[str, ...]: ...

    def tally(self, samples: list[Sample]) -> Mapping[str, float]: ...

    def progress(self, counters: Mapping[str, float]) -> str | None: ...


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
    groups_held: int = 0  # written frozen: a sample the judge gave no verdict (--judge-failures keep)
    reward_timeouts: int = 0
    reward_errors: int = 0
    reward_invalid: int = 0  # NaN or infinite rewards refused
    calls_replayed: int = 0  # answered from the call journal of an earlier, stopped run (not asked again)
    # --reward judge: requests sent (retries included), verdicts replayed from the journal, requests asked again,
    # samples left without a verdict, the judge's tokens, and the seconds its requests took (summed, overlapping)
    judge_requests: int = 0
    judge_replayed: int = 0
    judge_retried: int = 0
    judge_failed: int = 0
    judge_prompt_tokens: int = 0
    judge_completion_tokens: int = 0
    judge_wall_s: float = 0.0
    problems_beyond_target: int = 0  # read, but left when --target-groups was reached (a rerun with more goes on)
    # every execution generated (written or filtered): its outcome, and what the system tallies of it
    final_reward_sum: float = 0.0
    system_correct: int = 0
    counters: dict[str, float] = field(default_factory=dict)  # the system's own, by name (written flat)
    figures: tuple[Figure, ...] = ()  # the system's report figures over the counters (`report`)
    stages: dict[str, StageStats] = field(default_factory=lambda: {s: StageStats() for s in STAGES})
    teacher: dict[str, TeacherStats] = field(default_factory=dict)  # per stage, the stages a teacher scored
    vocabulary: Tally | None = field(default=None, repr=False, compare=False)  # tallies each execution
    # a head-to-head run (`--policy`): each policy's own figures, and the problem-by-problem comparison
    policies: dict[str, RunStats] = field(default_factory=dict)
    compared: Comparison = field(default_factory=Comparison, repr=False, compare=False)

    def stage(self, name: str) -> StageStats:
        """A stage's counters, made on first use: a system may name any stages."""
        found = self.stages.get(name)
        if found is None:
            found = self.stages[name] = StageStats()
        return found

    def use_stages(self, names: tuple[str, ...], vocabulary: Tally | None = None) -> None:
        """Report the system's stages, in its order, and (given its vocabulary) its figures, tallied per
        execution. Without it, the stages' accuracies and the system's."""
        self.stages = {name: self.stages.get(name) or StageStats() for name in names}
        if vocabulary is not None:
            self.vocabulary, self.figures = vocabulary, tuple(vocabulary.figures)
            for name in vocabulary.counters:
                self.counters.setdefault(name, 0)

    def count(self, name: str, n: float = 1) -> None:
        """Add `n` to the system's counter `name`."""
        if name in ENGINE or "." in name:
            raise ValueError(f"counter {name!r}: a system's counter may not be named as the run's own or a stage's")
        have = self.counters.get(name, 0)
        self.counters[name] = have + (int(n) if isinstance(n, bool) else n)

    def value(self, name: str) -> float:
        """A counter by name: a field (`executions`), a stage's (`solver.samples`), or the system's (0 if never
        counted)."""
        stage, dot, part = name.partition(".")
        if dot:
            found = self.stages.get(stage)
            return float(getattr(found, part)) if found is not None and part in StageStats.__slots__ else 0.0
        return float(getattr(self, name)) if name in ENGINE else float(self.counters.get(name, 0))

    def figure(self, figure: Figure) -> float | None:
        if figure.needs is not None and not self.value(figure.needs):
            return None
        whole = self.value(figure.over)
        return self.value(figure.of) / whole if whole else None

    def report_figures(self) -> list[Figure]:
        """The system's figures, then the accuracy of each stage none of them stands for, then the system's."""
        covered = {f.stage for f in self.figures}
        return [*self.figures, *(accuracy(s) for s in self.stages if s not in covered), SYSTEM_ACCURACY]

    @property
    def mean_final_reward(self) -> float | None:
        """The executions' outcomes (final reward) on average, over the settled groups."""
        return self.final_reward_sum / self.executions if self.executions else None

    @property
    def rows_refused(self) -> int:
        """Rows skipped under --skip-invalid before they became groups (unreadable, or refused as read):
        `invalid_rows` also counts the groups that turned invalid as they ran, which `groups_invalid` holds."""
        return max(0, self.invalid_rows - self.groups_invalid)

    @property
    def groups_settled(self) -> int:
        """Rows of the input done with: a group written, filtered, failed or invalid, a row skipped as done or
        refused."""
        return (
            self.groups_written
            + self.groups_filtered
            + self.groups_failed
            + self.groups_invalid
            + self.problems_skipped_done
            + self.rows_refused
        )

    def policy(self, name: str) -> RunStats:
        """A policy's own figures (made on first use, with this run's stages and system figures)."""
        found = self.policies.get(name)
        if found is None:
            found = self.policies[name] = RunStats(stages={})
            found.use_stages(tuple(self.stages), self.vocabulary)
            found.figures = self.figures
        return found

    def compare(self, problem_id: str, executions: list[list[Sample]]) -> None:
        """A settled group of a head-to-head run: its policies' means, for the head-to-head table."""
        self.compared.add_group(problem_id, executions)

    def add_execution(self, samples: list[Sample]) -> None:
        """An execution of a settled group, counted here and, in a head-to-head run, in its policy's figures."""
        policy = getattr(samples[0], "policy", None) if samples else None  # (what the counters read of a Sample)
        if policy is not None:
            self.policy(policy)._add(samples)
        self._add(samples)

    def _add(self, samples: list[Sample]) -> None:
        self.executions += 1
        for sample in samples:
            self.stage(sample.stage).add(sample)
            if sample.teacher_logprobs is not None:
                self.teacher.setdefault(sample.stage, TeacherStats()).add(sample)
        if samples:
            self.system_correct += samples[0].final_reward == 1.0
            self.final_reward_sum += samples[0].final_reward
        if self.vocabulary is not None:
            for name, n in self.vocabulary.tally(samples).items():
                self.count(name, n)
        for sample in samples:  # --reward-component: each part's sum and samples, as counters (they add up)
            for name, part in (getattr(sample, "reward_components", None) or {}).items():
                self.count(f"component_{name}_sum", part["value"])
                self.count(f"component_{name}_samples")

    def component_means(self) -> dict[str, float]:
        """Each reward component's mean value over the samples that have it (`--reward-component`)."""
        out = {}
        for key, total in self.counters.items():
            if key.startswith("component_") and key.endswith("_sum"):
                name = key[len("component_") : -len("_sum")]
                n = self.counters.get(f"component_{name}_samples", 0)
                if n:
                    out[name] = total / n
        return out

    def report(self) -> dict[str, float | None]:
        """Does the system earn its cost? Its figures (`report_figures`), then the tokens of each stage. A
        head-to-head run's figures are each policy's (`policies`): here they are None, never the two models'
        executions pooled (`agentroll.record.group`); the tokens, a cost, are the run's."""
        pooled = bool(self.policies)
        out: dict[str, float | None] = {f.key: None if pooled else self.figure(f) for f in self.report_figures()}
        out.update({f"{name}_tokens": float(s.prompt_tokens + s.response_tokens) for name, s in self.stages.items()})
        return out

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: getattr(self, k) for k in ENGINE}
        out.update(self.counters)
        out["stages"] = {name: s.to_dict() for name, s in self.stages.items()}
        out["report"] = self.report()
        out["figures"] = [f.to_dict() for f in self.figures]
        total = sum(s.samples for s in self.stages.values())
        out["truncation_rate"] = sum(s.truncated for s in self.stages.values()) / total if total else None
        if self.policies:
            out["policies"] = {name: stats.to_dict() for name, stats in self.policies.items()}
            out["head_to_head"] = self.compared.to_dict()
        if self.component_means():
            out["reward_components"] = self.component_means()
        if self.teacher:  # only a run with a teacher says anything of one
            out["teacher"] = {name: t.to_dict() for name, t in self.teacher.items()}
        return out

    def __add__(self, other: RunStats) -> RunStats:
        """Two runs' figures as one, e.g. the partitions of a --ray job; the report is recomputed from the sums.
        Stages and figures keep this run's order, then the other's new ones."""
        total = RunStats(**{k: getattr(self, k) + getattr(other, k) for k in ENGINE})
        names = {**self.counters, **other.counters}
        total.counters = {k: self.counters.get(k, 0) + other.counters.get(k, 0) for k in names}
        keys = {f.key for f in self.figures}
        total.figures = (*self.figures, *(f for f in other.figures if f.key not in keys))
        total.stages = {
            name: self.stages.get(name, StageStats()) + other.stages.get(name, StageStats())
            for name in {**self.stages, **other.stages}
        }
        total.vocabulary = self.vocabulary or other.vocabulary
        total.policies = {
            name: (self.policies[name] + other.policies[name])
            if name in self.policies and name in other.policies
            else self.policies.get(name) or other.policies[name]
            for name in {**self.policies, **other.policies}
        }
        total.compared = self.compared + other.compared
        total.teacher = {
            name: self.teacher.get(name, TeacherStats()) + other.teacher.get(name, TeacherStats())
            for name in {**self.teacher, **other.teacher}
        }
        return total

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunStats:
        """`to_dict`'s output (a manifest's `last_run.stats`) back as counters; derived figures are dropped.
        Any other number at the top is a system's counter (as `to_dict` writes them)."""
        stats = cls(**{k: data[k] for k in ENGINE if _number(data.get(k))})
        stats.counters = {
            k: v for k, v in data.items() if k not in ENGINE and k not in DERIVED and _number(v) and "." not in k
        }
        if isinstance(data.get("figures"), list):
            stats.figures = tuple(f for f in map(Figure.from_dict, data["figures"]) if f is not None)
        if isinstance(data.get("stages"), dict):
            stats.stages = {name: StageStats.from_dict(s) for name, s in data["stages"].items()}
        if isinstance(data.get("policies"), dict):
            stats.policies = {
                str(name): cls.from_dict(figures)
                for name, figures in data["policies"].items()
                if isinstance(figures, dict)
            }
            stats.compared = Comparison.from_dict(data.get("head_to_head"))
        if isinstance(data.get("teacher"), dict):
            stats.teacher = {name: TeacherStats.from_dict(t) for name, t in data["teacher"].items()}
        return stats


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


ENGINE = tuple(
    f.name
    for f in fields(RunStats)
    if f.name not in ("counters", "figures", "stages", "vocabulary", "policies", "compared", "teacher")
)
