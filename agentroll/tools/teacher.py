"""The report page's section on a teacher's scores (`--teacher`, `agentroll distill`, docs/distill.md): per stage
it scored, the k3 estimate of KL(student || teacher) as bars, and `stats`' teacher figures as a table."""

from __future__ import annotations

from html import escape
from typing import Any

from .charts import Series, bar_chart, fmt
from .report import TEACHER_ROWS


def page_section(stats: dict[str, Any], figure: Any, table: Any) -> str:
    """ "Student against teacher" ('' for a folder no teacher scored); `figure` and `table` are the page's own."""
    scored = stats["all"].get("teacher") or {}
    if not scored:
        return ""
    stages = list(scored)
    svg = bar_chart(
        "teacher-kl",
        "KL(student || teacher), k3, per token",
        stages,
        [Series("k3", [scored[s]["kl_k3"] for s in stages])],
        y_label="nats per token",
    )
    caption = (
        "The k3 estimate of the reverse KL on the student's own samples: mean of r - 1 - log r, r the teacher's "
        "probability of a sampled token over the student's (what on-policy distillation minimises)."
    )
    rows = [[s, fmt(scored[s]["tokens"]), *(fmt(scored[s][key]) for _, key in TEACHER_ROWS)] for s in stages]
    return (
        "<h2>Student against teacher</h2><div class='row'>"
        + figure(svg, escape(caption))
        + "</div>"
        + table(["stage", "tokens", *(label for label, _ in TEACHER_ROWS)], rows)
    )
