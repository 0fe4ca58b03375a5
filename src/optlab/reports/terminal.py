"""The stacked-gains table for a terminal (rich), and as plain text for logs and pipes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from optlab.reports.export import present
from optlab.reports.format import (
    change_text,
    number,
    percent,
    rate,
    stage_name,
    step_delta,
    verdict_label,
)
from optlab.reports.table import stage_columns

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table


def _num(value: Any, digits: int = 1) -> str:
    return number(value, digits, missing="-")


def _mark(row: Any) -> str:
    if not present(row.get("run_id")):
        return "missing: " + str(row.get("missing") or "no run")
    marks = [verdict_label(row) if present(row.get("verdict")) else ""]
    marks.append("VALID" if row.get("valid") else "INVALID")
    if row.get("provisional"):
        marks.append("PROVISIONAL")
    if row.get("slo_pass") is False:
        marks.append("SLO FAIL")
    return " ".join(m for m in marks if m)


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
    stages = stage_columns(frame)
    for column in stages:
        table.add_column(stage_name(column) + " P50", justify="right")
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
            change_text(row),
            _num(row.get("qps")),
            step_delta(row, "qps", digits=0, tight=True),
            percent(row.get("qps_cumulative_pct"), 0),
            _num(row.get("p50_ms"), 2),
            step_delta(row, "p50", digits=0, tight=True),
            _num(row.get("p99_ms"), 2),
            step_delta(row, "p99", digits=0, tight=True),
            percent(row.get("p99_cumulative_pct"), 0),
        ]
        cells += [_num(row.get(c), 2) for c in stages]
        for column in extras:
            value = row.get(column)
            if column in ("mean_batch_size", "infer_ms_per_request"):
                cells.append(_num(value, 2 if column == "infer_ms_per_request" else 1))
            else:
                cells.append(rate(value, missing="-"))
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
