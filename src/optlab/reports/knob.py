"""A knob sweep as text, markdown and a chart: each value's figure and its change against the
parent with the interval, the winner or the tie, and the sentence (docs/sweep-knob-json.md is
the document they are rendered from)."""

from __future__ import annotations

import html
from typing import Any

from optlab.knobs.decision import unjudged

__all__ = ["knob_chart_svg", "render_knob", "render_knob_list", "render_knob_markdown"]


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _figure(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:,.1f}" if abs(x) >= 10 else f"{x:,.3g}"


def _interval(row: dict[str, Any]) -> str:
    if row["control"]:
        return "parent"
    if row["interval"] is None:
        return "no interval" if row["effect_pct"] is None else f"{row['effect_pct']:+.1f}%"
    low, high = row["interval"]
    return f"{row['effect_pct']:+.1f}% [{low:+.1f}, {high:+.1f}]"


def _mark(doc: dict[str, Any], row: dict[str, Any]) -> str:
    from optlab.knobs.spec import value_key as canonical_json

    key = canonical_json(row["value"])
    if doc["winner"] is not None and canonical_json(doc["winner"]) == key:
        return "WINNER"
    marks = []
    if any(canonical_json(v) == key for v in doc["tie"]):
        marks.append("tie")
    if doc["chosen"] is not None and canonical_json(doc["chosen"]) == key and doc["winner"] is None:
        marks.append(f"chosen ({doc['tie_break']})")
    if row["better"] and not row["control"]:
        marks.append("beats parent")
    return ", ".join(marks)


def _rows(doc: dict[str, Any]) -> list[tuple[str, str, str, str, str]]:
    return [
        (
            _value(r["value"]),
            _figure(r["estimate"]),
            _interval(r),
            str(r["blocks"]),
            _mark(doc, r),
        )
        for r in doc["values"]
    ]


def _header(doc: dict[str, Any]) -> str:
    status = doc.get("status", "FINISHED")
    return (
        f"sweep-knob {doc.get('knob_sweep_id', '?')}: {doc['experiment']} {doc['knob']} "
        f"(parent {doc['knob']} = {_value(doc['parent_value'])}), {doc['metric']} "
        f"({'higher' if doc['higher_is_better'] else 'lower'} is better), "
        f"{doc.get('blocks', '?')} blocks, {status}, {doc.get('measured_s', 0):,.0f} s measured"
    )


def render_knob(doc: dict[str, Any]) -> str:
    """Terminal text: a table of values, then the answer."""
    head = ("value", doc["metric"], "vs parent [95%]", "blocks", "")
    rows = [head, *_rows(doc)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = [_header(doc)]
    for r in rows:
        lines.append(
            "  "
            + "  ".join(
                c.rjust(w) if i in (1, 3) else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            ).rstrip()
        )
    lines.append(doc["sentence"])
    lines += [f"not judged: {line}" for line in unjudged(doc)]
    if doc.get("promoted"):
        lines.append(f"promoted: {doc['promoted']}")
    return "\n".join(lines)


BAR_WIDTH = 20


def _bar(row: dict[str, Any], scale: float) -> str:
    """The knob-response chart as text: the change against the parent as a bar, left of the
    parent's line when negative; `·` where the interval reaches beyond the bar."""
    effect: float | None = row["effect_pct"]
    if row["control"] or effect is None or scale <= 0:
        return "|" if row["control"] else ""
    cells = round(abs(effect) / scale * BAR_WIDTH)
    reach = cells
    if row["interval"] is not None:
        far = max(abs(row["interval"][0]), abs(row["interval"][1]))
        reach = min(BAR_WIDTH, round(far / scale * BAR_WIDTH))
    bar = "█" * cells + "·" * max(0, reach - cells)
    return (bar[::-1] + "|") if effect < 0 else ("|" + bar)


def render_knob_markdown(doc: dict[str, Any]) -> str:
    """A PR comment: the values with their figures, changes and intervals, the response as
    text bars (the HTML report draws it), and the sentence."""
    ends = [
        abs(x)
        for r in doc["values"]
        for x in ([*(r["interval"] or []), r["effect_pct"] or 0.0] if not r["control"] else [])
    ]
    scale = max(ends, default=0.0)
    lines = [
        f"**{html.escape(_header(doc))}**",
        "",
        f"| {doc['knob']} | {doc['metric']} | vs parent [95%] | blocks | | response |",
        "|---|---:|---|---:|---|---|",
    ]
    for row, cells in zip(doc["values"], _rows(doc), strict=True):
        bar = _bar(row, scale)
        shown = (*cells, f"`{bar}`" if bar else "")
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in shown) + " |")
    lines += ["", doc["sentence"]]
    lines += [f"- not judged: {html.escape(line)}" for line in unjudged(doc)]
    return "\n".join(lines)


