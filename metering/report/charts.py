"""Inline SVG charts for the HTML report: plain SVG elements, no script, no fonts to fetch.

Every text that comes from data goes through `esc`, so a label like `<script>` is drawn as
text. Numbers are written with fixed precision, so the same report gives the same SVG.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from html import escape

# Tableau 10: distinct on screen and in print; fleet rows (idle, down) are always greys.
PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#e15759",
    "#76b7b2",
    "#59a14f",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#17becf",
)
IDLE_COLOR = "#bab0ac"
OTHER_COLOR = "#a0cbe8"  # teams past the tenth, drawn as one series
KIND_COLORS = {"idle": IDLE_COLOR, "down": "#79706e", "adjustment": "#d7b5a6"}

WIDTH = 760
LABEL_W = 190  # left column for row labels
VALUE_W = 110  # right column for value labels
ROW_H = 24
FONT = "font-family:system-ui,sans-serif;font-size:12px"


def esc(text: str) -> str:
    return escape(text, quote=True)


def _n(x: float) -> str:
    """Coordinates with two decimals at most, never `-0`."""
    s = f"{x:.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def _clip(text: str, limit: int = 28) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def nice_max(value: float) -> float:
    """Round an axis maximum up to 1, 2, 2.5 or 5 times a power of ten."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        top = step * 10.0**exp
        if top >= value * (1 - 1e-12):
            return top
    return 10.0 ** (exp + 1)


@dataclass(frozen=True)
class Axis:
    """A value axis: ticks from 0 to `top` every `step`, all printed with `decimals`."""

    top: float
    step: float
    decimals: int

    @property
    def ticks(self) -> list[float]:
        n = round(self.top / self.step)
        return [self.step * k for k in range(n + 1)]

    def label(self, value: float, scale: float = 1.0, suffix: str = "") -> str:
        return f"{value * scale:,.{self.decimals}f}{suffix}"


def axis(largest: float, at_least: float = 0.0, target: int = 5, scale: float = 1.0) -> Axis:
    """Ticks at 1, 2, 2.5 or 5 times a power of ten, about `target` of them, the top at or
    above the largest value (and `at_least`). Decimals are the step's, in the printed unit
    (`scale` 100 for percentages), so every tick reads alike: 0, 0.5, 1.0, 1.5."""
    largest = max(largest, at_least)
    if largest <= 0:
        largest = 1.0
    step = nice_max(largest / target)
    n = math.ceil(largest / step - 1e-9)
    exponent = Decimal(repr(round(step * scale, 12))).normalize().as_tuple().exponent
    decimals = max(0, -int(exponent))
    return Axis(step * n, step, decimals)


@dataclass(frozen=True)
class Segment:
    name: str
    value: float
    color: str


@dataclass(frozen=True)
class BarRow:
    label: str
    segments: Sequence[Segment]
    value_text: str  # printed right of the bar


def _svg(title: str, height: float, body: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{esc(title)}" '
        f'width="{WIDTH}" height="{_n(height)}" viewBox="0 0 {WIDTH} {_n(height)}" '
        f'style="{FONT}">'
        f"<title>{esc(title)}</title>" + "".join(body) + "</svg>"
    )


def _legend(items: Sequence[tuple[str, str]], y: float) -> tuple[list[str], float]:
    """Swatches in rows across the width; returns the elements and the height used."""
    out: list[str] = []
    x, row_y = 10.0, y
    for name, color in items:
        text = _clip(name, 24)
        w = 22 + 7 * len(text)
        if x + w > WIDTH - 10 and x > 10:
            x, row_y = 10.0, row_y + 18
        out.append(
            f'<rect x="{_n(x)}" y="{_n(row_y)}" width="12" height="12" fill="{color}">'
            f"<title>{esc(name)}</title></rect>"
            f'<text x="{_n(x + 16)}" y="{_n(row_y + 10)}">{esc(text)}</text>'
        )
        x += w + 10
    return out, (row_y - y) + 18 if items else 0.0


