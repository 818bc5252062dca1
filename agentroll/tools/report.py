"""`agentroll stats DIR`: the system's report recomputed from the records, so that it describes the data as it is
on disk (a merged folder, several resumed runs) rather than the last run, which is all `manifest.last_run` knows.

The stages are the folder's system's (`settings.system.stages` in the manifest; a folder without one is
three-stage), in its order. The figures are `agentroll.record.stats.RunStats`'s own, fed the folder's executions: the
same accuracy definitions as the run summary, by construction. Two differences from a run's report: only
written groups count (a run also counts the groups it filtered out), and calls that failed or were never made
leave no record, so `failed_calls` and `skipped_calls` are not known here. Each stage also says whether it is
`trainable` (False when its samples are marked `trainable: false`: a frozen model's).

pass@k is the unbiased estimator of the Codex paper, per problem, over the problem's K executions' outcomes
(`agentroll.record.group`: an execution is solved when its `final_reward` is 1, whatever its system and however many
calls it made): pass@k = 1 - C(K - c, k) / C(K, k), c the executions solved. It is reported for k = 1 .. the
largest K of any problem; the figure for k is the mean over the problems with at least k executions
(`problems` says how many); pass@K is the mean of the records' `group_pass_at_k`. A system whose outcome is not
pass/fail (`Vocabulary.pass_fail` False) has none.

A head-to-head folder (`generate --policy`): each section also has each policy's figures (a section of its own
over that policy's executions) and the problem-by-problem table (`agentroll.record.headtohead`); its own figures that
would pool two models' samples (the report, pass@k, mean rewards, truncation rate) are null there: only the
counts are the folder's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from rich.table import Table
from rich.text import Text

from ..record.group import Group, graded, outcome
from ..record.headtohead import Comparison
from ..record.schema import STAGES, Sample
from ..record.stats import RunStats
from ..systems.vocabulary import Vocabulary
from .system import LEGACY, SystemInfo, coerce, system_of, words

NONE_KEY = "(none)"  # the --by value of a group whose metadata lacks the field (or holds null)
STAGE_FIGURES = ("samples", "mean_raw_reward", "truncated", "with_content", "prompt_tokens", "response_tokens")


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): the chance that k of n samples drawn without replacement hold a correct one.
    Computed as a product, as in the Codex paper, so that large n neither overflows nor loses precision."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@{k} needs 0 < k <= n and 0 <= c <= n (n={n}, c={c})")
    if n - c < k:
        return 1.0
    missing = 1.0
    for i in range(n - c + 1, n + 1):
        missing *= 1.0 - k / i
    return 1.0 - missing


@dataclass(slots=True)
class Section:
    """The figures of one set of groups (the whole folder, or one value of --by): the system's `RunStats`, fed
    each execution, so that its vocabulary tallies them as a run does."""

    stages: tuple[str, ...]
    words: Vocabulary
    run: RunStats = field(default_factory=RunStats)
    outcome_counts: list[tuple[int, int]] = field(default_factory=list)  # per problem: (executions, solved)
    graded: bool = True  # every outcome within 0..1, where 1 is solved (weighted components may pass 1)
    frozen: dict[str, int] = field(default_factory=dict)  # per stage: samples marked trainable: false
    records: int = 0
    # a head-to-head folder (`generate --policy`): each policy's own figures, and the problem-by-problem table
    policies: dict[str, Section] = field(default_factory=dict)
    compared: Comparison = field(default_factory=Comparison)
    whole_groups: bool = True  # False: a policy's part of the groups (not split again)

    def __post_init__(self) -> None:
        self.run.stages = {}
        self.run.use_stages(self.stages, self.words)

    def sections(self) -> list[Section]:
        """This section and its policies' ones."""
        return [self, *self.policies.values()]

    def add(self, group: Group) -> None:
        if self.whole_groups:
            parts = by_policy(group)
            for name, part in parts.items():
                self.policies.setdefault(name, Section(self.stages, self.words, whole_groups=False)).add(part)
            if parts:
                self.compared.add_group(group.problem_id, group.executions)
        self._add(group)

    def _add(self, group: Group) -> None:
        for samples in group.executions:
            for s in samples:
                if not s.trainable:
                    self.frozen[s.stage] = self.frozen.get(s.stage, 0) + 1
            self.run.add_execution(samples)  # a stage the system does not declare (validate says so): after its own
            self.records += len(samples)
        outcomes = [outcome(samples) for samples in group.executions if samples]
        self.outcome_counts.append((len(outcomes), sum(o == 1.0 for o in outcomes)))
        self.graded = self.graded and graded(outcomes)  # outcomes off the 0..1 scale (weighted components)

    def to_dict(self) -> dict[str, Any]:
        run = self.run.to_dict()
        stages = {
            # not trainable: every sample of the stage frozen (a frozen model's), not a group a judge held back
            name: {**{k: figures[k] for k in STAGE_FIGURES}, "trainable": self.frozen.get(name, 0) < figures["samples"]}
            for name, figures in run["stages"].items()
        }
        pooled = bool(self.policies)  # a head-to-head folder's whole: two models' samples, no figure of its own
        passing = self.words.pass_fail and self.graded and not pooled
        top = max((n for n, _ in self.outcome_counts), default=0) if passing else 0
        passes = []
        for k in range(1, top + 1):
            values = [pass_at_k(n, c, k) for n, c in self.outcome_counts if n >= k]
            passes.append({"k": k, "value": sum(values) / len(values), "problems": len(values)})
        prompt = sum(s["prompt_tokens"] for s in stages.values())
        response = sum(s["response_tokens"] for s in stages.values())
        if pooled:
            for figures in stages.values():
                figures["mean_raw_reward"] = None
        return {
            "problems": len(self.outcome_counts),
            "executions": self.run.executions,
            "mean_final_reward": None if pooled else self.run.mean_final_reward,
            "records": self.records,
            "stages": stages,
            "report": {k: v if k.endswith("_tokens") or not pooled else None for k, v in run["report"].items()},
            "counters": dict(self.run.counters),
            "pass_at_k": passes,
            "truncation_rate": None if pooled else run["truncation_rate"],
            "tokens": {"prompt": prompt, "response": response, "total": prompt + response},
            **(
                {
                    "policies": {name: section.to_dict() for name, section in self.policies.items()},
                    "head_to_head": self.compared.table(),
                }
                if self.policies
                else {}
            ),
            **({"teacher": run["teacher"]} if "teacher" in run else {}),  # stages a teacher scored
            **({"reward_components": run["reward_components"]} if "reward_components" in run else {}),
        }


