"""The stacked-gains report as ONE self-contained HTML file: no script, no external URL.

The table, latency CDFs per step, a stage waterfall per step, QPS / P99 / resource time series
and the environment panorama, all inline SVG drawn by `reports.charts`. Every user-supplied
string (names, hypotheses, changes, reasons, environment values) goes through `html.escape`.
"""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING, Any

from optlab.reports.charts import Series, latency_throughput_chart, line_chart, stage_waterfall
from optlab.reports.data import ReportData, StepData, collect_report
from optlab.reports.diagnose import render_diagnosis_html
from optlab.reports.export import plain, present
from optlab.reports.format import (
    capacity_label,
    capacity_value,
    change_text,
    cumulative_delta,
    goodput_text,
    number,
    percent,
    rate,
    stage_name,
    step_delta,
    verdict_label,
    verdict_of,
)
from optlab.reports.markdown import (
    head_name,
    note_marks,
    stage_columns,
)
from optlab.reports.stacked import LLM_COLUMNS, LLM_DELTA_METRICS

if TYPE_CHECKING:
    from optlab.reports.stacked import StackedTable, TableRow

__all__ = ["ReportData", "collect_report", "render_html"]

_CSS = """
body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:24px auto;
padding:0 8px;color:#1b1f24}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid
#d0d7de;padding-bottom:4px}.meta{color:#57606a;margin:2px 0}
table{border-collapse:collapse;font-variant-numeric:tabular-nums}table.stacked{font-size:12px}
th,td{border:1px solid #d0d7de;padding:3px 6px;vertical-align:top}
td.name{white-space:nowrap}td.change{min-width:140px;max-width:220px}small{color:#57606a}
th{background:#f6f8fa;font-weight:600}td.n{text-align:right;white-space:nowrap}
.scroll{overflow-x:auto}tr.gain td.v{background:#dafbe1}tr.regressed td.v{background:#ffebe9}
tr.missing td{color:#8c959f;background:#fafbfc}td.v{font-weight:600;min-width:90px}
.bad{color:#cf222e}.charts{display:flex;flex-wrap:wrap;gap:18px}
svg.chart{background:#fff;border:1px solid #eaeef2}svg .title{font-weight:600;font-size:13px}
svg .tick,svg .legend{font-size:11px;fill:#424a53}svg .axis{font-size:12px;fill:#424a53}
svg .grid{stroke:#eaeef2}svg .frame{fill:none;stroke:#afb8c1}svg .empty{fill:#8c959f}
svg .note{font-size:12px;fill:#1b1f24}ol.notes li{margin:2px 0}
table.env td:first-child{font-family:ui-monospace,monospace;color:#57606a}
td.diff{background:#fff8c5}
"""


def _e(value: Any) -> str:
    return escape("" if value is None else str(value), quote=True)


def _cell(text: str, numeric: bool = False, cls: str = "") -> str:
    classes = " ".join(c for c in ("n" if numeric else "", cls) if c)
    return f'<td class="{classes}">{text}</td>' if classes else f"<td>{text}</td>"


# Optional columns after the latency figures, (column, header), each shown when it says something.
_EXTRAS = (
    ("error_rate", "errors"),
    ("cpu_pct", "CPU %"),
    ("service_cpu_pct", "service CPU %"),
    ("gpu_util_pct", "GPU %"),
    ("gpu_mem_peak_mib", "GPU MiB"),
    ("mean_batch_size", "batch"),
    ("cache_hit_rate", "cache hit"),
    ("accuracy_top1", "top-1"),
    *LLM_COLUMNS,
)
_RATES = ("error_rate", "cache_hit_rate", "accuracy_top1", "goodput")


def _shown(table: StackedTable, column: str) -> bool:
    """Whether an optional column holds a value worth a column in some row."""
    values = [row.get(column) for row in table.rows]
    if column == "error_rate":  # a column of zeros says nothing a reviewer needs
        return any(present(v) and v != 0 for v in values)
    return any(present(v) for v in values)


