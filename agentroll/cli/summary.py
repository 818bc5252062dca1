"""The summary a run ends with, on stderr: per stage, then the run's figures. Figures are folded, never cut."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from ..runner import RunResult
from ..stats import RunStats
from .console import err


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def figures(stats: RunStats) -> str:
    """The system's report figures under its names, "-" where one does not apply (a majority vote over
    programs, which box no answer)."""
    return ", ".join(f"{f.label} {fmt(stats.figure(f))}" for f in stats.report_figures())


def table(title: str, columns: list[str]) -> Table:
    """A table whose cells fold onto more lines when the terminal is narrow: a figure is never cut short."""
    out = Table(title=Text(title), show_header=True)
    for i, column in enumerate(columns):
        out.add_column(Text(column), justify="left" if i == 0 else "right", overflow="fold")
    return out


def print_summary(result: RunResult) -> None:
    s, r = result.stats, result.requests
    stages = table(
        f"agentroll generate: {result.model} -> {result.output}",
        ["stage", "samples", "mean raw reward", "truncated", "tokens (prompt/response)", "failed", "skipped"],
    )
    for name, st in s.stages.items():
        stages.add_row(
            Text(name),
            str(st.samples),
            fmt(st.mean_raw_reward),
            str(st.truncated),
            f"{st.prompt_tokens}/{st.response_tokens}",
            str(st.failed_calls),
            str(st.skipped_calls),
        )
    err.print(stages)
    d = s.to_dict()
    rate = r.requests / result.wall_s if result.wall_s else 0.0
    lines = [
        f"problems {s.problems} (already done {s.problems_skipped_done}), executions {s.executions}, "
        f"records {s.records_written}, invalid rows {s.invalid_rows}",
        f"accuracy: {figures(s)}",
        f"groups written {s.groups_written}, filtered {s.groups_filtered}, resampled {s.groups_resampled}, "
        f"missing {result.missing_groups}; reward timeouts {s.reward_timeouts}, errors {s.reward_errors}, "
        f"refused values {s.reward_invalid}",
        f"truncation rate {fmt(d['truncation_rate'])}, requests {r.requests}, retries {r.retries}, failures "
        f"{r.failures}, calls replayed from the journal {s.calls_replayed}, peak in flight {r.peak_in_flight}, "
        f"wall {result.wall_s:.1f}s, {rate:.1f} requests/s",
    ]
    if r.concurrency:
        lines.append("concurrency (auto, settled): " + ", ".join(f"{u} {n}" for u, n in r.concurrency.items()))
    lines += result.notes
    err.print(Text("\n".join(lines)), soft_wrap=True)