def by_policy(group: Group) -> dict[str, Group]:
    """A head-to-head group's executions, policy by policy, each as a group of its own (none: not such a group)."""
    parts: dict[str, list[list[Sample]]] = {}
    for samples in group.executions:
        if samples and samples[0].policy is not None:
            parts.setdefault(samples[0].policy, []).append(samples)
    return {name: Group(group.problem, executions, group.status) for name, executions in parts.items()}


def split_key(metadata: Any, by: str) -> str:
    """The --by value of a group: its metadata field as text (a string as it is, anything else as JSON)."""
    value = metadata.get(by) if isinstance(metadata, dict) else None
    if value is None:
        return NONE_KEY
    return value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


@dataclass(slots=True)
class Sections:
    """`stats`' figures before they are dicts: the whole, each --by value, the system and its vocabulary."""

    by: str | None
    system: SystemInfo
    words: Vocabulary
    whole: Section
    parts: dict[str, Section]
    warning: str | None = None

    def to_dict(self) -> dict[str, Any]:
        order = sorted(self.parts, key=lambda key: (key == NONE_KEY, key))
        figures = self.whole.run.report_figures()
        labels = {f.key: f.label for f in figures}
        units = {f.key: f.unit for f in figures if f.unit}
        system = {"name": self.system.name, "stages": list(self.whole.run.stages), "labels": labels, "units": units}
        return {
            "by": self.by,
            "system": system,
            "all": self.whole.to_dict(),
            "split": {key: self.parts[key].to_dict() for key in order},
            **({"warning": self.warning} if self.warning else {}),
        }