def _table(table: StackedTable) -> tuple[str, list[str]]:
    """The stacked table and its numbered notes (already escaped)."""
    stages = stage_columns(table)
    extras = [(c, h) for c, h in _EXTRAS if _shown(table, c)]
    slo = capacity_label(table.header)
    out = _table_head(stages, [h for _, h in extras], slo)
    notes: dict[str, int] = {}
    for row in table.rows:
        verdict = verdict_of(row)
        cells = _figure_cells(row, stages, [c for c, _ in extras], slo is not None)
        cells.insert(2, _verdict_cell(row, note_marks(row, notes, _note_html)))
        css = verdict.replace(" ", "-") if verdict in ("gain", "regressed", "missing") else ""
        out.append(f'<tr class="{_e(css)}">' + "".join(cells) + "</tr>")
    out.append("</tbody></table></div>")
    return "".join(out), [f"{note}" for note in notes]


def _table_head(stages: list[str], extras: list[str], slo: str | None = None) -> list[str]:
    """The table's opening and its header: the stage P50s grouped under one spanning header."""
    headers = ["step", "change", "verdict", "QPS", "P50 ms", "P95 ms", "P99 ms", "P99.9 ms"]
    if slo is not None:
        headers.append(f"capacity/s @ {slo}")
    after = [*extras, "SLO"]
    out = ['<div class="scroll"><table class="stacked"><thead><tr>']
    span = ' rowspan="2"' if stages else ""
    out += [f"<th{span}>{_e(h)}</th>" for h in headers]
    if stages:
        out.append(f'<th colspan="{len(stages)}">stage P50 ms</th>')
    out += [f"<th{span}>{_e(h)}</th>" for h in after]
    if stages:
        out.append("</tr><tr>")
        out += [f"<th>{_e(stage_name(c))}</th>" for c in stages]
    out.append("</tr></thead><tbody>")
    return out


def _figure_cells(
    row: TableRow, stages: list[str], extras: list[str], capacity: bool = False
) -> list[str]:
    """A row's cells but its verdict: the step, its change, its figures and its SLO."""
    cells = [
        _cell(f"<b>{_e(row.experiment)}</b>", cls="name"),
        _cell(change_text(row, _e), cls="change"),
        _cell(number(row.qps) + _delta(row, "qps"), True),
        _cell(number(row.p50_ms, 2) + _delta(row, "p50"), True),
        _cell(number(row.p95_ms, 2), True),
        _cell(number(row.p99_ms, 2) + _delta(row, "p99"), True),
        _cell(number(row.p999_ms, 2), True),
    ]
    if capacity:
        cells.append(_cell(_e(capacity_value(row)) + _capacity_delta(row), True))
    cells += [_cell(number(row.get(c), 2), True) for c in stages]
    for column in extras:
        value: Any = row.get(column)
        text = rate(value) if column in _RATES else number(value, 1)
        if column == "goodput":
            text = _e(goodput_text(row))
        elif column.removesuffix("_ms") in LLM_DELTA_METRICS:
            text = _e(text) + _delta(row, column.removesuffix("_ms"))
        cells.append(_cell(text, True))
    slo = row.slo_pass
    cells.append(
        _cell("pass" if slo is True else '<span class="bad">fail</span>' if slo is False else "–")
    )
    return cells


def _note_html(step: Any, note: str) -> str:
    return _e(note) if step is None else f"<b>{_e(step)}</b>: {_e(note)}"


def _verdict_cell(row: TableRow, marks: list[int]) -> str:
    words = [_e(verdict_label(row))]
    if row.valid is False:
        words.append('<span class="bad">INVALID</span>')
    if row.provisional:
        words.append("PROVISIONAL")
    refs = "".join(f"<sup>[{n}]</sup>" for n in sorted(set(marks)))
    return _cell(" ".join(words) + refs, cls="v")


def _delta(row: TableRow, prefix: str) -> str:
    """Under a value: its step change with the interval, and its cumulative change."""
    lines = []
    step = step_delta(row, prefix)
    if step:
        lines.append(f"step {step}")
    cumulative = percent(row.get(f"{prefix}_cumulative_pct"))
    if cumulative and row.verdict != "baseline":  # +0% against itself says nothing
        lines.append(f"cum {cumulative}")
    return "".join(f"<br><small>{_e(line)}</small>" for line in lines)


