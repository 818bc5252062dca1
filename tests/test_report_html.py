"""`agentroll report`: its figures recomputed here from the records, the page self-contained, the page following
the folder's system, and the page loaded in a real headless Chromium (skipped, with the reason, without one)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentroll.cli import app
from agentroll.sim.script import Script
from agentroll.sim.server import SimServer
from agentroll.tools.charts import TRUNCATED
from agentroll.tools.figures import figures
from agentroll.tools.html import render
from agentroll.tools.html import report as write_report
from agentroll.tools.report import stats

from . import synthetic
from .browser import Browser, chromium_path
from .conftest import TOKENIZER, read_records, run_cli

THREE_STAGE_CHARTS = {
    "accuracy",
    "reward",
    "lengths-solver",
    "lengths-rewriter",
    "lengths-selector",
    "pass-at-k",
    "by",
    "speed",
    "latency",
    "records-over-time",
    "selector",
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A real run on the simulated server: 12 problems of two topics, K=2, several shards, some truncation."""
    root = tmp_path_factory.mktemp("report")
    problems = root / "problems.jsonl"
    problems.write_text(
        "".join(
            json.dumps(
                {
                    "id": f"q{i}",
                    "prompt": f"What is {i} plus {i + 3}?",
                    "label": str(2 * i + 3),
                    "topic": "small" if i < 5 else "large",
                }
            )
            + "\n"
            for i in range(12)
        )
    )
    server = SimServer(script=Script.from_jsonl(problems), seed=5)
    server.start()
    try:
        made = run_cli(
            "generate",
            str(problems),
            "-o",
            str(root / "out"),
            "--base-url",
            server.url,
            "--tokenizer",
            TOKENIZER,
            "--num-parallel",
            "3",
            "--samples-per-prompt",
            "2",
            "--max-tokens",
            "200",
            "--shard-size",
            "30",
            "--quiet",
        )
    finally:
        server.stop()
    assert made.returncode == 0, made.stderr.decode()
    return root / "out"


def test_the_figures_are_stats_own_and_the_rest_agrees_with_the_records(folder):
    data = figures(folder, "topic")
    assert data["stats"] == stats(folder, "topic")  # the same computations as `agentroll stats`
    records = read_records(folder)
    by_stage = defaultdict(list)
    for r in records:
        by_stage[r["stage"]].append(r)
    assert list(data["lengths"]) == ["solver", "rewriter", "selector"]
    assert sum(h["truncated_samples"] for h in data["lengths"].values()) > 0  # the run hit --max-tokens 200
    for stage, h in data["lengths"].items():
        edges = h["edges"]
        for status, counts in (("completed", h["completed"]), ("truncated", h["truncated"])):
            expected = [0] * (len(edges) - 1)
            for r in by_stage[stage]:
                if r["status"] == status:
                    n = len(r["response_token_ids"])
                    expected[next(i for i in range(len(edges) - 1) if edges[i] <= n < edges[i + 1])] += 1
            assert counts == expected, (stage, status)
        assert h["max_tokens"] == 200 and edges[-1] > 200
        rewards = [r["reward"] for r in by_stage[stage]]
        assert data["shaped_reward"][stage] == pytest.approx(sum(rewards) / len(rewards))

    executions = defaultdict(list)
    for r in records:
        executions[r["rollout_id"]].append(r)
    table = defaultdict(int)
    for rs in executions.values():
        picks = [r for r in rs if r["stage"] == "selector"]
        if picks:
            right = any(r["raw_reward"] == 1.0 for r in rs if r["listed_as"] is not None)
            table[(right, picks[0]["raw_reward"] == 1.0)] += 1
    (selector,) = data["charts"]  # three-stage's own section: its vocabulary's chart, over its counters
    assert selector["name"] == "selector" and selector["missing"] is None
    assert selector["values"]["selections"] == sum(table.values()) > 0
    counts = {c["label"]: c["value"] for c in selector["counts"]}
    assert counts["candidate right, pick right"] == table[(True, True)]
    assert counts["candidate right, pick wrong"] == table[(True, False)]
    assert counts["no candidate right, pick wrong"] == table[(False, False)]
    bars = {b["label"]: b["value"] for b in selector["bars"]}
    picked = [r for rs in executions.values() for r in rs if r["stage"] == "selector"]
    assert bars["selector's pick"] == pytest.approx(sum(r["raw_reward"] == 1.0 for r in picked) / len(picked))
    assert bars["majority vote"] == data["stats"]["all"]["report"]["majority_vote_accuracy"]

    manifest = json.loads((folder / "manifest.json").read_text())
    assert len(data["speed"]) == manifest["groups"] == 12  # one point a group (fewer than 100 groups)
    first = [r for r in records if r["problem_id"] == records[0]["problem_id"]]
    assert data["speed"][0]["tokens_per_s"] == pytest.approx(
        sum(len(r["response_token_ids"]) for r in first) / sum(r["latency_s"] for r in first)
    )
    times = data["shard_times"]
    assert len(times) == len(manifest["shards"]) > 1 and times[0]["s"] == 0.0
    assert times[-1]["records"] == manifest["records"] and all(a["s"] <= b["s"] for a, b in itertools.pairwise(times))


class Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def parse(page: str) -> list[tuple[str, dict[str, str | None]]]:
    parser = Tags()
    parser.feed(page)
    return parser.tags


def test_the_page_is_self_contained_and_has_every_chart(folder, tmp_path):
    made = write_report(folder, tmp_path / "report.html", by="topic")
    page = (tmp_path / "report.html").read_text()
    assert made["bytes"] == len(page.encode()) and made["charts"] == len(THREE_STAGE_CHARTS)
    tags = parse(page)
    assert {a["data-chart"] for t, a in tags if t == "svg"} == THREE_STAGE_CHARTS
    assert not {t for t, _ in tags} & {"script", "link", "img", "iframe", "object", "embed", "source", "base"}
    loads = [(t, k, v) for t, a in tags for k, v in a.items() if k in ("src", "href", "srcset", "action", "data")]
    assert loads == [] and "url(" not in page and "@import" not in page
    csp = [a["content"] for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert csp == ["default-src 'none'; style-src 'unsafe-inline'"]
    assert "topic=small" in page and "topic=large" in page  # pass@k per --by value
    assert f'fill="{TRUNCATED}"' in page  # truncated samples drawn in their own colour


def test_the_page_follows_the_folders_system(tmp_path):
    folder = synthetic.critique_revise(tmp_path / "cr")
    page = render(figures(folder))
    charts = [a["data-chart"] for t, a in parse(page) if t == "svg"]
    assert [c for c in charts if c.startswith("lengths-")] == ["lengths-solver", "lengths-critic", "lengths-reviser"]
    assert "selector" not in charts and "by" not in charts
    assert "selector" not in page  # no section the system does not declare
    assert "records-over-time" in charts  # two shards

    debate = render(figures(synthetic.debate(tmp_path / "debate")))
    assert "pass-at-k" in debate  # over the executions' outcomes: no solver stage needed
    assert "proposer → judge" in debate and "judge (not trainable)" in debate
    assert "One shard: no records-over-time line" in debate


def test_report_on_the_command_line(folder, tmp_path):
    runner = CliRunner()
    done = runner.invoke(app, ["report", str(folder), "-o", str(tmp_path / "r.html"), "--by", "topic"])
    assert done.exit_code == 0, done.output
    assert f"charts -> {tmp_path / 'r.html'}" in done.output and (tmp_path / "r.html").stat().st_size > 10_000
    missing = runner.invoke(app, ["report", str(tmp_path / "nowhere"), "-o", str(tmp_path / "x.html")])
    assert missing.exit_code == 6 and f"{tmp_path / 'nowhere'}: no such folder" in missing.output
    nowhere = runner.invoke(app, ["report", str(folder), "-o", str(tmp_path / "no" / "dir" / "r.html")])
    assert nowhere.exit_code == 6 and "cannot write the report (no folder" in nowhere.output
    assert missing.output.strip().count("\n") == 0 and not (tmp_path / "x.html").exists()


RENDERED = """(() => {
  const charts = [...document.querySelectorAll('svg.chart')].map(svg => {
    const box = svg.getBoundingClientRect();
    const bars = [...svg.querySelectorAll('rect.bar')].filter(r => r.getBBox().height > 0 && r.getBBox().width > 0);
    const lines = [...svg.querySelectorAll('polyline.line')].filter(l => l.getTotalLength() > 0);
    return {name: svg.dataset.chart, width: box.width, height: box.height, bars: bars.length, lines: lines.length,
            truncated: bars.filter(r => getComputedStyle(r).fill === 'rgb(213, 94, 0)').length};
  });
  return {charts, title: document.title, h2: [...document.querySelectorAll('h2')].map(h => h.textContent)};
})()"""


@pytest.mark.skipif(chromium_path() is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
def test_the_page_renders_in_headless_chromium_without_any_network_request(folder, tmp_path):
    page_path = tmp_path / "report.html"
    write_report(folder, page_path, by="topic")
    control = tmp_path / "control.html"  # proves the recorder sees a page's request when there is one
    control.write_text("<html><body><img src='http://127.0.0.1:9/x.png'></body></html>")
    blank = tmp_path / "blank.html"
    blank.write_text("<html><body></body></html>")

    async def run() -> tuple[list[str], list[str], dict, bytes, bytes]:
        async with Browser() as browser:
            page = await browser.page()
            await page.load(page_path.as_uri())
            rendered = await page.evaluate(RENDERED)
            shot = await page.screenshot(height=1400)
            other = await browser.page()
            await other.load(control.as_uri())
            empty = await browser.page()
            await empty.load(blank.as_uri())
            nothing = await empty.screenshot(height=1400)
            return page.requests, other.requests, rendered, shot, nothing

    requests, control_requests, rendered, shot, nothing = asyncio.run(run())
    assert requests == [page_path.as_uri()]  # the document itself, and nothing else
    assert control_requests == [control.as_uri(), "http://127.0.0.1:9/x.png"]
    charts = {c["name"]: c for c in rendered["charts"]}
    assert set(charts) == THREE_STAGE_CHARTS
    assert all(c["width"] > 300 and c["height"] > 200 for c in charts.values())
    assert all(charts[name]["bars"] > 0 for name in ("accuracy", "reward", "by", "selector", "lengths-solver"))
    assert all(charts[name]["lines"] >= 1 for name in ("pass-at-k", "speed", "latency", "records-over-time"))
    assert charts["pass-at-k"]["lines"] == 3  # all, topic=large, topic=small
    assert sum(c["truncated"] for name, c in charts.items() if name.startswith("lengths-")) > 0
    assert rendered["h2"][:2] == ["Reward and accuracy per stage", "Response lengths"]
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 8 * len(nothing)  # drawn, not a blank page


def test_text_from_the_data_is_escaped_and_negative_rewards_are_drawn_below_zero(tmp_path):
    def hostile(records):
        for r in records:
            r["metadata"] = {"topic": "<script>alert(1)</script>"}
            r["reward"] = -0.5 if r["stage"] == "rewriter" else r["reward"]  # an incorrect weight below zero

    folder = synthetic.edit(synthetic.three_stage(tmp_path / "t"), hostile)
    page = render(figures(folder, "topic"))
    assert "script" not in {t for t, _ in parse(page)} and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    svg = next(part for part in page.split("<svg ")[1:] if 'data-chart="reward"' in part)
    zero = next(
        float(line.split('y1="')[1].split('"')[0]) for line in svg.split("<line ")[1:] if 'stroke="#333"' in line
    )
    bars = [part for part in svg.split("<rect ")[1:] if 'class="bar"' in part]
    shaped_rewriter = next(b for b in bars if "rewriter, shaped reward: -0.5" in b)
    y = float(shaped_rewriter.split(' y="')[1].split('"')[0])
    assert y == pytest.approx(zero, abs=0.05)  # the bar hangs from the zero line down
    assert any("solver, raw reward: 0.5" in b and float(b.split(' y="')[1].split('"')[0]) < zero for b in bars)


def test_numbers_on_the_page():
    from agentroll.tools.charts import fmt, nice_ticks

    assert [fmt(v) for v in (None, 0, 0.5, 49.6, 0.123456, 1234.5, 12.0, -0.25)] == [
        "-",
        "0",
        "0.5",
        "49.6",
        "0.123",
        "1,234",
        "12",
        "-0.25",
    ]
    assert fmt(49.6, 0) == "50" and fmt(30.0, 0) == "30"
    assert nice_ticks(0.78) == [0.0, 0.2, 0.4, 0.6, 0.8] and nice_ticks(0.6, bottom=-0.3)[0] == -0.4
