"""Inline SVG charts drawn in Python, so the HTML report needs no script, font or CDN.

Each function returns one `<svg>` element as text; every label is escaped here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from optlab.metrics.change import percent_change
from optlab.reports.data import SweepCurve
from optlab.reports.format import percent

# Distinguishable on white and for the common colour-vision deficiencies (Okabe-Ito).
PALETTE = (
    "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#7F7F00", "#000000",
)  # fmt: skip
STAGE_COLOURS = {
    "queue": "#BBBBBB",
    "preprocess": "#56B4E9",
    "infer": "#0072B2",
    "postprocess": "#009E73",
}

Series = tuple[str, Sequence[tuple[float, float]]]  # (label, [(x, y), ...])


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def stage_colour(stage: str, index: int) -> str:
    return STAGE_COLOURS.get(stage, PALETTE[(index + 1) % len(PALETTE)])


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    if not math.isfinite(low) or not math.isfinite(high) or high <= low:
        return [low]
    raw = (high - low) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.ceil(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _fmt(value: float) -> str:
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.2g}" if abs(value) < 1 else f"{value:.1f}"


def _open(title: str, width: int, height: int, title_x: int) -> str:
    """The `<svg>` element's opening tag and the chart's title."""
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}">'
        f'<text x="{title_x}" y="18" class="title">{escape(title)}</text>'
    )


@dataclass(frozen=True)
class _Plot:
    """Where a line chart's plot area sits in the SVG, and the values its edges stand for."""

    left: int
    top: int
    width: int
    height: int
    x_low: float
    x_high: float
    y_low: float
    y_high: float

    def x(self, value: float) -> float:
        return self.left + (value - self.x_low) / (self.x_high - self.x_low) * self.width

    def y(self, value: float) -> float:
        return (
            self.top + self.height - (value - self.y_low) / (self.y_high - self.y_low) * self.height
        )


def _fit(
    points: Sequence[tuple[float, float]],
    left: int,
    top: int,
    width: int,
    height: int,
    *,
    y_from_zero: bool,
) -> _Plot:
    """A plot area that holds every point, with 5% of room above the highest."""
    x_low = min(p[0] for p in points)
    x_high = max(p[0] for p in points)
    y_low = 0.0 if y_from_zero else min(p[1] for p in points)
    y_high = max(p[1] for p in points) * 1.05 or 1.0
    if x_high <= x_low:
        x_high = x_low + 1
    if y_high <= y_low:
        y_high = y_low + 1
    return _Plot(left, top, width, height, x_low, x_high, y_low, y_high)