def _capacity_delta(row: TableRow) -> str:
    """Under a capacity: its change against the parent (beyond noise or not) and the baseline."""
    lines = []
    step = step_delta(row, "capacity")
    if step:
        significant = row.get("capacity_significant")
        noise = ""
        if isinstance(significant, bool):
            noise = ", beyond noise" if significant else ", within noise"
        lines.append(f"step {step}{noise}")
    cumulative = cumulative_delta(row, "capacity")
    if cumulative:
        lines.append(f"cum {cumulative}")
    return "".join(f"<br><small>{_e(line)}</small>" for line in lines)


def _steps_detail(table: StackedTable) -> str:
    """Who ran each step, when, from which commit, and what its hypothesis was."""
    out = ["<table><thead><tr>"]
    out += [f"<th>{h}</th>" for h in ("step", "hypothesis", "run", "runs", "who", "when", "commit")]
    out.append("</tr></thead><tbody>")
    for row in table.rows:
        out.append(
            "<tr>"
            + "".join(
                f"<td>{_e(v) if present(v) else '–'}</td>"
                for v in (
                    row.experiment,
                    row.hypothesis,
                    f"#{row.run_id}" if row.run_id is not None else None,
                    row.runs,
                    row.who,
                    row.started_at,
                    row.git_commit[:10] if row.git_commit else None,
                )
            )
            + "</tr>"
        )
    out.append("</tbody></table>")
    return "".join(out)


def _nines(percentile: float) -> float:
    """x position of a percentile on a "number of nines" axis: 90% -> 1, 99% -> 2, 99.9% -> 3."""
    return -math.log10(max(1.0 - percentile / 100.0, 1e-6))


_NINES_TICKS = [(0.0, "0%"), (_nines(50), "50%"), (1.0, "90%"), (2.0, "99%"), (3.0, "99.9%"),
                (4.0, "99.99%")]  # fmt: skip


def _series(steps: list[StepData], pick: Any) -> list[Series]:
    series: list[Series] = []
    for step in steps:
        points = pick(step)
        if points:
            series.append((step.experiment, points))
    return series


def _windows(step: StepData, field: str) -> list[tuple[float, float]]:
    if not step.windows:
        return []
    start = step.windows[0].t_s
    return [
        (float(w.t_s - start), float(getattr(w, field)))
        for w in step.windows
        if getattr(w, field) is not None
    ]


def _resource(step: StepData, field: str) -> list[tuple[float, float]]:
    if not step.resources:
        return []
    start = step.resources[0].t_s
    points = []
    for sample in step.resources:
        if field == "gpu_util_pct":
            utils = [g.util_pct for g in sample.gpus or () if g.util_pct is not None]
            value = sum(utils) / len(utils) if utils else None
        else:
            value = getattr(sample, field)
        if value is not None:
            points.append((sample.t_s - start, float(value)))
    return points


