"""Hand-built stacked tables for the renderers' tests (`reports.stacked.StackedTable`).

Built from the table's column contract, not by `reports.table.stacked_table`, so the golden
files (tests/golden/stacked*) change only when a renderer does. `golden_table()` has a
baseline, a gain, a trade-off step that is INVALID and fails its SLO, and a missing step;
`capacity_table()` adds the capacity columns; `report_data()` the charts' data of the three
measured steps.
"""

from __future__ import annotations

from typing import Any

from optlab.config.slo import Slo
from optlab.reports.data import CDF_PERCENTILES, ReportData, StepData
from optlab.reports.stacked import (
    COLUMNS,
    CapacitySlo,
    StackedTable,
    StepCapacityRow,
    TableHeader,
    TableRow,
)
from optlab.reports.table_json import EnvironmentInfo
from optlab.store.records import ResourceSample, WindowStats

HOSTILE = "<script>alert(1)</script>"
# The stages the rows recorded, in the table's order; the last holds no value in any row (a
# renderer shows no column for it).
STAGES = ("queue", "preprocess", "infer", "postprocess", "service")
STAGE_COLUMNS = tuple(f"{stage}_p50_ms" for stage in STAGES)
CAPACITY_SLO = Slo("p99", 10.0)


def table_row(**values: Any) -> TableRow:
    """A row with the contract's defaults (a known commit and host, no run); `values` by
    column name, stage P50s as `<stage>_p50_ms`."""
    cells: dict[str, Any] = {"git_commit": "4ecc9ac", "who": "ana@bench1"}
    cells |= dict.fromkeys(STAGE_COLUMNS)
    unknown = set(values) - set(COLUMNS) - set(STAGE_COLUMNS) - set(StepCapacityRow.model_fields)
    assert not unknown, f"not a column of the table: {unknown}"
    return TableRow.from_cells(cells | values)


def measured_row(run_id: int, p50: float, p99: float, qps: float, **values: Any) -> TableRow:
    """A measured step's row: figures derived from its P50, P99 and QPS, `values` on top."""
    measured: dict[str, Any] = dict(
        run_id=run_id, runs=1, status="FINISHED", valid=True, provisional=True,
        p50_ms=p50, p95_ms=p50 * 1.8, p99_ms=p99, p999_ms=p99 * 1.5, qps=qps,
        error_rate=0.0, cpu_pct=92.5, service_cpu_pct=40.0 + 10 * run_id,
        gpu_util_pct=50.0 + run_id, gpu_mem_peak_mib=800.0 + 16 * run_id,
        infer_ms_per_request=p50 * 0.45, cache_hit_rate=0.25 * (run_id - 1),
        queue_p50_ms=p50 * 0.1, preprocess_p50_ms=p50 * 0.3,
        infer_p50_ms=p50 * 0.5, postprocess_p50_ms=p50 * 0.05,
        started_at=f"2026-11-30T10:0{run_id}:00+00:00",
    )  # fmt: skip
    return table_row(**(measured | values))


def header(name: str = "fewer-copies", **values: Any) -> TableHeader:
    """The golden tables' header: a quick protocol on a two-core machine."""
    fields: dict[str, Any] = {
        "head": "int8",
        "protocol": {"name": "quick", "warmup_s": 1.0, "duration_s": 5.0, "provisional": True},
        "protocol_label": "quick (5 s measured, PROVISIONAL)",
        "environment": EnvironmentInfo(
            summary=f"AMD EPYC x2, 24 GiB, Linux 6.18, Python 3.11.7, torch 2.13.0+cpu {name}",
            material_hash="abc123",
            fingerprint={"hardware": {"cpu": {"model": f"AMD EPYC {name}"}}},
        ),
        "confidence": 0.99,
        "stages": STAGES,
    }
    return TableHeader(**(fields | values))


def golden_rows(name: str = "fewer-copies") -> list[TableRow]:
    """Baseline, a gain, a trade-off step that is INVALID and fails its SLO, a missing step."""
    return [
        measured_row(
            1, 4.0, 9.0, 1000.0, experiment="baseline", verdict="baseline", slo_pass=True,
            hypothesis="reference config", accuracy_top1=0.761,
        ),
        measured_row(
            2, 2.5, 6.0, 1500.0, experiment="dynamic-batch", variable="batching",
            change="off -> dynamic (max_batch_size 8)", hypothesis="amortise | overhead\nper call",
            qps_step_pct=50.0, qps_step_low_pct=44.0, qps_step_high_pct=56.0,
            qps_cumulative_pct=50.0, p50_step_pct=-37.5, p50_step_low_pct=-40.0,
            p50_step_high_pct=-35.0, p50_cumulative_pct=-37.5, p99_step_pct=-33.3,
            p99_step_low_pct=-38.0, p99_step_high_pct=-29.0, p99_cumulative_pct=-33.3,
            significant=True, verdict="gain", decided_by=["QPS", "P50", "P99"], slo_pass=True,
            accuracy_top1=0.761, mean_batch_size=5.5,
            qps_cumulative_low_pct=44.0, qps_cumulative_high_pct=56.0,
            p50_cumulative_low_pct=-40.0, p50_cumulative_high_pct=-35.0,
            p99_cumulative_low_pct=-38.0, p99_cumulative_high_pct=-29.0,
            step_confidence=0.99, cumulative_confidence=0.99,
            step_method="Welch t on log within-run spread",
        ),
        measured_row(
            3, 2.2, 12.0, 1800.0, experiment=name, variable="copies",
            change=f"2 -> 1 | {name}", hypothesis=name, valid=False,
            reasons=["error rate 2.0% > 1%", f"bad {name}"],
            qps_step_pct=20.0, qps_step_low_pct=15.0, qps_step_high_pct=25.0,
            qps_cumulative_pct=80.0, p50_step_pct=-12.0, p50_step_low_pct=-15.0,
            p50_step_high_pct=-9.0, p50_cumulative_pct=-45.0, p99_step_pct=100.0,
            p99_step_low_pct=80.0, p99_step_high_pct=120.0, p99_cumulative_pct=33.3,
            significant=True, verdict="regressed", decided_by=["P99"],
            flags=["optimised QPS (+20%), broke P99 (+100%)"], slo_pass=False,
            slo_failures=["p99 12.0 ms > 10 ms"], accuracy_top1=0.760,
            error_rate=0.02, qps_cumulative_low_pct=70.0, qps_cumulative_high_pct=90.0,
            p50_cumulative_low_pct=-50.0, p50_cumulative_high_pct=-40.0,
            p99_cumulative_low_pct=20.0, p99_cumulative_high_pct=46.0,
            step_confidence=1 - 0.01 / 3, cumulative_confidence=0.99,
            step_method="paired t on log-ratios, 3 pairs", knob_sweep=7,
        ),
        table_row(
            experiment="int8", variable="precision", change="fp32 -> int8",
            missing="environment differs materially from the baseline run's: cpu model",
            verdict="missing",
        ),
    ]  # fmt: skip


