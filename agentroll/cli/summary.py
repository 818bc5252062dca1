"""The summary a run ends with, on stderr: a table of the stages (a row per figure, a column per stage, as `stats`
draws it, so that it fits 80 columns), then the run's figures in lines broken between phrases, never inside one.
What the figures count is said where it is not what `stats` counts (groups left out by the uniform filter)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.table import Table
from rich.text import Text

from ..errors import IncompleteRun
from ..record.headtohead import Comparison
from ..record.stats import RunStats, StageStats
from ..run.runner import RunResult
from ..tools.report import TEACHER_ROWS
from .console import err, packed


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def figures(stats: RunStats, counts: bool = False, accuracies: bool = True) -> str:
    """The system's report figures under its names, "-" where one does not apply (a majority vote over
    programs, which box no answer): its accuracies, its other shares (`accuracies=False`: tool calls that ran
    fine, calls continued by ids), or (`counts`) those that count something per unit (the agent system's calls
    per execution), to two places."""
    shown = [f for f in stats.report_figures() if (f.unit is not None) is counts]
    if not counts:
        shown = [f for f in shown if f.key.endswith("_accuracy") is accuracies]
    return ", ".join(f"{f.label} {fmt(stats.figure(f), 2 if counts else 3)}" for f in shown)


def shares(stats: RunStats, heading: str = "accuracy") -> list[str]:
    """The accuracies under `heading`, then the system's other shares, which are no accuracy, as a phrase of
    their own."""
    return [f"{heading}: {figures(stats)}", *filter(None, [figures(stats, accuracies=False)])]


ROWS: tuple[tuple[str, Callable[[StageStats], str]], ...] = (
    ("samples", lambda st: str(st.samples)),
    ("mean raw reward", lambda st: fmt(st.mean_raw_reward)),
    ("truncated", lambda st: str(st.truncated)),
    ("tokens (prompt/response)", lambda st: f"{st.prompt_tokens}/{st.response_tokens}"),
    ("calls failed", lambda st: str(st.failed_calls)),
    ("calls skipped (no room)", lambda st: str(st.skipped_calls)),
)


def stage_table(result: RunResult) -> Table:
    """A row per figure, a column per stage; a caption when the figures count groups that were not written."""
    s = result.stats
    table = Table(
        title=Text(f"agentroll generate: {result.model} -> {result.output}"),
        caption=_counted(s),
        caption_justify="left",
    )
    table.add_column(Text("stage"), overflow="fold")
    for name in s.stages:
        table.add_column(Text(name), justify="right", overflow="fold")
    for label, cell in ROWS:
        if label == "mean raw reward" and s.policies:
            for name, own in s.policies.items():  # a head-to-head run: each policy's, never the two pooled
                table.add_row(Text(f"{label} ({name})"), *(Text(cell(own.stage(stage))) for stage in s.stages))
            continue
        table.add_row(Text(label), *(Text(cell(st)) for st in s.stages.values()))
    if s.teacher:
        teacher_rows(table, s)
    return table


def _counted(s: RunStats) -> Text | None:
    """Under --filter-uniform-groups the run's figures count every group it generated; `stats` and the folder
    hold only those written: said, with both numbers."""
    if not s.groups_filtered:
        return None
    made = s.groups_written + s.groups_filtered
    return Text(
        f"The table and the accuracies count all {made} groups generated: {s.groups_written} written, "
        f"{s.groups_filtered} left out as uniform (--filter-uniform-groups); agentroll stats counts the "
        f"{s.groups_written} written."
    )


def lines(result: RunResult) -> list[list[str]]:
    """The summary's lines below the table, each as its phrases."""
    s, r = result.stats, result.requests
    d = s.to_dict()
    working = result.wall_s - result.startup_s
    rate = (r.requests - result.startup_requests) / working if working > 0 else 0.0
    generated = " generated" if s.groups_filtered else ""
    out = [
        [
            # the rows read are the problems and the invalid rows, each counted once (`problems` counts both)
            f"problems {s.problems - s.invalid_rows} (already done {s.problems_skipped_done}), "
            f"invalid rows {s.invalid_rows}",
            f"executions{generated} {s.executions}, records written {s.records_written}",
        ],
        *([] if s.policies else [shares(s, f"accuracy{' over the groups generated' if generated else ''}")]),
        *([[figures(s, counts=True)]] if figures(s, counts=True) else []),
        [
            f"groups written {s.groups_written}, filtered {s.groups_filtered}, resampled {s.groups_resampled}, "
            f"missing {result.missing_groups}",
            f"reward timeouts {s.reward_timeouts}, errors {s.reward_errors}, refused values {s.reward_invalid}",
        ],
        [
            f"truncation rate {fmt(d['truncation_rate'])}",
            f"requests {r.requests}, retries {r.retries}, failures {r.failures}",
            f"calls replayed from the journal {s.calls_replayed}, peak in flight {r.peak_in_flight}",
            f"wall {result.wall_s:.1f}s (start-up {result.startup_s:.1f}s), {rate:.1f} requests/s after it",
        ],
    ]
    out += head_to_head_lines(s)
    if s.judge_requests or s.judge_replayed:
        out.append([judge_line(s)])
    if s.component_means():
        parts = ", ".join(f"{name} {value:.3f}" for name, value in s.component_means().items())
        out.append([f"reward components (mean over samples): {parts}"])
    if r.concurrency:
        out.append(["concurrency (auto, settled): " + ", ".join(f"{u} {n}" for u, n in r.concurrency.items())])
    return out + teacher_lines(result.teachers) + [[note] for note in result.notes]