def _mib(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    return [(t, v / 2**20) for t, v in points]


def _charts(table: StackedTable, data: ReportData) -> str:
    steps = data.steps
    cdf = line_chart(
        "Total latency by percentile (log tail)",
        _series(steps, lambda s: [(_nines(p), ms) for p, ms in s.cdf]),
        x_label="percentile",
        y_label="latency ms",
        x_ticks=_NINES_TICKS,
        width=900,
        height=360,
    )
    by_name = {s.experiment: s for s in steps}
    stage_rows = []
    table_stages = stage_columns(table)
    for row in table.rows:
        name = row.experiment
        step = by_name.get(name)
        stages = dict(step.stages) if step and step.stages else {}
        if not stages and row.measured:
            stages = {stage_name(c): float(row[c]) for c in table_stages if present(row.get(c))}
        stage_rows.append((name, stages))
    waterfall = stage_waterfall("Stage P50s per step (ms), and the stage each change moved",
                                stage_rows)  # fmt: skip
    seconds = "seconds into the measured phase"
    series = [
        line_chart("QPS per second", _series(steps, lambda s: _windows(s, "qps")),
                   x_label=seconds, y_label="requests/s"),
        line_chart("P99 per second", _series(steps, lambda s: _windows(s, "p99_ms")),
                   x_label=seconds, y_label="ms"),
    ]  # fmt: skip
    # A service optlab started (a `command` target) does the step's work in its own process
    # tree: its CPU and RSS over time sit beside optlab's own, pair by pair.
    service_cpu = _series(steps, lambda s: _resource(s, "service_cpu_pct"))
    service_rss = _series(steps, lambda s: _mib(_resource(s, "service_rss_bytes")))
    whose = ", optlab" if service_cpu or service_rss else ""
    cpu = _series(steps, lambda s: _resource(s, "cpu_process_pct"))
    series.append(line_chart(f"Process CPU{whose and ' (optlab)'}", cpu, x_label=seconds,
                             y_label="% of one core"))  # fmt: skip
    if service_cpu:
        series.append(line_chart("Service CPU (its process tree)", service_cpu, x_label=seconds,
                                 y_label="% of one core"))  # fmt: skip
    rss = _series(steps, lambda s: _mib(_resource(s, "rss_bytes")))
    if rss:
        series.append(line_chart(f"Process memory (RSS{whose})", rss, x_label=seconds,
                                 y_label="MiB"))  # fmt: skip
    if service_rss:
        series.append(line_chart("Service memory (RSS of its process tree)", service_rss,
                                 x_label=seconds, y_label="MiB"))  # fmt: skip
    gpu = _series(steps, lambda s: _resource(s, "gpu_util_pct"))
    if gpu:
        series.append(line_chart("GPU utilisation", gpu, x_label="seconds", y_label="%"))
    capacity = _capacity_chart(table, data)
    return (
        capacity
        + f'<h2>Latency distribution</h2><div class="charts">{cdf}</div>'
        + _llm_charts(steps, seconds)
        + f'<h2>Stage waterfall</h2><div class="charts">{waterfall}</div>'
        f'<h2>Time series</h2><div class="charts">{"".join(series)}</div>'
    )


def _llm_charts(steps: list[StepData], seconds: str) -> str:
    """A streaming chain's token figures: TTFT and TPOT by percentile, and TTFT P99 and
    output tokens/s per second; "" when no step streamed."""
    if not any(step.ttft_cdf for step in steps):
        return ""

    def cdf(title: str, pick: Any) -> str:
        return line_chart(
            title,
            _series(steps, lambda s: [(_nines(p), ms) for p, ms in pick(s)]),
            x_label="percentile",
            y_label="ms",
            x_ticks=_NINES_TICKS,
        )

    charts = [
        cdf("Time to first token by percentile", lambda s: s.ttft_cdf),
        cdf("Time per output token by percentile", lambda s: s.tpot_cdf),
        line_chart("TTFT P99 per second", _series(steps, lambda s: _windows(s, "ttft_p99_ms")),
                   x_label=seconds, y_label="ms"),
        line_chart("Output tokens per second", _series(steps, lambda s: _windows(s, "output_tps")),
                   x_label=seconds, y_label="tokens/s"),
    ]  # fmt: skip
    return f'<h2>Tokens (streaming LLM)</h2><div class="charts">{"".join(charts)}</div>'


def _capacity_chart(table: StackedTable, data: ReportData) -> str:
    """Latency against throughput of the swept steps' sweeps; "" when the table judges no
    capacity (a report without sweeps is unchanged)."""
    if table.header.capacity is None:
        return ""
    slo = table.header.capacity.slo
    chart = latency_throughput_chart(
        f"Latency against throughput, per step's sweep ({slo.label})",
        data.sweeps,
        slo_ms=slo.ms,
        slo_label=slo.label,
        percentile_label=slo.percentile.upper(),
    )
    return f'<h2>Capacity under {_e(slo.label)}</h2><div class="charts">{chart}</div>'


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        out: list[tuple[str, str]] = []
        for key, item in value.items():
            out += _flatten(item, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        return [pair for i, v in enumerate(value) for pair in _flatten(v, f"{prefix}[{i}]")]
    if isinstance(value, list):
        return [(prefix, ", ".join(str(plain(v)) for v in value) or "[]")]
    value = plain(value)
    if prefix.endswith("_bytes") and isinstance(value, int):
        return [(prefix, f"{value / 2**30:,.1f} GiB ({value:,} bytes)")]
    return [(prefix, "–" if value is None else str(value))]


def _environment(table: StackedTable, data: ReportData) -> str:
    """One column per distinct environment the chain's runs used; differing rows highlighted."""
    columns: list[tuple[str, dict[str, Any]]] = []
    for env_id, fingerprint in data.environments.items():
        users = [s.experiment for s in data.steps if s.environment_id == env_id]
        columns.append((f"env #{env_id}: " + ", ".join(users), fingerprint))
    if not columns:
        head_fp = table.header.environment.fingerprint
        if head_fp:
            columns.append(("head's environment", head_fp))
    if not columns:
        return "<p>No environment fingerprint recorded.</p>"
    flat = [dict(_flatten(fp)) for _, fp in columns]
    keys: list[str] = []
    for mapping in flat:
        keys += [k for k in mapping if k not in keys]
    out = ['<div class="scroll"><table class="env"><thead><tr><th>property</th>']
    out += [f"<th>{_e(label)}</th>" for label, _ in columns]
    out.append("</tr></thead><tbody>")
    for key in keys:
        values = [m.get(key, "–") for m in flat]
        diff = ' class="diff"' if len(set(values)) > 1 else ""
        out.append(f"<tr><td>{_e(key)}</td>" + "".join(f"<td{diff}>{_e(v)}</td>" for v in values))
        out.append("</tr>")
    out.append("</tbody></table></div>")
    return "".join(out)


def _knob_sweeps(documents: list[dict[str, Any]]) -> str:
    """The knob-response chart of each sweep a step was promoted from, with its sentence."""
    from optlab.reports.knob import knob_chart_svg, render_knob

    out = ["<h2>Knob sweeps</h2>"]
    for doc in documents:
        out.append(
            f"<h3>sweep-knob {_e(doc.get('knob_sweep_id'))}: {_e(doc['knob'])} of "
            f"{_e(doc['experiment'])}</h3>"
        )
        out.append(f"<p>{_e(doc['sentence'])}</p>")
        out.append(knob_chart_svg(doc))
        out.append(f"<pre>{_e(render_knob(doc))}</pre>")
    return "\n".join(out)


def render_html(stacked: StackedTable, data: ReportData) -> str:
    """The whole report as one HTML document (inline CSS and SVG, no script, no URL)."""
    header = stacked.header
    head = head_name(stacked)
    table, notes = _table(stacked)
    protocol = header.protocol_label or (header.protocol or {}).get("name")
    environment = header.environment.summary
    confidence = header.confidence
    meta = [
        f"<b>Protocol:</b> {_e(protocol or 'not recorded')}",
        f"<b>Environment:</b> {_e(environment or 'not recorded')}",
    ]
    if present(confidence):
        meta.append(
            f"step: change against the previous measured step, [interval] at "
            f"{float(confidence) * 100:g}% confidence; cum: change against the baseline."
        )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>optlab: {_e(head)}</title>",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<style>{_CSS}</style></head><body>",
        f"<h1>optlab stacked gains: {_e(head)}</h1>",
        *(f'<p class="meta">{line}</p>' for line in meta),
        "<h2>Stacked gains</h2>",
        table,
    ]
    if notes:
        parts.append('<ol class="notes">' + "".join(f"<li>{n}</li>" for n in notes) + "</ol>")
    parts += [
        "<h2>Steps</h2>",
        _steps_detail(stacked),
        *([diagnosed] if (diagnosed := render_diagnosis_html(data.diagnoses)) else []),
        _charts(stacked, data),
        *([_knob_sweeps(data.knob_sweeps)] if data.knob_sweeps else []),
        "<h2>Environment</h2>",
        _environment(stacked, data),
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"