def sections(
    groups: Iterable[Group], by: str | None = None, system: SystemInfo | dict[str, Any] | None = None
) -> Sections:
    """`stats_of_groups` before it is a dict (`agentroll.tools.figures` draws the system's charts from it)."""
    info = LEGACY if system is None else coerce(system)
    vocabulary, warning = words(info)
    stages = info.stages or ()
    whole = Section(stages, vocabulary)
    parts: dict[str, Section] = {}
    for group in groups:
        whole.add(group)
        if by is not None:
            first = group.executions[0][0] if group.executions and group.executions[0] else None
            key = split_key(first.metadata if first is not None else None, by)
            parts.setdefault(key, Section(stages, vocabulary)).add(group)
    if system is None and any(name not in STAGES for name in whole.run.stages):  # not three-stage after all
        empty = [name for name in STAGES if not whole.run.stages[name].samples]
        info, vocabulary = SystemInfo("?", None), Vocabulary()
        for section in (s for top in (whole, *parts.values()) for s in top.sections()):
            for name in empty:
                section.run.stages.pop(name, None)
            section.words, section.run.figures, section.run.counters = vocabulary, (), {}
        info = SystemInfo("?", tuple(whole.run.stages))
    for section in (s for top in (whole, *parts.values()) for s in top.sections()):  # every column has the same
        section.run.stages = {name: section.run.stage(name) for name in whole.run.stages}  # stages, in one order
    return Sections(by, info, vocabulary, whole, parts, warning)


def stats_of_groups(
    groups: Iterable[Group], by: str | None = None, system: SystemInfo | dict[str, Any] | None = None
) -> dict[str, Any]:
    """`stats` over groups already in hand (a trainer's `Generator.stream`, a follower's `read_groups`).

    `system`: the system that made them, as a manifest's `settings.system` (a `Generator`'s
    `settings["system"]`) or a `SystemInfo`. Without it: three-stage when every stage seen is one of its own,
    else the stages seen, in the order first seen (and no system's own figures)."""
    return sections(groups, by, system).to_dict()


def stats(folder: str | os.PathLike[str], by: str | None = None) -> dict[str, Any]:
    """The system's report for a folder (or a merged one), from its records; split by `metadata[by]` if given.

    Returns {"folder", "complete", "by", "system": {"name", "stages", "labels", "units"}, "all": figures,
    "split": {value: figures}} (and "unfinished", what to know of a folder whose run did not complete)
    (split is empty without `by`; `labels` names each report figure); figures are problems, executions,
    records, stages, report (the system's figures: `RunStats.report`), counters (what its vocabulary
    tallied), pass_at_k, truncation_rate, tokens. A damaged folder raises `OutputError` (run `agentroll
    validate` to see where). A system that cannot be loaded here adds a `warning`: the generic figures only.
    """
    from ..folder import load_manifest, read_groups

    manifest = load_manifest(Path(folder))
    found = folder_sections(manifest, read_groups(folder), by)
    return {"folder": str(folder), **folder_state(manifest), **found.to_dict()}


def folder_sections(manifest: Any, groups: Iterable[Group], by: str | None) -> Sections:
    """`sections` of a folder's groups, by its system; in a head-to-head folder the uniform groups
    `--filter-uniform-groups` left out of the records (the manifest counts them) are the ties they were."""
    found = sections(groups, by, system_of(manifest))
    if found.whole.policies:
        found.whole.compared.add_uniform(manifest.filtered_groups)
    return found


def folder_state(manifest: Any) -> dict[str, Any]:
    """`complete`, and for a folder whose run did not complete what to know of it (`unfinished`)."""
    from ..folder.manifest import unfinished

    note = unfinished(manifest.complete, manifest.last_run)
    return {"complete": manifest.complete, **({"unfinished": note} if note else {})}


# -- the table the CLI prints -------------------------------------------------------------------------------------


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _shown_ks(top: int) -> list[int]:
    """Every k up to 8, then powers of two and the largest: the table stays short for n = 64; --json has all."""
    ks = [k for k in range(1, top + 1) if k <= 8 or k & (k - 1) == 0]
    return ks if not top or ks[-1] == top else [*ks, top]