def render_knob_list(docs: list[dict[str, Any]]) -> str:
    """One line a sweep: its answer (the winner, or the tie), the values not judged, the
    status; a sweep with no result yet (running, or its process gone) says so."""
    lines = []
    for doc in docs:
        if "sentence" not in doc:
            answer = "no result yet"
        elif doc["winner"] is not None:
            answer = str(doc["winner"])
        else:
            answer = f"tie {doc['tie']}" if doc["tie"] else "no answer"
        if doc.get("unmeasured"):
            answer += f"; not judged: {', '.join(str(v) for v in doc['unmeasured'])}"
        lines.append(
            f"{doc.get('knob_sweep_id')}: {doc['experiment']} {doc['knob']} by {doc['metric']}: "
            f"{answer} ({doc.get('status')})"
        )
    return "\n".join(lines)


_UNITS = {"qps": "/s", "capacity": "/s", "tok_s": " tok/s"}
_UNITS |= {m: " ms" for m in ("p50", "p99", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")}


def knob_chart_svg(doc: dict[str, Any], width: int = 560, height: int = 260) -> str:
    """The knob-response chart: each value's change against the parent (%) with its 95%
    interval as a bar and its figure beside it, the parent's zero line; the winner (or the
    tie-break's pick) green, other values better beyond noise blue, worse beyond noise red."""
    rows = doc["values"]
    pad_l, pad_r, pad_t, pad_b = 56, 16, 28, 44
    lows = [r["interval"][0] if r["interval"] else (r["effect_pct"] or 0.0) for r in rows]
    highs = [r["interval"][1] if r["interval"] else (r["effect_pct"] or 0.0) for r in rows]
    top = max([0.0, *highs]) * 1.1 + 1
    bottom = min([0.0, *lows]) * 1.1 - 1
    plot_w, plot_h = width - pad_l - pad_r, height - pad_t - pad_b

    def y(v: float) -> float:
        return pad_t + (top - v) / (top - bottom) * plot_h

    step = plot_w / max(1, len(rows))
    from optlab.knobs.spec import value_key as canonical_json

    pick = doc["winner"] if doc["winner"] is not None else doc["chosen"]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'role="img" aria-label="{html.escape(doc["knob"])} response">',
        f'<text x="{pad_l}" y="16" font-size="12" font-family="sans-serif">'
        f"{html.escape(doc['metric'])} vs parent (%), 95% interval, by {html.escape(doc['knob'])}"
        "</text>",
        f'<line x1="{pad_l}" x2="{width - pad_r}" y1="{y(0):.1f}" y2="{y(0):.1f}" '
        'stroke="#888" stroke-dasharray="4 3"/>',
    ]
    ticks = [0.0]
    for tick in (top, bottom):  # the ends, where they do not crowd the zero line
        if abs(y(tick) - y(0.0)) >= 14:
            ticks.append(tick)
    for tick in ticks:
        parts.append(
            f'<text x="{pad_l - 6}" y="{y(tick) + 4:.1f}" font-size="10" text-anchor="end" '
            f'font-family="sans-serif">{tick:+.0f}%</text>'
        )
    unit = _UNITS.get(doc["metric"], "")
    for i, r in enumerate(rows):
        cx = pad_l + step * (i + 0.5)
        chosen = pick is not None and canonical_json(r["value"]) == canonical_json(pick)
        worse = r["significant"] and not r["better"] and not r["control"]
        colour = "#2a7" if chosen else "#36c" if r["better"] else "#c33" if worse else "#999"
        if r["interval"]:
            parts.append(
                f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(r["interval"][1]):.1f}" '
                f'y2="{y(r["interval"][0]):.1f}" stroke="{colour}" stroke-width="3"/>'
            )
        effect = r["effect_pct"]
        if effect is not None:
            parts.append(f'<circle cx="{cx:.1f}" cy="{y(effect):.1f}" r="5" fill="{colour}"/>')
            # The figure itself beside its point: value -> metric, as the table says it.
            parts.append(
                f'<text x="{cx + 8:.1f}" y="{y(effect) - 6:.1f}" font-size="10" '
                f'font-family="sans-serif" fill="#333">{_figure(r["estimate"])}{unit}</text>'
            )
        parts.append(
            f'<text x="{cx:.1f}" y="{height - pad_b + 16}" font-size="11" text-anchor="middle" '
            f'font-family="sans-serif">{html.escape(_value(r["value"]))}'
            f"{' (parent)' if r['control'] else ''}</text>"
        )
    parts.append(
        f'<text x="{pad_l + plot_w / 2:.1f}" y="{height - 8}" font-size="11" '
        f'text-anchor="middle" font-family="sans-serif">{html.escape(doc["knob"])}</text>'
    )
    parts.append("</svg>")
    return "".join(parts)