def hbars(
    title: str,
    rows: Sequence[BarRow],
    fmt: Callable[[float], str],
    legend: Sequence[tuple[str, str]] = (),
    at_least: float = 0.0,
    scale: float = 1.0,
    suffix: str = "",
    reference: tuple[float, str] | None = None,
) -> str:
    """Horizontal bars, one per row, each a stack of segments, over a value axis with ticks
    (labels in `scale` x value + `suffix`). `reference` draws a dashed line at a value with
    its label (100 % on an efficiency chart)."""
    plot_w = WIDTH - LABEL_W - VALUE_W
    largest = max((sum(max(s.value, 0) for s in r.segments) for r in rows), default=0.0)
    ax = axis(largest, at_least, scale=scale)
    top = ax.top
    body = [f'<text x="10" y="18" style="font-weight:600;font-size:14px">{esc(title)}</text>']
    y = 30.0
    bars_top = y + len(rows) * ROW_H
    for v in ax.ticks:  # gridlines under the bars
        gx = LABEL_W + plot_w * v / top
        body.append(f'<line x1="{_n(gx)}" y1="30" x2="{_n(gx)}" y2="{_n(bars_top)}" '
                    'stroke="#e4e4e4"/>')
    for row in rows:
        body.append(
            f'<text x="{LABEL_W - 8}" y="{_n(y + 16)}" text-anchor="end">'
            f"<title>{esc(row.label)}</title>{esc(_clip(row.label))}</text>"
        )
        x = float(LABEL_W)
        for seg in row.segments:
            w = plot_w * max(seg.value, 0) / top if top else 0
            if w <= 0:
                continue
            body.append(
                f'<rect x="{_n(x)}" y="{_n(y + 3)}" width="{_n(max(w, 1))}" height="{ROW_H - 6}" '
                f'fill="{seg.color}"><title>{esc(f"{row.label} · {seg.name}: {fmt(seg.value)}")}'
                "</title></rect>"
            )
            x += w
        body.append(f'<text x="{_n(x + 6)}" y="{_n(y + 16)}">{esc(row.value_text)}</text>')
        y += ROW_H
    if reference is not None and 0 <= reference[0] <= top:
        rx = LABEL_W + plot_w * reference[0] / top
        body.append(
            f'<line class="reference" x1="{_n(rx)}" y1="26" x2="{_n(rx)}" y2="{_n(y)}" '
            'stroke="#222" stroke-dasharray="4 3"/>'
            f'<text x="{_n(rx)}" y="{_n(y + 30)}" text-anchor="middle" fill="#222">'
            f"{esc(reference[1])}</text>"
        )
    # Axis line and a labelled tick at every step, so bars are read against a scale.
    body.append(f'<line x1="{LABEL_W}" y1="30" x2="{LABEL_W}" y2="{_n(y)}" stroke="#555"/>')
    for v in ax.ticks:
        gx = LABEL_W + plot_w * v / top
        body.append(
            f'<line x1="{_n(gx)}" y1="{_n(y)}" x2="{_n(gx)}" y2="{_n(y + 4)}" stroke="#555"/>'
            f'<text class="tick" x="{_n(gx)}" y="{_n(y + 15)}" text-anchor="middle" '
            f'fill="#555">{esc(ax.label(v, scale, suffix))}</text>'
        )
    y += 22 + (14 if reference is not None else 0)
    if not rows:
        body.append(f'<text x="{LABEL_W}" y="{_n(y)}" fill="#555">no data</text>')
        y += 10
    items, used = _legend(legend, y)
    body += items
    return _svg(title, y + used + 6, body)


@dataclass(frozen=True)
class Series:
    name: str
    color: str
    values: Sequence[float]  # one per category


def stacked_columns(
    title: str, categories: Sequence[str], series: Sequence[Series], fmt: Callable[[float], str]
) -> str:
    """Vertical stacked columns, one per category (e.g. day), with a y axis and a legend."""
    left, plot_top, plot_h = 70.0, 34.0, 220.0
    plot_w = WIDTH - left - 20
    totals = [sum(max(s.values[i], 0) for s in series) for i in range(len(categories))]
    ax = axis(max(totals, default=0.0))
    top = ax.top
    body = [f'<text x="10" y="18" style="font-weight:600;font-size:14px">{esc(title)}</text>']
    for v in ax.ticks:  # a gridline and label at every step, one format for all
        gy = plot_top + plot_h - plot_h * v / top
        body.append(
            f'<line x1="{_n(left)}" y1="{_n(gy)}" x2="{_n(left + plot_w)}" y2="{_n(gy)}" '
            f'stroke="#ddd"/><text class="tick" x="{_n(left - 6)}" y="{_n(gy + 4)}" '
            f'text-anchor="end" fill="#555">{esc(ax.label(v))}</text>'
        )
    slot = plot_w / max(len(categories), 1)
    for i, cat in enumerate(categories):
        x = left + slot * i + slot * 0.1
        base = plot_top + plot_h
        for s in series:
            h = plot_h * max(s.values[i], 0) / top
            if h <= 0:
                continue
            base -= h
            body.append(
                f'<rect x="{_n(x)}" y="{_n(base)}" width="{_n(slot * 0.8)}" height="{_n(h)}" '
                f'fill="{s.color}"><title>{esc(f"{cat} · {s.name}: {fmt(s.values[i])}")}'
                "</title></rect>"
            )
        if len(categories) <= 12 or i % 2 == 0:
            body.append(
                f'<text x="{_n(x + slot * 0.4)}" y="{_n(plot_top + plot_h + 14)}" '
                f'text-anchor="middle" fill="#555">{esc(cat[-2:])}</text>'
            )
    y = plot_top + plot_h + 30
    if not categories:
        body.append(f'<text x="{_n(left + 10)}" y="{_n(plot_top + plot_h / 2)}">no data</text>')
    items, used = _legend([(s.name, s.color) for s in series], y)
    body += items
    return _svg(title, y + used + 6, body)
