"""The report page as a new user reads it (issue 32): no chart label cut short, in the SVG and as Chromium
draws it, and one number of decimals per table column and per chart."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from agentroll.tools.charts import Series, bar_chart
from agentroll.tools.figures import figures
from agentroll.tools.html import render
from agentroll.tools.html import report as write_report

from . import synthetic
from .browser import Browser, chromium_path

LONG = ["solver", "majority vote", "best of N solvers", "selector (its pick)", "its pick, a right one there"]
TOPICS = ["number-theory-and-combinatorics", "algebra", "very long topic name indeed", "x"]


def texts(svg: str) -> list[str]:
    """The text each label shows (its lines joined)."""
    found = re.findall(r'<text class="label"[^>]*>(.*?)</text>', svg)
    return [" ".join(re.findall(r"<tspan[^>]*>(.*?)</tspan>", t)) or t for t in found]


@pytest.mark.parametrize("names", [LONG, TOPICS, [f"value {i}" for i in range(14)]])
def test_a_bar_charts_labels_are_whole_and_its_values_to_the_same_places(names):
    svg = bar_chart("x", "x", names, [Series("all", [0.454, 0.71, 1.0, 0.5, 0.0][: len(names)] or [0.1])], y_label="y")
    assert texts(svg) == names and "…" not in svg
    shown = re.findall(r'font-size="10">([-\d.]+)</text>', svg)
    assert shown and {len(v.split(".")[1]) for v in shown} == {2}  # 0.45 and 0.71, not 0.454 next to 0.71
    height = float(re.search(r'height="(\d+)"', svg).group(1))  # type: ignore[union-attr]
    assert all(float(y) <= height for y in re.findall(r'<text class="label"[^>]* y="([\d.]+)"', svg))


def test_a_tables_ratios_are_to_three_places(tmp_path):
    folder = synthetic.three_stage(tmp_path / "t")
    page = render(figures(folder))
    table = page.split("<table>", 1)[1].split("</table>", 1)[0]
    cells = re.findall(r"<td>(-?\d+\.\d+)</td>", table)
    assert cells and {len(c.split(".")[1]) for c in cells} == {3}


RENDERED = """(() => [...document.querySelectorAll('svg.chart')].map(svg => {
  const box = svg.viewBox.baseVal;
  const shown = t => [...t.childNodes].filter(n => n.nodeName !== 'title').map(n => n.textContent).join(' ').trim();
  return [...svg.querySelectorAll('text')].filter(t => shown(t)).map(t => {
    const b = t.getBBox();
    const m = t.getCTM(), s = svg.getCTM().inverse().multiply(m);
    const corners = [[b.x, b.y], [b.x + b.width, b.y], [b.x, b.y + b.height], [b.x + b.width, b.y + b.height]]
      .map(([x, y]) => [s.a * x + s.c * y + s.e, s.b * x + s.d * y + s.f]);
    const xs = corners.map(c => c[0]), ys = corners.map(c => c[1]);
    return {chart: svg.dataset.chart, text: shown(t), inside: Math.min(...xs) >= -1 && Math.min(...ys) >= -1
            && Math.max(...xs) <= box.width + 1 && Math.max(...ys) <= box.height + 1};
  });
}).flat())()"""


@pytest.mark.skipif(chromium_path() is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
def test_every_chart_text_is_drawn_whole_inside_its_chart_in_chromium(tmp_path):
    def topics(records):
        for r in records:
            r["metadata"] = {"topic": TOPICS[sum(map(ord, r["problem_id"])) % len(TOPICS)]}

    folder = synthetic.edit(synthetic.three_stage(tmp_path / "t"), topics)
    page_path = tmp_path / "report.html"
    write_report(folder, page_path, by="topic")

    async def run() -> list[dict]:
        async with Browser() as browser:
            page = await browser.page()
            await page.load(page_path.as_uri())
            return await page.evaluate(RENDERED)

    drawn = asyncio.run(run())
    assert drawn and not [t for t in drawn if not t["inside"]], json.dumps([t for t in drawn if not t["inside"]])
    labels = " ".join(t["text"] for t in drawn)
    for name in ("selector (its pick)", "best of N solvers", "number-theory-and-combinatorics"):
        assert name in labels, name  # what is drawn, not a hover title
