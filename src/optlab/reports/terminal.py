"""The stacked-gains table for a terminal (rich), and as plain text for logs and pipes."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
    from rich.table import Table


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _num(value: Any, digits: int = 1) -> str:
    return f"{float(value):,.{digits}f}" if _present(value) else "-"


def _pct(value: Any) -> str:
    return f"{float(value):+.0f}%" if _present(value) else ""


def _mark(row: Any) -> str:
    if not _present(row.get("run_id")):
        return str(row.get("missing") or "no run")
    verdict = "VALID" if row.get("valid") else "INVALID"
    return verdict + (" PROVISIONAL" if row.get("provisional") else "")


def stage_columns(frame: pd.DataFrame) -> list[str]:
    return [c for c in frame.columns if c.endswith("_p50_ms") and c != "p50_ms"]


def rich_table(frame: pd.DataFrame, title: str | None = None) -> Table:
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for header in ("step", "change", "QPS", "Δ cum", "P50 ms", "P99 ms", "Δ cum"):
        table.add_column(header, justify="left" if header in ("step", "change") else "right")
    stages = stage_columns(frame)
    for column in stages:
        table.add_column(column[: -len("_p50_ms")] + " P50", justify="right")
    extras = [
        c
        for c in ("infer_ms_per_request", "mean_batch_size", "accuracy_top1", "cache_hit_rate")
        if c in frame
    ]
    extras = [c for c in extras if frame[c].map(_present).any()]
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
            f"{row['variable']}: {row['change']}" if _present(row.get("change")) else "(baseline)",
            _num(row.get("qps")),
            _pct(row.get("qps_cumulative_pct")),
            _num(row.get("p50_ms"), 2),
            _num(row.get("p99_ms"), 2),
            _pct(row.get("p99_cumulative_pct")),
        ]
        cells += [_num(row.get(c), 2) for c in stages]
        for column in extras:
            value = row.get(column)
            if column in ("mean_batch_size", "infer_ms_per_request"):
                cells.append(_num(value, 2 if column == "infer_ms_per_request" else 1))
            else:
                cells.append(f"{float(value):.1%}" if _present(value) else "-")
        cells.append(_mark(row))
        table.add_row(*cells)
    return table


def render_text(frame: pd.DataFrame, title: str | None = None, width: int = 200) -> str:
    """The rich table as plain text (no colour codes), for logs, pipes and tests."""
    from rich.console import Console

    console = Console(width=width, record=True, color_system=None, force_terminal=False)
    with console.capture() as capture:
        console.print(rich_table(frame, title))
    return capture.get()
