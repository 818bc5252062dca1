"""A head-to-head folder (`generate --policy`) in the tools: `stats`' tables, `report`'s section, and the data a
viewer shows side by side.

The figures are `agentroll.tools.report.stats`' own (each section's `policies` and `head_to_head`, computed by
`agentroll.record.headtohead` from the same records), so the table, the page and the viewer never disagree:

- `compare(folder, by=None)`: each policy's figures and the head-to-head table, for the folder and per `--by`
  value;
- `problems(folder)`: problem by problem, each policy's rewards and mean and who won (the viewer's side by side).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from html import escape
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from ..record.headtohead import TIE, decisive, policy_means
from .charts import Series, bar_chart, line_chart
from .report import TEACHER_ROWS


def compare(folder: str | os.PathLike[str], by: str | None = None) -> dict[str, Any]:
    """{"folder", "by", "policies": {name: figures}, "head_to_head": table, "split": {value: {"policies",
    "head_to_head"}}} (`figures` as `stats` gives them for a folder, over one policy's executions; `table` as
    `agentroll.record.headtohead.Comparison.table`). A folder of one model has no policies: both are empty."""
    from .report import stats

    data = stats(folder, by)
    return {
        "folder": str(folder),
        "by": by,
        "policies": data["all"].get("policies", {}),
        "head_to_head": data["all"].get("head_to_head"),
        "split": {
            key: {"policies": part.get("policies", {}), "head_to_head": part.get("head_to_head")}
            for key, part in data["split"].items()
        },
    }


def problems(folder: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Each problem of a head-to-head folder, in manifest order: {"problem_id", "metadata", "rewards": {policy:
    its executions' final rewards}, "means": {policy: their mean}, "best": the policy with the highest mean, or
    None for a tie at the top}."""
    from ..folder import read_groups

    for group in read_groups(Path(folder)):
        means = policy_means(group.executions)
        if not means:
            continue
        rewards: dict[str, list[float]] = {}
        for samples in group.executions:
            rewards.setdefault(str(samples[0].policy), []).append(samples[0].final_reward)
        top = max(means.values())
        leaders = [name for name, mean in means.items() if abs(mean - top) <= TIE]
        first = group.executions[0][0]
        yield {
            "problem_id": group.problem_id,
            "metadata": first.metadata,
            "rewards": rewards,
            "means": means,
            "best": leaders[0] if len(leaders) == 1 else None,
        }


def uniform_note(table: dict[str, Any], by: str | None) -> str:
    """What the table says of the folder's uniform groups filtered out ('' when there were none)."""
    n = table.get("filtered_ties") or 0
    if not n:
        return ""
    where = f" (not in the {by} rows: their values are not kept)" if by else ""
    return (
        f"{n} uniform groups filtered out of the records (--filter-uniform-groups: every execution of every policy "
        f"ended alike) count as ties{where}"
    )


# -- `agentroll stats`' tables ------------------------------------------------------------------------------------


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _ci(pair: dict[str, Any], key: str) -> str:
    ci = pair.get(key)
    return f"[{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else "-"


def pair_cells(pair: dict[str, Any]) -> list[str]:
    difference = pair["mean_difference"]
    return [
        f"{pair['a']} vs {pair['b']}",
        str(pair["problems"]),
        f"{pair['wins']} / {pair['ties']} / {pair['losses']}",
        "-" if difference is None else f"{difference:+.3f}",
        _ci(pair, "mean_difference_ci"),
        "-" if pair["net_win_rate"] is None else f"{pair['net_win_rate']:+.3f}",
        _ci(pair, "net_win_rate_ci"),
        pair["verdict"],
    ]


PAIR_COLUMNS = (
    "pair (a vs b)",
    "problems",
    "a wins / ties / losses",
    "mean reward a - b",
    "95% interval",
    "net win rate",
    "95% interval",
    "verdict",
)


def at_k(figures: dict[str, Any], k: int) -> float | None:
    """A section's pass@k (None: not reported for that k)."""
    return next((e["value"] for e in figures["pass_at_k"] if e["k"] == k), None)


