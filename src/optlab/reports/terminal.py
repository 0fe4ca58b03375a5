"""The stacked-gains table for a terminal (rich), and as plain text for logs and pipes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from optlab.reports.export import present

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table


def _num(value: Any, digits: int = 1) -> str:
    return f"{float(value):,.{digits}f}" if present(value) else "-"


def _pct(value: Any) -> str:
    return f"{float(value):+.0f}%" if present(value) else ""


def _mark(row: Any) -> str:
    if not present(row.get("run_id")):
        return "missing: " + str(row.get("missing") or "no run")
    from optlab.reports.markdown import verdict_label

    marks = [verdict_label(row) if present(row.get("verdict")) else ""]
    marks.append("VALID" if row.get("valid") else "INVALID")
    if row.get("provisional"):
        marks.append("PROVISIONAL")
    if row.get("slo_pass") is False:
        marks.append("SLO FAIL")
    return " ".join(m for m in marks if m)


def _step(row: Any, metric: str) -> str:
    """The step's change, with its confidence interval when one was computed."""
    value = row.get(f"{metric}_step_pct")
    low, high = row.get(f"{metric}_step_low_pct"), row.get(f"{metric}_step_high_pct")
    if not present(value):
        return ""
    if present(low) and present(high):
        return f"{float(value):+.0f}% [{float(low):+.0f},{float(high):+.0f}]"
    return f"{float(value):+.0f}%"


def notes(frame: pd.DataFrame) -> list[str]:
    """Flags, INVALID reasons and SLO failures, one line each, for under the table; then
    whether the service's own environment was checked."""
    lines = []
    for _, row in frame.iterrows():
        for label, key in (("flag", "flags"), ("invalid", "reasons"), ("SLO", "slo_failures")):
            items = row.get(key)
            for item in items if isinstance(items, list) else []:
                lines.append(f"{row['experiment']}: {label}: {item}")
    service = (frame.attrs.get("environment") or {}).get("service")
    if service:
        lines.append(f"service environment: {service}")
    return lines


def rich_table(frame: pd.DataFrame, title: str | None = None) -> Table:
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for header in (
        "step",
        "change",
        "QPS",
        "Δ step",
        "Δ cum",
        "P50 ms",
        "Δ step",
        "P99 ms",
        "Δ step",
        "Δ cum",
    ):
        table.add_column(header, justify="left" if header in ("step", "change") else "right")
    from optlab.reports.table import stage_columns

    stages = stage_columns(frame)
    for column in stages:
        table.add_column(column[: -len("_p50_ms")] + " P50", justify="right")
    extras = [
        c
        for c in ("infer_ms_per_request", "mean_batch_size", "accuracy_top1", "cache_hit_rate")
        if c in frame
    ]
    extras = [c for c in extras if frame[c].map(present).any()]
    headers = {
        "infer_ms_per_request": "infer/req",
        "mean_batch_size": "batch",
        "accuracy_top1": "top-1",
        "cache_hit_rate": "cache hit",
    }
    for column in extras:
        table.add_column(headers[column], justify="right")
    table.add_column("verdict")
    for _, row in frame.iterrows():
        cells = [
            str(row["experiment"]),
            f"{row['variable']}: {row['change']}" if present(row.get("change")) else "(baseline)",
            _num(row.get("qps")),
            _step(row, "qps"),
            _pct(row.get("qps_cumulative_pct")),
            _num(row.get("p50_ms"), 2),
            _step(row, "p50"),
            _num(row.get("p99_ms"), 2),
            _step(row, "p99"),
            _pct(row.get("p99_cumulative_pct")),
        ]
        cells += [_num(row.get(c), 2) for c in stages]
        for column in extras:
            value = row.get(column)
            if column in ("mean_batch_size", "infer_ms_per_request"):
                cells.append(_num(value, 2 if column == "infer_ms_per_request" else 1))
            else:
                cells.append(f"{float(value):.1%}" if present(value) else "-")
        cells.append(_mark(row))
        table.add_row(*cells)
    return table


def render_text(frame: pd.DataFrame, title: str | None = None, width: int = 200) -> str:
    """The rich table as plain text (no colour codes), for logs, pipes and tests."""
    from rich.console import Console

    console = Console(width=width, record=True, color_system=None, force_terminal=False)
    with console.capture() as capture:
        console.print(rich_table(frame, title))
        for line in notes(frame):
            console.print(line, markup=False, highlight=False)
    return capture.get()


def print_table(frame: pd.DataFrame, title: str | None = None) -> None:
    """The table and its notes on stdout; piped output is not squeezed to 80 columns."""
    import sys

    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 320)
    console.print(rich_table(frame, title))
    for line in notes(frame):
        console.print(line, markup=False, highlight=False)