def golden_table(hostile: bool = False) -> StackedTable:
    """The golden table; `hostile`: the third step's name is a script tag."""
    name = HOSTILE if hostile else "fewer-copies"
    return StackedTable(header=header(name), rows=tuple(golden_rows(name)))


# Each step's capacity under P99 ≤ 10 ms: the baseline's, a gain beyond noise, a step whose
# sweep found none, and the missing step (no sweep).
CAPACITIES = (
    StepCapacityRow(
        capacity_qps=1000.0, capacity_low_qps=950.0, capacity_high_qps=1050.0,
        capacity_knee_qps=800.0, capacity_sweep_id=11, capacity_loop="closed",
    ),
    StepCapacityRow(
        capacity_qps=1500.0, capacity_low_qps=1420.0, capacity_high_qps=1580.0,
        capacity_knee_qps=1300.0, capacity_sweep_id=12, capacity_step_pct=50.0,
        capacity_step_low_pct=38.5, capacity_step_high_pct=62.4, capacity_cumulative_pct=50.0,
        capacity_cumulative_low_pct=38.5, capacity_cumulative_high_pct=62.4,
        capacity_significant=True, capacity_cumulative_significant=True,
        capacity_verdict="gain", capacity_loop="closed",
    ),
    StepCapacityRow(
        capacity_sweep_id=13, capacity_loop="closed",
        capacity_reason="sweep 13 found no capacity: P99 above 10 ms at 1 client",
    ),
    StepCapacityRow(
        capacity_reason="no sweep under P99 ≤ 10 ms: run `optlab sweep int8 --slo p99=10ms`",
    ),
)  # fmt: skip


def capacity_table() -> StackedTable:
    """The golden table with the capacity column under P99 ≤ 10 ms, closed loop."""
    table = golden_table()
    slo = CapacitySlo(
        slo=CAPACITY_SLO, protocol_label="quick (5 s measured, PROVISIONAL)", loop="closed"
    )
    rows = tuple(
        row.model_copy(update={"capacity": capacity})
        for row, capacity in zip(table.rows, CAPACITIES, strict=True)
    )
    return StackedTable(header=table.header.model_copy(update={"capacity": slo}), rows=rows)


def report_data(hostile: bool = False) -> ReportData:
    """Deterministic charts data for the golden table's three measured steps (the fourth has
    none)."""
    name = HOSTILE if hostile else "fewer-copies"
    steps = []
    for run_id, (experiment, p50, qps) in enumerate(
        (("baseline", 4.0, 1000.0), ("dynamic-batch", 2.5, 1500.0), (name, 2.2, 1800.0)), 1
    ):
        cdf = [(p, p50 * (1 + 3 * (p / 100) ** 8)) for p in CDF_PERCENTILES]
        windows = [
            WindowStats("measure", t, int(qps), 0, qps + 20 * ((t * 7 + run_id) % 5 - 2),
                        p50, p50 * (2.2 + 0.1 * (t % 3)))
            for t in range(5)
        ]  # fmt: skip
        resources = [
            ResourceSample("measure", 1.0 + 0.5 * i, cpu_process_pct=150.0 + 10 * run_id + i,
                           rss_bytes=(300 + 20 * run_id) * 2**20)
            for i in range(10)
        ]  # fmt: skip
        stages = {"queue": p50 * 0.1, "preprocess": p50 * 0.3, "infer": p50 * 0.5,
                  "postprocess": p50 * 0.05}  # fmt: skip
        steps.append(StepData(experiment, run_id, cdf, stages, windows, resources, 1))
    steps.append(StepData("int8", None))
    fingerprint = {
        "hardware": {"cpu": {"model": f"AMD EPYC {name}", "logical_cores": 2},
                     "gpus": [], "memory": {"total_bytes": 25276510208}},
        "software": {"python": {"version": "3.11.7"}, "packages": {"torch": "2.13.0+cpu"}},
        "runtime": {"load_avg": [0.5, 1.0, 1.25]},
    }  # fmt: skip
    return ReportData(steps=steps, environments={1: fingerprint})


def markdown_rows(text: str) -> list[str]:
    """The lines of a markdown rendering that belong to its table."""
    return [line for line in text.splitlines() if line.startswith("|")]


def markdown_cells(line: str) -> int:
    """Cell boundaries of a markdown table line: each `|` not escaped by a backslash."""
    return sum(1 for i, ch in enumerate(line) if ch == "|" and (i == 0 or line[i - 1] != "\\"))