def tables(data: dict[str, Any]) -> list[Table]:
    """`stats`' result's head-to-head part as tables: each policy's figures side by side, then each pair's
    wins, ties and losses with their intervals (for the folder, and each --by value). None: not such a folder."""
    whole = data["all"]
    if not whole.get("policies"):
        return []
    labels = (data.get("system") or {}).get("labels") or {}
    per = Table(title=Text(f"head to head: {data.get('folder', '')}, each policy"))
    per.add_column(Text("figure"), overflow="fold")
    policies = whole["policies"]
    for name in policies:
        per.add_column(Text(name), justify="right", overflow="fold")

    def row(label: str, get: Any) -> None:
        per.add_row(Text(label), *(Text(get(f)) for f in policies.values()))

    row("problems", lambda f: str(f["problems"]))
    row("executions", lambda f: str(f["executions"]))
    row("mean reward (final)", lambda f: fmt(f.get("mean_final_reward")))
    for key in labels:
        row(
            f"{labels[key]} accuracy" if key.endswith("_accuracy") else labels[key],
            lambda f, k=key: fmt(f["report"].get(k)),
        )
    ks = sorted({e["k"] for f in policies.values() for e in f["pass_at_k"]})
    for k in [k for k in ks if k in (1, ks[-1])]:
        row(f"pass@{k} (executions)", lambda f, k=k: fmt(at_k(f, k)))
    scored = list(dict.fromkeys(stage for f in policies.values() for stage in f.get("teacher") or {}))
    for stage in scored:  # a teacher's figures over each policy's own tokens (--teacher, distill)
        for label, key in TEACHER_ROWS:
            row(f"{stage} {label}", lambda f, s=stage, k=key: fmt((f.get("teacher") or {}).get(s, {}).get(k)))
    boot = whole["head_to_head"]["bootstrap"]
    pairs = Table(
        title=Text(
            f"head to head, problem by problem (mean final reward per policy; paired bootstrap over problems, "
            f"{boot['resamples']} draws, seed {boot['seed']})"
        ),
        caption=Text(uniform_note(whole["head_to_head"], data.get("by"))),
    )
    by = data.get("by")
    columns = ([by] if by else []) + list(PAIR_COLUMNS)
    for i, column in enumerate(columns):
        pairs.add_column(Text(column), justify="left" if i == 0 or column == "verdict" else "right", overflow="fold")
    parts = {"all": whole, **data["split"]} if by else {"all": whole}
    for key, part in parts.items():
        for pair in (part.get("head_to_head") or {}).get("pairs", []):
            pairs.add_row(*(Text(c) for c in ([key] if by else []) + pair_cells(pair)))
    return [per, pairs]


# -- `agentroll report`'s section ---------------------------------------------------------------------------------


def page_section(stats: dict[str, Any], figure: Any, table: Any) -> str:
    """The report page's "Head to head" section ('' for a folder of one model): each policy's figures side by
    side, pass@k per policy, and the table of wins, ties and losses with their intervals."""
    whole = stats["all"]
    policies = whole.get("policies") or {}
    if not policies:
        return ""
    labels = stats["system"].get("labels") or {}
    keys = list(labels)
    out = ["<h2>Head to head</h2><div class='row'>"]
    series = [Series(name, [f["report"].get(k) for k in keys]) for name, f in policies.items()]
    out.append(
        figure(
            bar_chart(
                "policies", "accuracy per policy", [labels[k] for k in keys], series, y_label="accuracy", y_top=1
            ),
            "Each policy's figures over its own executions of the same problems.",
        )
    )
    lines = [(name, [(float(e["k"]), e["value"]) for e in f["pass_at_k"]]) for name, f in policies.items()]
    if any(points for _, points in lines):
        out.append(
            figure(
                line_chart("policies-pass", "pass@k per policy", lines, x_label="k", y_label="pass@k", y_top=1.0),
                "pass@k over each policy's executions' outcomes, per problem, averaged.",
            )
        )
    out.append("</div>")
    boot = whole["head_to_head"]["bootstrap"]
    out.append(
        f"<p class='note'>Per problem, each policy's mean final reward over its executions; a problem is a win for "
        f"the policy whose mean is higher. Intervals: paired bootstrap over problems ({boot['resamples']} draws, "
        f"seed {boot['seed']}, {round(100 * boot['level'])}%). The verdict names a policy only when the interval of "
        f"the mean difference leaves 0 out and at least {decisive(boot['level'])} problems differ.</p>"
    )
    if whole["head_to_head"].get("filtered_ties"):
        out.append(f"<p class='note'>{escape(uniform_note(whole['head_to_head'], stats.get('by')))}</p>")
    by = stats.get("by")
    parts = {"all": whole, **stats["split"]} if by else {"all": whole}
    rows = [
        ([key] if by else []) + pair_cells(pair)
        for key, part in parts.items()
        for pair in (part.get("head_to_head") or {}).get("pairs", [])
    ]
    out.append(table(([by] if by else []) + list(PAIR_COLUMNS), rows))
    return "".join(out)