def figure_name(data: dict[str, Any], key: str) -> str:
    """A report figure's name in a table: its label, "accuracy" after it when it is one."""
    name = (data.get("system") or {}).get("labels", {}).get(key) or key.removesuffix("_accuracy")
    return f"{name} accuracy" if key.endswith("_accuracy") else name


def stats_table(data: dict[str, Any]) -> Table:
    """`stats`'s result as one table: a row per figure, a column for the folder and one per --by value."""
    columns = {"all": data["all"], **data["split"]}
    system = data.get("system") or {}
    shown = f" ({system['name']} system)" if system.get("name") not in (None, "three-stage") else ""
    title = f"agentroll stats: {data.get('folder', '')}{shown}" + (f" by {data['by']}" if data.get("by") else "")
    table = Table(title=Text(title))  # data (a --by value, a stage name) is never read as markup; a cell is
    table.add_column(Text("figure"), overflow="fold")  # folded onto more lines, never cut
    for name in columns:
        table.add_column(Text(name if name == "all" else f"{data['by']}={name}"), justify="right", overflow="fold")

    def row(label: str, get: Any, end: bool = False) -> None:
        table.add_row(Text(label), *(Text(get(c)) for c in columns.values()), end_section=end)

    row("problems", lambda c: str(c["problems"]))
    row("executions", lambda c: str(c["executions"]))
    row("records", lambda c: str(c["records"]), end=True)
    stages = list(data["all"]["stages"])
    for stage in stages:
        frozen = "" if data["all"]["stages"][stage].get("trainable", True) else " (not trainable)"
        row(f"{stage} samples{frozen}", lambda c, s=stage: str(c["stages"][s]["samples"]))
        row(f"{stage} mean raw reward", lambda c, s=stage: _fmt(c["stages"][s]["mean_raw_reward"]))
        row(f"{stage} truncated", lambda c, s=stage: str(c["stages"][s]["truncated"]))
        row(
            f"{stage} tokens (prompt/response)",
            lambda c, s=stage: f"{c['stages'][s]['prompt_tokens']}/{c['stages'][s]['response_tokens']}",
            end=stage == stages[-1],
        )
    parts = list(data["all"].get("reward_components") or ())  # --reward-component: each part's mean
    for name in parts:
        row(
            f"reward component {name} (mean)",
            lambda c, n=name: _fmt((c.get("reward_components") or {}).get(n)),
            end=name == parts[-1],
        )
    named = list(system.get("labels") or (k for k in data["all"]["report"] if k.endswith("_accuracy")))
    for key in named:
        row(figure_name(data, key), lambda c, k=key: _fmt(c["report"].get(k)), end=key == named[-1])
    top = max((len(c["pass_at_k"]) for c in columns.values()), default=0)
    for k in _shown_ks(top):

        def cell(c: dict[str, Any], k: int = k) -> str:
            entry = next((e for e in c["pass_at_k"] if e["k"] == k), None)
            if entry is None:
                return "-"
            partial = "" if entry["problems"] == c["problems"] else f" ({entry['problems']} problems)"
            return _fmt(entry["value"]) + partial

        row(f"pass@{k} (executions)", cell, end=k == top)
    row("truncation rate", lambda c: _fmt(c["truncation_rate"]))
    scored = list(data["all"].get("teacher") or {})
    row("tokens (prompt/response)", lambda c: f"{c['tokens']['prompt']}/{c['tokens']['response']}", end=bool(scored))
    for stage in scored:
        for label, key in TEACHER_ROWS:

            def teacher(c: dict[str, Any], s: str = stage, k: str = key) -> str:
                return _fmt((c.get("teacher") or {}).get(s, {}).get(k))

            row(f"{stage} {label}", teacher, end=key == TEACHER_ROWS[-1][1] and stage != scored[-1])
    return table


TEACHER_ROWS = (  # agentroll.record.stats.TeacherStats' figures, as the tables name them
    ("student - teacher logprob, mean", "mean_gap"),
    ("student - teacher logprob, max", "max_gap"),
    ("KL(student || teacher), k3", "kl_k3"),
    ("teacher's top token is another", "other_top_share"),
)
