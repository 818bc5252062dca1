"""`agentroll report DIR -o report.html`: one self-contained page of charts about a folder, for looking rather
than reading.

The page is a single HTML file: inline CSS and inline SVG, no script, no font, no image, nothing fetched (its
Content-Security-Policy forbids any load, so even a stray reference could not reach the network). It opens
offline, from a mail attachment or a CI artifact. The figures are `figures.figures`' (so `stats`'s, for what
both show); the page follows the folder's system: its stages, in its order, its figures under its names, and a
section for each chart its vocabulary declares (three-stage: the selector's pick against best of N).
"""

from __future__ import annotations

import contextlib
import os
from html import escape
from pathlib import Path
from typing import Any

from ..errors import OutputError
from ..folder.manifest import unfinished
from . import charts
from .charts import TRUNCATED, Series, bar_chart, fmt, histogram, line_chart
from .figures import figures
from .headtohead import page_section
from .teacher import page_section as teacher_section

MOST_SPLITS = 12  # --by values drawn (those with the most problems); the table lists them all
CSP = "default-src 'none'; style-src 'unsafe-inline'"
CSS = """
body { font: 14px/1.45 system-ui, sans-serif; color: #222; max-width: 1340px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 36px; border-bottom: 1px solid #ddd; }
.sub { color: #555; } .note { color: #555; font-size: 13px; max-width: 900px; }
.row { display: flex; flex-wrap: wrap; gap: 8px 24px; } figure { margin: 8px 0; }
figcaption { font-size: 13px; color: #444; max-width: 640px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { border-bottom: 1px solid #eee; padding: 3px 10px; text-align: right; } th:first-child, td:first-child
{ text-align: left; } th { background: #f6f6f6; }
svg text { font-family: system-ui, sans-serif; fill: #222; }
"""


def figure_keys(data: dict[str, Any], shares: bool | None = None) -> list[str]:
    """The system's report figures, in its order (the rest of `report` is tokens); with `shares`, only those that
    are shares (True) or only those that count something per execution (False: `Figure.unit`)."""
    keys = list(data["stats"]["system"].get("labels") or {})
    units = data["stats"]["system"].get("units") or {}
    return keys if shares is None else [k for k in keys if (k not in units) == shares]


def figure_name(data: dict[str, Any], key: str) -> str:
    return str(data["stats"]["system"].get("labels", {}).get(key, key))


def figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{caption}</figcaption></figure>"


def table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def ratio(value: float | None) -> str:
    """A reward, an accuracy or a rate in a table: always to three places, so a column reads as one."""
    return "-" if value is None else f"{value:.3f}"


def pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def columns(data: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The sections drawn side by side: the folder's, or in a head-to-head folder each policy's (no figure pools
    two models' samples)."""
    whole = data["stats"]["all"]
    return list((whole.get("policies") or {}).items()) or [("all", whole)]


def _stages(data: dict[str, Any]) -> str:
    whole = data["stats"]["all"]
    keys = figure_keys(data, shares=True)
    out = ["<h2>Reward and accuracy per stage</h2><div class='row'>"]
    out.append(
        figure(
            bar_chart(
                "accuracy",
                "accuracy",
                [figure_name(data, k) for k in keys],
                [Series(name, [c["report"].get(k) for k in keys]) for name, c in columns(data)],
                y_label="accuracy",
                y_top=1.0,
            ),
            "The system's figures: each stage's accuracy (its mean raw reward, unless the system judges the "
            "stage otherwise), the system's own figures, and the system's accuracy (final rewards of 1), as "
            "<code>agentroll stats</code> reports them.",
        )
    )
    counted = figure_keys(data, shares=False)
    if counted:
        units = data["stats"]["system"]["units"]
        out.append(
            figure(
                bar_chart(
                    "counts",
                    "counts",
                    [figure_name(data, k) for k in counted],
                    [Series(name, [c["report"].get(k) for k in counted]) for name, c in columns(data)],
                    y_label=units[counted[0]] if len({units[k] for k in counted}) == 1 else "count",
                ),
                "The system's figures that count something (" + ", ".join(sorted(set(units.values()))) + "), as "
                "<code>agentroll stats</code> reports them.",
            )
        )
    stages = list(whole["stages"])
    # (label, its stage figures, its shaped rewards): the folder's, or each policy's in a head-to-head folder
    owners = [("", whole, data["shaped_reward"])]
    if whole.get("policies"):
        owners = [(f"{p} ", c, data["shaped_reward_by_policy"][p]) for p, c in whole["policies"].items()]
    series = []
    for label, c, shaped in owners:
        series.append(Series(f"{label}raw reward", [c["stages"].get(s, {}).get("mean_raw_reward") for s in stages]))
        series.append(Series(f"{label}shaped reward", [shaped.get(s) for s in stages]))
    out.append(
        figure(
            bar_chart("reward", "mean reward per stage", stages, series, y_label="mean reward"),
            "Mean raw reward (before shaping) and mean shaped <code>reward</code> (what a trainer sees) per stage"
            + (", per policy." if whole.get("policies") else "."),
        )
    )
    out.append("</div>")
    rows = []
    for s, label, st, shaped in ((s, label, c["stages"].get(s), sh) for label, c, sh in owners for s in stages):
        if st is None:
            continue
        rows.append(
            [
                (f"{s} ({label.strip()})" if label else s) + ("" if st.get("trainable", True) else " (not trainable)"),
                fmt(st["samples"]),
                ratio(st["mean_raw_reward"]),
                ratio(shaped.get(s)),
                f"{fmt(st['truncated'])} ({pct(st['truncated'], st['samples'])})",
                fmt(st["prompt_tokens"]),
                fmt(st["response_tokens"]),
            ]
        )
    out.append(
        table(
            [
                "stage",
                "samples",
                "mean raw reward",
                "mean shaped reward",
                "truncated",
                "prompt tokens",
                "response tokens",
            ],
            rows,
        )
    )
    return "".join(out)


def _lengths(data: dict[str, Any]) -> str:
    out = ["<h2>Response lengths</h2><div class='row'>"]
    for j, (stage, h) in enumerate(data["lengths"].items()):
        marker = (float(h["max_tokens"]), f"max_tokens {h['max_tokens']}") if h["max_tokens"] else None
        svg = histogram(
            f"lengths-{stage}",
            f"{stage} response lengths",
            h["edges"],
            [Series("completed", h["completed"], charts.color(j)), Series("truncated", h["truncated"], TRUNCATED)],
            x_label=f"{stage} response tokens",
            marker=marker,
        )
        out.append(
            figure(
                svg,
                f"<b>{escape(stage)}</b>: {fmt(h['samples'])} samples, {fmt(h['truncated_samples'])} "
                f"truncated ({pct(h['truncated_samples'], h['samples'])}, in vermilion), mean "
                f"{fmt(h['mean'], 1)} tokens, longest {fmt(h['longest'])}.",
            )
        )
    out.append("</div>")
    return "".join(out)


def _splits(data: dict[str, Any]) -> list[str]:
    """The --by values drawn: those with the most problems, at most `MOST_SPLITS`, in `stats`' order."""
    split = data["stats"]["split"]
    ranked = sorted(split, key=lambda key: -split[key]["problems"])[:MOST_SPLITS]
    return [key for key in split if key in ranked]


def _pass_at_k(data: dict[str, Any]) -> str:
    out = ["<h2>pass@k</h2>"]
    series = [(name, [(float(e["k"]), e["value"]) for e in c["pass_at_k"]]) for name, c in columns(data)]
    if not any(points for _, points in series):
        return "".join(out) + "<p class='note'>None: the system's outcome is not pass/fail.</p>"
    by = data["stats"]["by"]
    series += [
        (f"{by}={key}", [(float(e["k"]), e["value"]) for e in data["stats"]["split"][key]["pass_at_k"]])
        for key in _splits(data)[: len(charts.PALETTE) - 1]
    ]
    svg = line_chart("pass-at-k", "pass@k", series, x_label="k (executions drawn)", y_label="pass@k", y_top=1.0)
    return "".join(out) + figure(
        svg,
        "The unbiased estimator (Codex paper) per problem over its executions' outcomes (final reward 1: "
        "solved), averaged over the problems with at least k of them.",
    )


def _by(data: dict[str, Any]) -> str:
    by = data["stats"]["by"]
    if by is None:
        return (
            "<h2>By a metadata field</h2><p class='note'>Run <code>agentroll report DIR -o FILE --by FIELD</code> "
            "to split these figures by a field of the input rows (kept in each record's metadata).</p>"
        )
    split = data["stats"]["split"]
    keys = figure_keys(data)
    shown = _splits(data)
    out = [f"<h2>By {escape(by)}</h2>"]
    if shown:
        drawn = figure_keys(data, shares=True)  # the counts per execution are in the table below
        series = [Series(figure_name(data, k), [split[v]["report"].get(k) for v in shown]) for k in drawn]
        note = "" if len(shown) == len(split) else f" The {MOST_SPLITS} values with the most problems are drawn."
        out.append(
            figure(
                bar_chart("by", f"accuracy by {by}", shown, series, y_label="accuracy", y_top=1.0),
                f"Accuracies per value of <code>metadata.{escape(by)}</code>.{note}",
            )
        )
    rows = [
        [
            value,
            fmt(f["problems"]),
            fmt(f["executions"]),
            *(ratio(f["report"].get(k)) for k in keys),
            ratio(f["truncation_rate"]),
        ]
        for value, f in split.items()
    ]
    out.append(table([by, "problems", "executions", *(figure_name(data, k) for k in keys), "truncation rate"], rows))
    return "".join(out)


def _throughput(data: dict[str, Any]) -> str:
    out = ["<h2>Throughput over the run</h2>"]
    derived = data.get("derived_from")
    if derived:
        source = derived.get("folder") if isinstance(derived, dict) else None
        command = derived.get("command", "rescore") if isinstance(derived, dict) else "rescore"
        done = "a teacher's scores were added to them" if command == "distill" else "they were scored again"
        return "".join(out) + (
            f"<p class='note'>This folder was derived from {escape(str(source or 'another folder'))} "
            f"(<code>agentroll {escape(str(command))}</code>): its records were not generated, {done}, so it has "
            "no throughput of its own. The source folder's report shows how it was generated.</p>"
        )
    last = data["last_run"]
    if last.get("wall_s"):
        tokens = sum(
            (s.get("prompt_tokens") or 0) + (s.get("response_tokens") or 0)
            for s in last["stages"].values()
            if isinstance(s, dict)
        )
        wall = float(last["wall_s"])
        out.append(
            f"<p>The last run (manifest <code>last_run</code>): {fmt(last.get('records'))} records and "
            f"{fmt(last.get('requests'))} requests in {wall:.1f} s: {(last.get('records') or 0) / wall:.1f} "
            f"records/s, {(last.get('requests') or 0) / wall:.1f} requests/s, {fmt(tokens / wall, 0)} "
            "tokens/s (prompt and response).</p>"
        )
    out.append(
        "<p class='note'>Records carry no timestamps; what is drawn is what the folder knows: per call, its "
        "<code>latency_s</code> (from first attempt to answer, retries included) and its response tokens, "
        "in the order the groups were written; and the shard files' modification times.</p><div class='row'>"
    )
    speed = data["speed"]
    if speed:
        out.append(
            figure(
                line_chart(
                    "speed",
                    "response tokens per second of call time",
                    [("tokens/s", [(p["groups"], p["tokens_per_s"]) for p in speed])],
                    x_label="groups written",
                    y_label="tokens / s per call",
                ),
                "Response tokens over call time, pooled over consecutive groups: the "
                "speed one request saw (it falls as the server gets busier).",
            )
        )
        out.append(
            figure(
                line_chart(
                    "latency",
                    "mean call latency",
                    [("latency", [(p["groups"], p["latency_s"]) for p in speed])],
                    x_label="groups written",
                    y_label="seconds per call",
                ),
                "Mean latency of a call, pooled the same way.",
            )
        )
    times = data["shard_times"]
    if len(times) >= 2:
        out.append(
            figure(
                line_chart(
                    "records-over-time",
                    "records on disk over time",
                    [("records", [(p["s"], p["records"]) for p in times])],
                    x_label="seconds after the first shard",
                    y_label="records",
                ),
                "Records on disk when each shard was finished, by its file's modification time (a "
                "copied folder shows the copy's times; several runs show their gaps).",
            )
        )
    else:
        out.append(
            "<p class='note'>One shard: no records-over-time line (it needs two shard finish times; "
            "<code>--shard-size</code> sets how often a shard is finished).</p>"
        )
    out.append("</div>")
    return "".join(out)


def _chart(data: dict[str, Any], chart: dict[str, Any]) -> str:
    """A section the system's vocabulary declares: its bars, the counters behind them, its caption."""
    out = [f"<h2>{escape(chart['title'])}</h2>"]
    if chart["missing"]:
        return "".join(out) + f"<p class='note'>{escape(chart['missing'])}</p>"
    bars = chart["bars"]
    svg = bar_chart(
        chart["name"],
        chart["title"],
        [b["label"] for b in bars],
        [Series("all", [b["value"] for b in bars])],
        y_label="share",
        y_top=1.0,
    )
    caption = chart["caption"].format_map({k: fmt(v) for k, v in chart["values"].items()})
    out.append(f"<div class='row'>{figure(svg, escape(caption))}</div>")
    if chart["counts"]:
        out.append(table(["execution", "count"], [[c["label"], fmt(c["value"])] for c in chart["counts"]]))
    return "".join(out)


def render(data: dict[str, Any]) -> str:
    """The page for `figures.figures`' result."""
    stats, manifest = data["stats"], data["manifest"]
    note = unfinished(manifest.get("complete"), manifest.get("last_run"))
    whole = stats["all"]
    system = stats["system"]
    title = f"agentroll report: {data['stats']['folder']}"
    head = (
        f"<p class='sub'>{escape(system['name'])} system: {escape(' → '.join(system['stages']))}. "
        f"{fmt(whole['problems'])} problems, {fmt(whole['executions'])} executions, {fmt(whole['records'])} records"
        f"{f' ({escape(note)})' if note else ''}; truncation rate "
        f"{ratio(whole['truncation_rate'])}.</p>"
    )
    if stats.get("warning"):  # the system could not be loaded here: its own figures are left out
        head += f"<p class='note'>{escape(stats['warning'])}</p>"
    sections = [_stages(data), page_section(stats, figure, table), _lengths(data), _pass_at_k(data), _by(data)]
    sections += [teacher_section(stats, figure, table), _throughput(data)]
    sections += [_chart(data, chart) for chart in data["charts"]]
    return (
        f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{escape(title)}</title>"
        f"<style>{CSS}</style></head><body><h1>{escape(title)}</h1>{head}{''.join(sections)}"
        "<p class='note'>Made by <code>agentroll report</code>; the numbers are in <code>agentroll stats DIR "
        "--json</code>.</p></body></html>\n"
    )


def report(folder: str | os.PathLike[str], output: str | os.PathLike[str], by: str | None = None) -> dict[str, Any]:
    """Write the page for `folder` to `output` (replaced atomically); returns {"output", "bytes", "charts"}.
    A damaged folder, or an output that cannot be written, raises `OutputError`."""
    target = writable(output, "the report")
    page = render(figures(folder, by))
    write_html(target, page, "the report")
    return {"output": str(target), "bytes": len(page.encode()), "charts": page.count('<svg class="chart"')}


def writable(output: str | os.PathLike[str], what: str) -> Path:
    """`output` as a path whose folder exists (checked before reading what may be a large folder)."""
    target = Path(output)
    if not target.parent.is_dir():
        raise OutputError(f"{target}: cannot write {what} (no folder {target.parent})")
    return target


def write_html(target: Path, page: str, what: str) -> None:
    """Replace `target` with `page` whole (a temp file, then a rename), or raise `OutputError` naming it."""
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise OutputError(f"{target}: cannot write {what} ({exc.strerror or exc})") from exc