def judge_line(s: RunStats) -> str:
    """`--reward judge`: what the judge cost and how it fared (docs/rewards.md#an-llm-judge)."""
    held = f", groups held back {s.groups_held}" if s.groups_held else ""
    return (
        f"judge: requests {s.judge_requests} (retried {s.judge_retried}), replayed from the journal "
        f"{s.judge_replayed}, samples without a verdict {s.judge_failed}{held}; tokens "
        f"{s.judge_prompt_tokens}/{s.judge_completion_tokens} (prompt/completion), {s.judge_wall_s:.1f}s in requests"
    )


def head_to_head_lines(stats: RunStats) -> list[list[str]]:
    """A head-to-head run (`--policy`): each policy's figures, then each pair's table, as phrases (this run's
    groups; the whole folder's: `agentroll stats DIR`)."""
    if not stats.policies:
        return []
    out = [
        [
            f"policy {name}: executions {p.executions}, mean reward {fmt(p.mean_final_reward)}",
            *shares(p),
            *teacher_phrases(p),
        ]
        for name, p in stats.policies.items()
    ]
    return out + pair_lines(stats.compared)


def teacher_phrases(stats: RunStats) -> list[str]:
    """A policy's tokens against the teacher (--teacher): the k3 KL and the share of tokens whose teacher's top
    token is another, per stage scored."""
    shown = {name: t.figures() for name, t in stats.teacher.items() if t.tokens}
    if not shown:
        return []
    return [
        label + ", ".join(f"{name} {fmt(f[key])}" for name, f in shown.items())
        for label, key in (("KL(student || teacher) k3 ", "kl_k3"), ("top token another ", "other_top_share"))
    ]


def pair_lines(compared: Comparison) -> list[list[str]]:
    out = []
    for row in compared.table()["pairs"]:
        ci = row["mean_difference_ci"]
        interval = f" [{ci[0]:+.3f}, {ci[1]:+.3f}] (95%, paired bootstrap over problems)" if ci else ""
        difference = "-" if row["mean_difference"] is None else f"{row['mean_difference']:+.3f}"
        out.append(
            [
                f"{row['a']} vs {row['b']} over {row['problems']} problems: {row['a']} wins {row['wins']}, ties "
                f"{row['ties']}, loses {row['losses']}",
                f"mean reward {row['a']} - {row['b']} {difference}{interval}",
                f"verdict: {row['verdict']}",
            ]
        )
    return out


def print_summary(result: RunResult) -> None:
    err.print(stage_table(result))
    text = "\n".join(packed(phrases, err.width) for phrases in lines(result))
    err.print(Text(text))


def teacher_rows(table: Table, s: RunStats) -> None:
    """The teacher's figures (`--teacher`: `stats.TeacherStats`), a row each, "-" in a stage no teacher scored."""
    figures = {name: t.figures() for name, t in s.teacher.items()}
    if table.rows:
        table.add_section()
    for label, key in (("tokens scored by the teacher", "tokens"), *TEACHER_ROWS):
        cells = [
            "-" if name not in figures else str(s.teacher[name].tokens) if key == "tokens" else fmt(figures[name][key])
            for name in s.stages
        ]
        table.add_row(Text(label), *map(Text, cells))


def teacher_table(s: RunStats) -> Table:
    """The teacher's figures alone, a column per stage (`agentroll distill`'s summary)."""
    table = Table(title=Text("teacher"))
    table.add_column(Text("stage"), overflow="fold")
    for name in s.stages:
        table.add_column(Text(name), justify="right", overflow="fold")
    teacher_rows(table, s)
    return table


def teacher_lines(teachers: list[dict[str, Any]]) -> list[list[str]]:
    """Each teacher's model, endpoints and requests (`Teacher.report`), as a summary line's phrases."""
    return [
        [
            f"teacher {t['model']} ({', '.join(t['endpoints'])})",
            f"records scored {t['scored']} in {t.get('scoring_requests', '-')} requests",
            f"replayed from the journal {t['replayed']}",
            *_unscored(t),
            f"requests {t['requests']['requests']}, retries {t['requests']['retries']}, failures "
            f"{t['requests']['failures']}, peak in flight {t['requests']['peak_in_flight']}",
        ]
        for t in teachers
    ]


def _unscored(teacher: dict[str, Any]) -> list[str]:
    """The records the teacher had no room for (kept without teacher fields), counted and the first named."""
    count = teacher.get("unscored") or 0
    if not count:
        return []
    names = list(teacher.get("unscored_records") or ())
    more = f", and {count - len(names)} more" if count > len(names) else ""
    return [f"unscored {count} (they fill its context, kept without teacher fields: {', '.join(names)}{more})"]


def incomplete(result: RunResult, said: bool) -> IncompleteRun:
    """Exit 8's line: how many groups are missing and why (the commonest reasons, when the warnings that named
    them were not shown: `-q`)."""
    why = "see the warnings above"
    if not said and result.failures:
        named = result.failures.most_common(2)
        why = "; ".join(f"{n}x {reason}" for reason, n in named)
        rest = sum(result.failures.values()) - sum(n for _, n in named)
        why += f"; {rest} more for other reasons" if rest else ""
    elif not said:
        why = "the run stopped before they were produced"
    missing, repeats = result.missing_groups, min(result.repeats, result.missing_groups)
    again = "a rerun gives their agents the same answers: it fails them again unless the agent changes"
    if repeats and repeats == missing:  # every one an agent that crashed: the journal replays the same answers to it
        advice = again
    elif repeats:
        advice = f"run the same command again to redo {missing - repeats} of them ({repeats} more: {again})"
    else:
        advice = "run the same command again to redo them"
    return IncompleteRun(f"{missing} of {result.stats.problems} groups could not be produced ({why}): {advice}")
