"""What a knob sweep compares its arms by, and how one measured cell reads as that figure.

A run metric reads each cell's run (its figure, and the within-run error of its per-second
windows, `metrics.stats.log_error`); `capacity` reads each cell's capacity sweep (its
estimate, and the error its interval says). Either way a cell becomes the log of its figure
with that log's standard error: `metrics.selection.Arm`'s block entries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from optlab.errors import OptlabError
from optlab.metrics.stats import log_error
from optlab.store import RunRecord, Store, SweepRecord

__all__ = [
    "CAPACITY",
    "METRICS",
    "CellFigure",
    "Metric",
    "capacity_figure",
    "metric",
    "missing",
    "run_figure",
]

CAPACITY = "capacity"
# A capacity interval is read as a 95% normal interval on the log scale.
_Z95 = 1.959963984540054
_LARGE_DF = 1e6


@dataclass(frozen=True)
class Metric:
    name: str
    window: str | None  # the per-second window field; None for capacity
    higher_is_better: bool
    label: str
    unit: str
    streaming: bool = False  # a streaming (openai) target's token figure


METRICS = {
    m.name: m
    for m in (
        Metric("qps", "qps", True, "QPS", "/s"),
        Metric("p50", "p50_ms", False, "P50", " ms"),
        Metric("p99", "p99_ms", False, "P99", " ms"),
        Metric("ttft_p50", "ttft_p50_ms", False, "TTFT P50", " ms", True),
        Metric("ttft_p99", "ttft_p99_ms", False, "TTFT P99", " ms", True),
        Metric("tpot_p50", "tpot_p50_ms", False, "TPOT P50", " ms", True),
        Metric("tpot_p99", "tpot_p99_ms", False, "TPOT P99", " ms", True),
        Metric("tok_s", "output_tps", True, "tok/s", " tok/s", True),
        Metric(CAPACITY, None, True, "capacity", "/s"),
    )
}


def metric(name: str) -> Metric:
    found = METRICS.get(name)
    if found is None:
        raise OptlabError(
            f"--metric {name!r} is not a metric a knob sweep compares",
            hint=f"use one of {', '.join(METRICS)} (capacity needs --slo)",
        )
    return found


@dataclass(frozen=True)
class CellFigure:
    """A measured cell: its figure, the log of it, and that log's error (nan: unknown)."""

    value: float | None
    log: float
    se: float
    df: float
    why: str = ""  # where value is None: why the cell is not a figure ("run 7 INVALID: ...")


def missing(why: str) -> CellFigure:
    """A cell that is not a figure, and why."""
    return CellFigure(None, math.nan, math.nan, math.nan, why)


def _run_value(run: RunRecord, m: Metric) -> float | None:
    if m.name == "qps":
        return run.qps
    s = run.summary
    if s is None:
        return None
    if m.name in ("p50", "p99"):
        value = s.total.p50 if m.name == "p50" else s.total.p99
        return None if value is None else float(value)
    llm = s.llm
    if llm is None:
        return None
    series = {"ttft": llm.ttft_ms, "tpot": llm.tpot_ms}
    if m.name == "tok_s":
        return llm.output_tokens_per_s
    stats = series[m.name.split("_")[0]]
    if stats is None:
        return None
    return stats.p50 if m.name.endswith("p50") else stats.p99


def _first(text: str | None) -> str:
    """A reason's or an error message's first line after ": "; "" without one."""
    lines = (text or "").strip().splitlines()
    return f": {lines[0]}" if lines else ""


def run_figure(store: Store, run: RunRecord | None, m: Metric) -> CellFigure:
    """A run cell: missing (and why) unless the run FINISHED VALID with a positive figure."""
    if run is None:
        return missing("not measured")
    if run.status != "FINISHED":
        return missing(f"run {run.id} {run.status}" + _first(run.error_message))
    if not run.valid:
        first = _first(run.reasons[0] if run.reasons else "")
        more = f" (and {len(run.reasons) - 1} more)" if len(run.reasons) > 1 else ""
        return missing(f"run {run.id} INVALID{first}{more}")
    value = None if m.window is None else _run_value(run, m)
    if m.window is None or value is None or not math.isfinite(value) or value <= 0:
        return missing(f"run {run.id} has no {m.name} figure ({value})")
    series = store.window_series([run.id], [m.window])[run.id][m.window]
    error = log_error(series)
    se, df = error if error is not None else (math.nan, math.nan)
    return CellFigure(float(value), math.log(value), se, df)


def capacity_figure(sweep: SweepRecord | None) -> CellFigure:
    """A capacity cell: missing unless the sweep FINISHED with a capacity (no rate meeting
    the SLO is an answer, but not a figure to compare)."""
    if sweep is None:
        return missing("not measured")
    if sweep.status != "FINISHED" or sweep.result is None:
        return missing(f"sweep {sweep.id} {sweep.status}" + _first(sweep.error_message))
    capacity = sweep.result.capacity_qps
    if capacity is None or capacity <= 0:
        return missing(f"sweep {sweep.id}: no rate met the SLO")
    interval = sweep.result.capacity_interval
    se = math.nan
    if interval is not None and interval[0] > 0 and interval[1] > interval[0]:
        se = (math.log(interval[1]) - math.log(interval[0])) / (2 * _Z95)
    return CellFigure(float(capacity), math.log(capacity), se, _LARGE_DF)
