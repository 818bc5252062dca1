"""Plain SVG charts for `agentroll report`: grouped bars, lines, stacked histograms, as text.

No charting library and no script: the page must open anywhere, offline, and show the same thing in ten years.
Every mark carries a `<title>` (the browser shows it on hover) with its exact value, and a class (`bar`, `line`,
`point`) that the browser test counts. Colours are the Okabe-Ito palette, which colour-blind readers can tell
apart; truncation is always the same vermilion.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#F0E442", "#000000", "#999999")
TRUNCATED = "#D55E00"
WIDTH, HEIGHT = 640, 280
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 28, 64


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    values: Sequence[float | None]
    color: str | None = None


def color(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def nice_ticks(top: float, count: int = 5, bottom: float = 0.0) -> list[float]:
    """Ticks from `bottom` (0, or below it for negative values) to the first at or past `top`, a step of 1, 2 or 5
    times a power of ten apart."""
    bottom = min(bottom, 0.0)
    if not math.isfinite(top) or not math.isfinite(bottom) or top - bottom <= 0:
        return [bottom, bottom + 1.0]
    raw = (top - bottom) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    ticks = [math.floor(bottom / step + 1e-9) * step]
    while ticks[-1] < top - 1e-9 * step:
        ticks.append(round(ticks[-1] + step, 12))
    return ticks


def fmt(value: float | None, digits: int = 3) -> str:
    """A number for a label: integers with thousands separators, others to `digits` places, zeros trimmed."""
    if value is None:
        return "-"
    if float(value).is_integer():
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    text = f"{value:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def _svg(name: str, label: str, body: list[str], width: int = WIDTH, height: int = HEIGHT) -> str:
    return (
        f'<svg class="chart" data-chart="{escape(name)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
        f'aria-label="{escape(label)}"><title>{escape(label)}</title>{"".join(body)}</svg>'
    )


class _Plot:
    """The plotting area and its value axis (from 0, or from below it when values are negative). `top` and
    `bottom`: the margins, grown by a chart whose legend or labels need more room than the defaults."""

    def __init__(
        self,
        y_top: float,
        width: int = WIDTH,
        height: int = HEIGHT,
        y_bottom: float = 0.0,
        top: float = TOP,
        bottom: float = BOTTOM,
    ) -> None:
        self.width, self.height = width, round(height + max(0.0, top - TOP) + max(0.0, bottom - BOTTOM))
        self.x0, self.x1 = LEFT, width - RIGHT
        self.y0, self.y1 = self.height - bottom, top  # the bottom and the top of the area, in pixels
        self.ticks = nice_ticks(y_top, bottom=y_bottom)
        self.low, self.top = self.ticks[0], self.ticks[-1]

    def y(self, value: float) -> float:
        return self.y0 - (self.y0 - self.y1) * (value - self.low) / ((self.top - self.low) or 1.0)

    def axes(self, y_label: str, x_label: str = "") -> list[str]:
        out = []
        for tick in self.ticks:
            y = self.y(tick)
            out.append(f'<line class="grid" x1="{self.x0}" x2="{self.x1}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e5e5e5"/>')
            out.append(f'<text x="{self.x0 - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{fmt(tick)}</text>')
        zero = self.y(0.0)
        out.append(f'<line x1="{self.x0}" x2="{self.x1}" y1="{zero:.1f}" y2="{zero:.1f}" stroke="#333"/>')
        mid = (self.y0 + self.y1) / 2
        out.append(
            f'<text x="14" y="{mid:.1f}" transform="rotate(-90 14 {mid:.1f})" text-anchor="middle" '
            f'font-size="12">{escape(y_label)}</text>'
        )
        if x_label:
            out.append(
                f'<text x="{(self.x0 + self.x1) / 2:.1f}" y="{self.height - 8}" text-anchor="middle" '
                f'font-size="12">{escape(x_label)}</text>'
            )
        return out


CHAR_PX = 6.5  # the width of a character at the labels' font size (11 px), generously


def legend_rows(
    names: Sequence[tuple[str, str]], x: float, right: float = WIDTH - RIGHT
) -> list[list[tuple[float, str, str]]]:
    """The legend's entries placed left to right from `x`, onto a new row where the next would pass `right`."""
    rows: list[list[tuple[float, str, str]]] = [[]]
    at = x
    for name, fill in names:
        width = 24 + CHAR_PX * len(name)
        if rows[-1] and at + width - 10 > right:
            rows.append([])
            at = x
        rows[-1].append((at, name, fill))
        at += width
    return rows


