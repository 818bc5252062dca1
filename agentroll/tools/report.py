"""`agentroll stats DIR`: the system's report recomputed from the records, so that it describes the data as it is
on disk (a merged folder, several resumed runs) rather than the last run, which is all `manifest.last_run` knows.

The figures are `agentroll.stats.RunStats`'s own, fed the folder's executions: the same accuracy definitions as
the run summary, by construction. Two differences from a run's report: only written groups count (a run also
counts the groups it filtered out), and calls that failed or were never made leave no record, so
`failed_calls` and `skipped_calls` are not known here.

pass@k is the unbiased estimator of the Codex paper, per problem, over the problem's solver samples (N per
execution, K executions: n = N * K when no call was skipped): pass@k = 1 - C(n - c, k) / C(n, k), c the
solver samples with raw_reward 1. It is reported for k = 1 .. the largest n of any problem; the figure for k
is the mean over the problems with at least k solver samples (`problems` says how many; all of them when
every problem has its N * K samples). pass@n is the mean of the records' `group_pass_at_k`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from rich.table import Table

from ..group import Group
from ..schema import STAGES
from ..stats import RunStats

NONE_KEY = "(none)"  # the --by value of a group whose metadata lacks the field (or holds null)


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
class _Section:
    """The figures of one set of groups (the whole folder, or one value of --by)."""

    run: RunStats = field(default_factory=RunStats)
    solver_counts: list[tuple[int, int]] = field(default_factory=list)  # per problem: (n, c)
    records: int = 0

    def add(self, group: Group) -> None:
        for samples in group.executions:
            self.run.add_execution(samples)
            self.records += len(samples)
        solvers = [s for samples in group.executions for s in samples if s.stage == "solver"]
        self.solver_counts.append((len(solvers), sum(s.raw_reward == 1.0 for s in solvers)))

    def to_dict(self) -> dict[str, Any]:
        run = self.run.to_dict()
        stages = {name: {key: run["stages"][name][key] for key in
                         ("samples", "mean_raw_reward", "truncated", "with_content", "prompt_tokens",
                          "response_tokens")} for name in STAGES}
        top = max((n for n, _ in self.solver_counts), default=0)
        passes = []
        for k in range(1, top + 1):
            values = [pass_at_k(n, c, k) for n, c in self.solver_counts if n >= k]
            passes.append({"k": k, "value": sum(values) / len(values), "problems": len(values)})
        prompt = sum(s["prompt_tokens"] for s in stages.values())
        response = sum(s["response_tokens"] for s in stages.values())
        return {
            "problems": len(self.solver_counts),
            "executions": self.run.executions,
            "records": self.records,
            "stages": stages,
            "report": run["report"],
            "pass_at_k": passes,
            "truncation_rate": run["truncation_rate"],
            "tokens": {"prompt": prompt, "response": response, "total": prompt + response},
        }


def split_key(metadata: Any, by: str) -> str:
    """The --by value of a group: its metadata field as text (a string as it is, anything else as JSON)."""
    value = metadata.get(by) if isinstance(metadata, dict) else None
    if value is None:
        return NONE_KEY
    return value if isinstance(value, str) else orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def stats_of_groups(groups: Iterable[Group], by: str | None = None) -> dict[str, Any]:
    """`stats` over groups already in hand (a trainer's `Generator.stream`, a follower's `read_groups`)."""
    whole = _Section()
    parts: dict[str, _Section] = {}
    for group in groups:
        whole.add(group)
        if by is not None:
            first = group.executions[0][0] if group.executions and group.executions[0] else None
            key = split_key(first.metadata if first is not None else None, by)
            parts.setdefault(key, _Section()).add(group)
    order = sorted(parts, key=lambda key: (key == NONE_KEY, key))
    return {"by": by, "all": whole.to_dict(), "split": {key: parts[key].to_dict() for key in order}}


def stats(folder: str | os.PathLike[str], by: str | None = None) -> dict[str, Any]:
    """The system's report for a folder (or a merged one), from its records; split by `metadata[by]` if given.

    Returns {"folder", "by", "all": figures, "split": {value: figures}} (split is empty without `by`); figures
    are problems, executions, records, stages, report (RunStats.report's keys), pass_at_k, truncation_rate,
    tokens. A damaged folder raises `OutputError` (run `agentroll validate` to see where).
    """
    from ..readers import read_groups  # the folder layout (merged folders, compression) is the readers' business

    return {"folder": str(folder), **stats_of_groups(read_groups(folder), by)}


# -- the table the CLI prints -------------------------------------------------------------------------------------

def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _shown_ks(top: int) -> list[int]:
    """Every k up to 8, then powers of two and the largest: the table stays short for n = 64; --json has all."""
    ks = [k for k in range(1, top + 1) if k <= 8 or k & (k - 1) == 0]
    return ks if not top or ks[-1] == top else [*ks, top]


def stats_table(data: dict[str, Any]) -> Table:
    """`stats`'s result as one table: a row per figure, a column for the folder and one per --by value."""
    columns = {"all": data["all"], **data["split"]}
    title = f"agentroll stats: {data.get('folder', '')}" + (f" by {data['by']}" if data.get("by") else "")
    table = Table(title=title)
    table.add_column("figure")
    for name in columns:
        table.add_column(name if name == "all" else f"{data['by']}={name}", justify="right")

    def row(label: str, get: Any, end: bool = False) -> None:
        table.add_row(label, *(get(c) for c in columns.values()), end_section=end)

    row("problems", lambda c: str(c["problems"]))
    row("executions", lambda c: str(c["executions"]))
    row("records", lambda c: str(c["records"]), end=True)
    for stage in STAGES:
        row(f"{stage} samples", lambda c, s=stage: str(c["stages"][s]["samples"]))
        row(f"{stage} mean raw reward", lambda c, s=stage: _fmt(c["stages"][s]["mean_raw_reward"]))
        row(f"{stage} truncated", lambda c, s=stage: str(c["stages"][s]["truncated"]))
        row(f"{stage} tokens (prompt/response)",
            lambda c, s=stage: f"{c['stages'][s]['prompt_tokens']}/{c['stages'][s]['response_tokens']}",
            end=stage == STAGES[-1])
    for label, key in (("solver accuracy", "solver_accuracy"), ("majority vote accuracy", "majority_vote_accuracy"),
                       ("best of N accuracy", "best_of_n_accuracy"), ("rewriter accuracy", "rewriter_accuracy"),
                       ("selector (its pick) accuracy", "selector_pick_accuracy"),
                       ("system accuracy", "system_accuracy")):
        row(label, lambda c, k=key: _fmt(c["report"][k]), end=key == "system_accuracy")
    top = max((len(c["pass_at_k"]) for c in columns.values()), default=0)
    for k in _shown_ks(top):
        def cell(c: dict[str, Any], k: int = k) -> str:
            entry = next((e for e in c["pass_at_k"] if e["k"] == k), None)
            if entry is None:
                return "-"
            partial = "" if entry["problems"] == c["problems"] else f" ({entry['problems']} problems)"
            return _fmt(entry["value"]) + partial

        row(f"pass@{k} (solvers)", cell, end=k == top)
    row("truncation rate", lambda c: _fmt(c["truncation_rate"]))
    row("tokens (prompt/response)", lambda c: f"{c['tokens']['prompt']}/{c['tokens']['response']}")
    return table