def _finite(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    return [p for p in points if math.isfinite(p[0]) and math.isfinite(p[1])]


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    x_ticks: Sequence[tuple[float, str]] | None = None,
    width: int = 640,
    height: int = 300,
    y_from_zero: bool = True,
) -> str:
    """Lines, one colour per series in order, with axes, ticks and a legend below the plot."""
    left, right, top, bottom = 64, 16, 30, 46
    legend_rows = math.ceil(len(series) / 3) if series else 0
    total_height = height + legend_rows * 18 + 8
    plot_w, plot_h = width - left - right, height - top - bottom
    points = [p for _, pts in series for p in _finite(pts)]
    out = [_open(title, width, total_height, left)]
    if not points:
        out.append(
            f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" text-anchor="middle" '
            f'class="empty">no data</text></svg>'
        )
        return "".join(out)
    plot = _fit(points, left, top, plot_w, plot_h, y_from_zero=y_from_zero)
    out += _y_grid(plot)
    if x_ticks is None:
        x_ticks = [(t, _fmt(t)) for t in _nice_ticks(plot.x_low, plot.x_high)]
    out += _x_grid(plot, x_ticks)
    out.append(_axes(plot, x_label, y_label))
    for index, (label, pts) in enumerate(series):
        out.append(_line(plot, _finite(pts), colour(index)))
        lx = left + (index % 3) * (plot_w / 3)
        ly = height + 10 + (index // 3) * 18
        out.append(
            f'<rect x="{lx:.1f}" y="{ly - 9}" width="12" height="4" fill="{colour(index)}"/>'
            f'<text x="{lx + 16:.1f}" y="{ly - 4}" class="legend">{escape(_clip(label))}</text>'
        )
    out.append("</svg>")
    return "".join(out)


def _y_grid(plot: _Plot) -> list[str]:
    """A grid line and a label at each round value of the y axis."""
    out = []
    for tick in _nice_ticks(plot.y_low, plot.y_high):
        y = plot.y(tick)
        out.append(
            f'<line x1="{plot.left}" x2="{plot.left + plot.width}" y1="{y:.1f}" y2="{y:.1f}" '
            'class="grid"/>'
        )
        out.append(f'<text x="{plot.left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">')
        out.append(f"{_fmt(tick)}</text>")
    return out


def _x_grid(plot: _Plot, ticks: Sequence[tuple[float, str]]) -> list[str]:
    """A grid line and a label at each x tick within the plot."""
    out = []
    bottom = plot.top + plot.height
    for value, label in ticks:
        if plot.x_low - 1e-9 <= value <= plot.x_high + 1e-6 * (plot.x_high - plot.x_low):
            x = plot.x(value)
            out.append(
                f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{plot.top}" y2="{bottom}" class="grid"/>'
            )
            out.append(
                f'<text x="{x:.1f}" y="{bottom + 16}" class="tick" text-anchor="middle">'
                f"{escape(label)}</text>"
            )
    return out


def _axes(plot: _Plot, x_label: str, y_label: str) -> str:
    """The plot's frame and the two axis labels."""
    left, top, middle = plot.left, plot.top, plot.top + plot.height / 2
    return (
        f'<rect x="{left}" y="{top}" width="{plot.width}" height="{plot.height}" class="frame"/>'
        f'<text x="{left + plot.width / 2}" y="{top + plot.height + 34}" class="axis" '
        f'text-anchor="middle">{escape(x_label)}</text>'
        f'<text x="14" y="{middle}" class="axis" text-anchor="middle" '
        f'transform="rotate(-90 14 {middle})">{escape(y_label)}</text>'
    )


def _line(plot: _Plot, points: list[tuple[float, float]], stroke: str) -> str:
    """One series: a polyline, or a dot where it has a single point; nothing where it has none."""
    if len(points) == 1:
        x, y = points[0]
        return f'<circle cx="{plot.x(x):.1f}" cy="{plot.y(y):.1f}" r="3" fill="{stroke}"/>'
    if not points:
        return ""
    path = " ".join(f"{plot.x(x):.1f},{plot.y(y):.1f}" for x, y in points)
    return f'<polyline points="{path}" fill="none" stroke="{stroke}" stroke-width="1.8"/>'


def _clip(text: str, limit: int = 34) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def stage_waterfall(
    title: str,
    steps: Sequence[tuple[str, dict[str, float]]],
    *,
    width: int = 900,
) -> str:
    """One bar per step: its stage P50s laid end to end in request order, so a change shows as
    the segment that grew or shrank; on the right, the stage that moved most from the step
    before (ms and %)."""
    label_w, note_w, row_h, top = 180, 230, 26, 30
    stages: list[str] = []
    for _, values in steps:
        stages += [s for s in values if s not in stages]
    longest = max((sum(v.values()) for _, v in steps if v), default=0.0) or 1.0
    bar_w = width - label_w - note_w - 10
    legend_y = top + row_h * len(steps) + 18
    height = legend_y + 14
    out = [_open(title, width, height, 4)]
    previous: dict[str, float] | None = None
    for row, (name, values) in enumerate(steps):
        y = top + row * row_h
        out.append(
            f'<text x="{label_w - 8}" y="{y + 15}" class="tick" text-anchor="end">'
            f"{escape(_clip(name, 26))}</text>"
        )
        if not values:
            out.append(f'<text x="{label_w}" y="{y + 15}" class="empty">no stage data</text>')
            continue
        x = float(label_w)
        for stage in stages:
            value = values.get(stage)
            if value is None or value <= 0:
                continue
            w = value / longest * bar_w
            out.append(_segment(stage, stages.index(stage), value, x, y, w, row_h))
            x += w
        out.append(
            f'<text x="{x + 4:.1f}" y="{y + 15}" class="tick">{sum(values.values()):.2f} ms</text>'
        )
        if previous:
            note = _moved_most(previous, values, stages)
            out.append(
                f'<text x="{width - note_w + 6}" y="{y + 15}" class="note">{escape(note)}</text>'
            )
        previous = values
    out += _stage_legend(stages, float(label_w), legend_y)
    out.append("</svg>")
    return "".join(out)


def _segment(stage: str, index: int, value: float, x: float, y: int, w: float, row_h: int) -> str:
    """One stage's part of a step's bar, with its P50 as the tooltip."""
    tip = f"{stage}: {value:.3f} ms"
    return (
        f'<rect x="{x:.1f}" y="{y + 3}" width="{max(w, 0.5):.1f}" height="{row_h - 8}" '
        f'fill="{stage_colour(stage, index)}"><title>{escape(tip)}</title></rect>'
    )


def _moved_most(previous: dict[str, float], values: dict[str, float], stages: list[str]) -> str:
    """The stage whose P50 moved most since the step before, in ms and %."""
    moved = [(values.get(s, 0.0) - previous.get(s, 0.0), s) for s in stages]
    delta, stage = max(moved, key=lambda m: abs(m[0]))
    change = percent_change(previous.get(stage), values.get(stage, 0.0))
    pct = f" ({percent(change, 0)})" if change is not None else ""
    return f"{stage} {delta:+.2f} ms{pct}" if abs(delta) > 0 else "no stage moved"


def _stage_legend(stages: list[str], x: float, y: int) -> list[str]:
    """A colour swatch and the name of each stage, in a row from `x`."""
    out = []
    for index, stage in enumerate(stages):
        out.append(
            f'<rect x="{x:.1f}" y="{y - 9}" width="12" height="10" '
            f'fill="{stage_colour(stage, index)}"/><text x="{x + 16:.1f}" y="{y}" '
            f'class="legend">{escape(stage)}</text>'
        )
        x += 24 + 7 * len(stage)
    return out


# Levels whose latency is beyond this many times the SLO are drawn on the plot's top edge: an
# overloaded level's seconds-long tail would squash the part of the curve that decides.
SLO_HEADROOM = 3.0
SLO_COLOUR = "#CF222E"


def _interpolate(points: Sequence[tuple[float, float]], x: float) -> float | None:
    """y at `x` on the polyline through `points` (sorted by x); None outside it."""
    for (x0, y0), (x1, y1) in zip(points, points[1:], strict=False):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def latency_throughput_chart(
    title: str,
    curves: Sequence[SweepCurve],
    *,
    slo_ms: float,
    slo_label: str,
    percentile_label: str = "P99",
    width: int = 900,
    height: int = 380,
) -> str:
    """Latency against achieved throughput, one colour per step's sweep: the SLO's percentile
    (solid) and P50 (dashed) at each level, the SLO as a horizontal line, each step's knee
    (a triangle on its curve) and capacity (a dotted drop from the SLO line, a diamond on it)."""
    left, right, top, bottom = 64, 120, 30, 46
    legend_rows = math.ceil(len(curves) / 3) + 1 if curves else 0
    total_height = height + legend_rows * 18 + 8
    plot_w, plot_h = width - left - right, height - top - bottom
    out = [_open(title, width, total_height, left)]
    latencies = [
        v for c in curves for lv in c.levels for v in (lv.p50_ms, lv.slo_ms) if v is not None
    ]
    xs = [lv.achieved_qps for c in curves for lv in c.levels]
    xs += [v for c in curves for v in (c.capacity_qps, c.knee_qps) if v is not None]
    if not xs or not latencies:
        out.append(
            f'<text x="{left + plot_w / 2}" y="{top + plot_h / 2}" text-anchor="middle" '
            f'class="empty">no sweep levels</text></svg>'
        )
        return "".join(out)
    y_high = max(min(max(latencies), SLO_HEADROOM * slo_ms), slo_ms) * 1.1
    plot = _Plot(left, top, plot_w, plot_h, 0.0, max(xs) * 1.05 or 1.0, 0.0, y_high)
    out += _y_grid(plot)
    out += _x_grid(plot, [(t, _fmt(t)) for t in _nice_ticks(plot.x_low, plot.x_high)])
    out.append(_axes(plot, "achieved requests/s", "latency ms"))
    slo_y = plot.y(slo_ms)
    out.append(
        f'<line x1="{left}" x2="{left + plot_w}" y1="{slo_y:.1f}" y2="{slo_y:.1f}" '
        f'stroke="{SLO_COLOUR}" stroke-width="1.5" stroke-dasharray="6 4" class="slo"/>'
        f'<text x="{left + plot_w + 6}" y="{slo_y + 4:.1f}" class="legend" '
        f'fill="{SLO_COLOUR}">SLO {escape(slo_label)}</text>'
    )
    for index, curve in enumerate(curves):
        out += _sweep_marks(plot, curve, colour(index), y_high, slo_ms, percentile_label)
    out += _sweep_legend(curves, left, plot_w, height, percentile_label)
    out.append("</svg>")
    return "".join(out)


def _sweep_marks(
    plot: _Plot, curve: SweepCurve, stroke: str, y_high: float, slo_ms: float, label: str
) -> list[str]:
    """One step's two curves, its knee and its capacity."""
    out: list[str] = []
    tail = [(lv.achieved_qps, min(lv.slo_ms, y_high)) for lv in curve.levels if lv.slo_ms]
    median = [(lv.achieved_qps, min(lv.p50_ms, y_high)) for lv in curve.levels if lv.p50_ms]
    if len(median) > 1:
        path = " ".join(f"{plot.x(x):.1f},{plot.y(y):.1f}" for x, y in median)
        out.append(
            f'<polyline points="{path}" fill="none" stroke="{stroke}" stroke-width="1.4" '
            'stroke-dasharray="5 3"/>'
        )
    if len(tail) > 1:
        path = " ".join(f"{plot.x(x):.1f},{plot.y(y):.1f}" for x, y in tail)
        out.append(f'<polyline points="{path}" fill="none" stroke="{stroke}" stroke-width="2"/>')
    name = escape(curve.experiment)
    for level in curve.levels:
        for value, radius, what in ((level.slo_ms, 3.0, label), (level.p50_ms, 2.0, "P50")):
            if value is None:
                continue
            tip = f"{name}: {level.achieved_qps:,.1f}/s, {what} {value:,.2f} ms"
            out.append(
                f'<circle cx="{plot.x(level.achieved_qps):.1f}" '
                f'cy="{plot.y(min(value, y_high)):.1f}" r="{radius}" fill="{stroke}">'
                f"<title>{tip}</title></circle>"
            )
    knee = curve.knee_qps
    if knee is not None and tail:
        # A knee beyond the curve's levels (found on a level the chart leaves out) sits at the
        # height of the nearest one.
        knee_y = _interpolate(tail, knee)
        if knee_y is None:
            knee_y = min(tail, key=lambda p: abs(p[0] - knee))[1]
        x = plot.x(knee)
        y = plot.y(knee_y)
        out.append(
            f'<path d="M{x:.1f},{y - 7:.1f} L{x - 6:.1f},{y + 4:.1f} L{x + 6:.1f},{y + 4:.1f} Z" '
            f'fill="#fff" stroke="{stroke}" stroke-width="1.8" class="knee">'
            f"<title>{name}: knee at {curve.knee_qps:,.1f}/s</title></path>"
        )
    if curve.capacity_qps is not None:
        x, y = plot.x(curve.capacity_qps), plot.y(slo_ms)
        bottom = plot.top + plot.height
        out.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y:.1f}" y2="{bottom}" stroke="{stroke}" '
            'stroke-width="1.5" stroke-dasharray="2 3"/>'
            f'<path d="M{x:.1f},{y - 6:.1f} L{x + 6:.1f},{y:.1f} L{x:.1f},{y + 6:.1f} '
            f'L{x - 6:.1f},{y:.1f} Z" fill="{stroke}" class="capacity">'
            f"<title>{name}: capacity {curve.capacity_qps:,.1f}/s</title></path>"
            f'<text x="{x + 4:.1f}" y="{bottom - 4}" class="tick" fill="{stroke}">'
            f"{_fmt(curve.capacity_qps)}/s</text>"
        )
    return out


def _sweep_legend(
    curves: Sequence[SweepCurve], left: int, plot_w: int, height: int, label: str
) -> list[str]:
    """A swatch per step, then what each mark means."""
    out = []
    for index, curve in enumerate(curves):
        lx = left + (index % 3) * (plot_w / 3)
        ly = height + 10 + (index // 3) * 18
        text = f"{_clip(curve.experiment)} (sweep {curve.sweep_id})"
        out.append(
            f'<rect x="{lx:.1f}" y="{ly - 9}" width="12" height="4" fill="{colour(index)}"/>'
            f'<text x="{lx + 16:.1f}" y="{ly - 4}" class="legend">{escape(text)}</text>'
        )
    ly = height + 10 + math.ceil(len(curves) / 3) * 18
    key = (
        f"solid: {label}; dashed: P50; △ knee; ◆ capacity (the highest rate that meets the "
        f"SLO); levels beyond {SLO_HEADROOM:g}x the SLO sit on the top edge"
    )
    out.append(f'<text x="{left}" y="{ly - 4}" class="legend">{escape(key)}</text>')
    return out