def legend(names: Sequence[tuple[str, str]], x: float, y: float = 14) -> list[str]:
    """Coloured squares and names, left to right from (x, y), in as many rows as the width takes (16 px
    apart: a chart with more than one row moves its plot down, `legend_top`)."""
    out = []
    for row, entries in enumerate(legend_rows(names, x)):
        line = y + 16 * row
        for at, name, fill in entries:
            out.append(f'<rect x="{at:.1f}" y="{line - 9}" width="10" height="10" fill="{fill}"/>')
            out.append(f'<text x="{at + 14:.1f}" y="{line}" font-size="11">{escape(name)}</text>')
    return out


def legend_top(names: Sequence[tuple[str, str]]) -> float:
    """The plot's top margin under a legend of `names`."""
    return TOP + 16 * (len(legend_rows(names, LEFT)) - 1) if len(names) > 1 else TOP


def _label_lines(text: str, most: int) -> list[str]:
    """A category's name on lines of at most `most` characters, broken at spaces, never inside a word (a word
    longer than a line is one line of its own: the chart turns its labels instead)."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= most:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [text]


def bar_chart(
    name: str,
    label: str,
    categories: Sequence[str],
    series: Sequence[Series],
    *,
    y_label: str,
    y_top: float | None = None,
    digits: int = 3,
) -> str:
    """Grouped bars: one group per category, one bar per series (a missing value leaves a gap marked '-')."""
    values = [v for s in series for v in s.values if v is not None]
    slot = (WIDTH - RIGHT - LEFT) / max(1, len(categories))
    most = max(1, int(slot / CHAR_PX))  # characters a line of a label holds under its bar group
    wrapped = [_label_lines(c, most) for c in categories]
    tilt = any(len(line) > most for lines in wrapped for line in lines) or max(map(len, wrapped), default=1) > 3
    # labels are never cut: lines under the bars, or turned upright when a word is wider than its slot
    needed = 12 + CHAR_PX * max(map(len, categories), default=0) if tilt else 8 + 13 * max(map(len, wrapped), default=1)
    names = [(s.name, s.color or color(j)) for j, s in enumerate(series)]
    plot = _Plot(
        y_top if y_top is not None else max(values, default=0.0) or 1.0,
        y_bottom=min(values, default=0.0),
        top=legend_top(names),
        bottom=max(BOTTOM, needed + 8),
    )
    zero = plot.y(0.0)
    body = plot.axes(y_label)
    bar = slot * 0.8 / max(1, len(series))
    show_values = len(categories) * len(series) <= 24
    for i, category in enumerate(categories):
        left = plot.x0 + i * slot + slot * 0.1
        for j, s in enumerate(series):
            value = s.values[i] if i < len(s.values) else None
            x = left + j * bar
            fill = s.color or color(j)
            if value is None:
                body.append(
                    f'<text x="{x + bar / 2:.1f}" y="{plot.y0 - 4}" text-anchor="middle" font-size="10" '
                    'fill="#777">-</text>'
                )
                continue
            y = plot.y(value)
            body.append(
                f'<rect class="bar" x="{x:.1f}" y="{min(y, zero):.1f}" width="{max(bar - 2, 1):.1f}" '
                f'height="{abs(zero - y):.1f}" fill="{fill}"><title>{escape(category)}, {escape(s.name)}: '
                f"{fmt(value, digits)}</title></rect>"
            )
            if show_values:  # every bar's value to the same places, so the chart reads as one
                body.append(
                    f'<text x="{x + bar / 2:.1f}" y="{min(y, zero) - 3:.1f}" text-anchor="middle" font-size="10">'
                    f"{value:.{min(digits, 2)}f}</text>"
                )
        cx = plot.x0 + (i + 0.5) * slot
        if tilt:
            body.append(
                f'<text class="label" x="{cx + 4:.1f}" y="{plot.y0 + 8}" transform="rotate(-90 {cx + 4:.1f} '
                f'{plot.y0 + 8})" text-anchor="end" font-size="11">{escape(category)}</text>'
            )
        else:
            lines = "".join(
                f'<tspan x="{cx:.1f}" dy="{16 if k == 0 else 13}">{escape(line)}</tspan>'
                for k, line in enumerate(wrapped[i])
            )
            body.append(
                f'<text class="label" x="{cx:.1f}" y="{plot.y0}" text-anchor="middle" font-size="11">{lines}</text>'
            )
    if len(series) > 1:
        body += legend(names, plot.x0)
    return _svg(name, label, body, plot.width, plot.height)


def line_chart(
    name: str,
    label: str,
    series: Sequence[tuple[str, Sequence[tuple[float, float]]]],
    *,
    x_label: str,
    y_label: str,
    y_top: float | None = None,
    digits: int = 3,
) -> str:
    """Lines through (x, y) points, one per series, x from the smallest to the largest of any series."""
    xs = [x for _, points in series for x, _ in points]
    ys = [y for _, points in series for _, y in points]
    names = [(n, color(j)) for j, (n, _) in enumerate(series)]
    plot = _Plot(y_top if y_top is not None else max(ys, default=0.0) or 1.0, top=legend_top(names))
    body = plot.axes(y_label, x_label)
    lo, hi = min(xs, default=0.0), max(xs, default=1.0)
    span = hi - lo or 1.0

    def px(x: float) -> float:
        return plot.x0 + (plot.x1 - plot.x0) * (x - lo) / span

    for tick in _x_ticks(lo, hi):
        body.append(
            f'<text x="{px(tick):.1f}" y="{plot.y0 + 16}" text-anchor="middle" font-size="11">{fmt(tick)}</text>'
        )
    for j, (series_name, points) in enumerate(series):
        stroke = color(j)
        path = " ".join(f"{px(x):.1f},{plot.y(y):.1f}" for x, y in points)
        body.append(
            f'<polyline class="line" points="{path}" fill="none" stroke="{stroke}" stroke-width="2">'
            f"<title>{escape(series_name)}</title></polyline>"
        )
        if len(points) <= 64:
            for x, y in points:
                body.append(
                    f'<circle class="point" cx="{px(x):.1f}" cy="{plot.y(y):.1f}" r="3" fill="{stroke}">'
                    f"<title>{escape(series_name)}: {fmt(x)} → {fmt(y, digits)}</title></circle>"
                )
    if len(series) > 1:
        body += legend(names, plot.x0)
    return _svg(name, label, body, plot.width, plot.height)


def _x_ticks(lo: float, hi: float) -> list[float]:
    """Round multiples of a nice step within [lo, hi], and lo itself when the first multiple is far from it."""
    if hi <= lo:
        return [lo]
    steps = nice_ticks(hi - lo, 6)
    step = steps[1] - steps[0]
    ticks = [m * step for m in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)]
    return ticks if ticks and ticks[0] - lo <= step / 2 else [lo, *ticks]


def histogram(
    name: str,
    label: str,
    edges: Sequence[float],
    stacks: Sequence[Series],
    *,
    x_label: str,
    y_label: str = "samples",
    marker: tuple[float, str] | None = None,
) -> str:
    """Stacked bars over bins [edges[i], edges[i+1]), stacks bottom to top; `marker` draws a dashed line at x."""
    bins = len(edges) - 1
    totals = [sum((s.values[i] or 0) for s in stacks) for i in range(bins)]
    names = [(s.name, s.color or color(j)) for j, s in enumerate(stacks)]
    plot = _Plot(max(totals, default=0) or 1, top=legend_top(names))
    body = plot.axes(y_label, x_label)
    lo, hi = edges[0], edges[-1]
    span = hi - lo or 1.0

    def px(x: float) -> float:
        return plot.x0 + (plot.x1 - plot.x0) * (x - lo) / span

    for i in range(bins):
        base = 0.0
        x, w = px(edges[i]), max(px(edges[i + 1]) - px(edges[i]) - 1, 1)
        for j, s in enumerate(stacks):
            count = s.values[i] or 0
            if not count:
                continue
            top, bottom = plot.y(base + count), plot.y(base)
            body.append(
                f'<rect class="bar" x="{x:.1f}" y="{top:.1f}" width="{w:.1f}" height="{bottom - top:.1f}" '
                f'fill="{s.color or color(j)}"><title>{fmt(edges[i])}–{fmt(edges[i + 1])} tokens, '
                f"{escape(s.name)}: {fmt(count)}</title></rect>"
            )
            base += count
    for tick in _x_ticks(lo, hi):
        body.append(
            f'<text x="{px(tick):.1f}" y="{plot.y0 + 16}" text-anchor="middle" font-size="11">{fmt(tick)}</text>'
        )
    if marker is not None and lo <= marker[0] <= hi:
        mx = px(marker[0])
        body.append(
            f'<line class="marker" x1="{mx:.1f}" x2="{mx:.1f}" y1="{plot.y1}" y2="{plot.y0}" '
            f'stroke="{TRUNCATED}" stroke-dasharray="4 3"><title>{escape(marker[1])}</title></line>'
        )
        body.append(
            f'<text x="{mx - 4:.1f}" y="{plot.y1 + 10}" text-anchor="end" font-size="10" '
            f'fill="{TRUNCATED}">{escape(marker[1])}</text>'
        )
    body += legend(names, plot.x0)
    return _svg(name, label, body, plot.width, plot.height)
