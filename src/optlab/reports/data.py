"""What the HTML report shows beyond the table, read from the store once, before rendering.

Per step's run: the total-latency CDF decoded from its stored HdrHistogram, its stage P50s, its
per-second windows, its resource samples and its environment fingerprint. Rendering
(`reports.html`) never touches the store, so it is tested with a hand-built `ReportData`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from optlab.diagnose import Diagnosis, diagnose_run
from optlab.metrics.histogram import LatencyHistogram
from optlab.metrics.llm import TPOT, TTFT
from optlab.metrics.stages import is_target_stage

if TYPE_CHECKING:
    from optlab.reports.stacked import StackedTable
    from optlab.store import Store
    from optlab.store.records import ResourceSample, StageStatsRow, WindowStats

# Series the harness records about itself: not stages of the target.

# Percentiles at which the CDF is sampled: dense in the tail, where runs differ most.
CDF_PERCENTILES: tuple[float, ...] = (
    *(float(p) for p in range(0, 90, 5)),
    *(90.0 + 0.5 * i for i in range(18)),
    99.0,
    99.5,
    99.7,
    99.8,
    99.9,
    99.95,
    99.99,
)


@dataclass(frozen=True)
class StepData:
    """One chain step's run, as the charts need it; empty lists where the run has no data."""

    experiment: str
    run_id: int | None
    cdf: list[tuple[float, float]] = field(default_factory=list)  # (percentile, latency ms)
    stages: dict[str, float] = field(default_factory=dict)  # stage -> P50 ms, request order
    windows: list[WindowStats] = field(default_factory=list)  # measure phase, by second
    resources: list[ResourceSample] = field(default_factory=list)  # measure phase
    environment_id: int | None = None
    # A streaming LLM target's TTFT and TPOT CDFs (percentile, ms); empty for other targets.
    ttft_cdf: list[tuple[float, float]] = field(default_factory=list)
    tpot_cdf: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class SweepLevel:
    """One measured level of a sweep: the throughput it achieved and its latency."""

    achieved_qps: float
    p50_ms: float | None
    slo_ms: float | None  # the SLO's percentile (P99 for a P99 SLO)


@dataclass(frozen=True)
class SweepCurve:
    """The sweep that stands for a step in the capacity column, as the latency-vs-throughput
    chart draws it."""

    experiment: str
    sweep_id: int
    levels: list[SweepLevel]  # by achieved throughput
    capacity_qps: float | None
    knee_qps: float | None


@dataclass(frozen=True)
class ReportData:
    steps: list[StepData]
    # environment id -> fingerprint (`optlab.env.collect.collect_fingerprint`'s dict)
    environments: dict[int, dict[str, Any]] = field(default_factory=dict)
    # The swept steps' sweeps (a table with a capacity column), baseline first.
    sweeps: list[SweepCurve] = field(default_factory=list)
    # (step, its run's diagnosis), for each step with a run (docs/diagnose.md).
    diagnoses: list[tuple[str, Diagnosis]] = field(default_factory=list)
    # The documents of the knob sweeps the steps were promoted from (docs/sweep-knob-json.md).
    knob_sweeps: list[dict[str, Any]] = field(default_factory=list)


def cdf_points(encoded: str) -> list[tuple[float, float]]:
    """(percentile, latency ms) pairs of an encoded HdrHistogram; empty when it is empty."""
    histogram = LatencyHistogram.decode(encoded)
    if histogram.count == 0:
        return []
    points = []
    for percentile in CDF_PERCENTILES:
        value = histogram.value_at_percentile_ns(percentile)
        if value is not None:
            points.append((percentile, value / 1e6))
    return points


def stage_p50s(rows: list[StageStatsRow]) -> dict[str, float]:
    """Each target stage's P50 in ms, in the order the store returned them (request order)."""
    return {
        row.stage: float(row.p50_ms)
        for row in rows
        if is_target_stage(row.stage) and row.p50_ms is not None
    }


def sweep_curve(store: Store, experiment: str, sweep_id: int) -> SweepCurve:
    """A stored sweep's levels that measured a throughput, read back as `optlab sweep` shows
    them (`reports.sweep.load_sweep`)."""
    from optlab.reports.sweep import load_sweep  # lazy: the HTML report alone reads levels

    view = load_sweep(store, sweep_id)
    mode = view.record.mode
    levels = sorted(
        (
            SweepLevel(float(row.level.achieved_qps), row.level.p50_ms, row.level.value_ms)
            for row in view.levels
            # An open sweep's one-client level only seeds its first rate: a closed loop's
            # latency has no queue in it, and on the open curve it reads as a dip.
            if row.level.achieved_qps and row.level.failed is None and row.level.mode == mode
        ),
        key=lambda level: level.achieved_qps,
    )
    result = view.result
    return SweepCurve(
        experiment=experiment,
        sweep_id=sweep_id,
        levels=levels,
        capacity_qps=result.capacity_qps if result else None,
        knee_qps=result.knee_qps if result else None,
    )


def collect_report(store: Store, table: StackedTable) -> ReportData:
    """Read, for each row of the stacked table that has a run, what the HTML charts draw."""
    steps: list[StepData] = []
    environments: dict[int, dict[str, Any]] = {}
    diagnoses: list[tuple[str, Diagnosis]] = []
    for row in table.rows:
        experiment, run_id = row.experiment, row.run_id
        if run_id is None:
            steps.append(StepData(experiment=str(experiment), run_id=None))
            continue
        run = store.get_run(run_id)
        stats = store.get_stage_stats(run_id, "measure")
        by_stage = {row.stage: row for row in stats}
        total, ttft, tpot = by_stage.get("total"), by_stage.get(TTFT), by_stage.get(TPOT)
        if run.environment_id is not None and run.environment_id not in environments:
            environments[run.environment_id] = store.get_environment(run.environment_id).fingerprint
        diagnoses.append((str(experiment), diagnose_run(store, run_id)))
        steps.append(
            StepData(
                experiment=str(experiment),
                run_id=run_id,
                cdf=cdf_points(total.histogram) if total and total.count else [],
                stages=stage_p50s(stats),
                windows=store.get_windows(run_id, "measure"),
                resources=store.get_resource_samples(run_id, "measure"),
                environment_id=run.environment_id,
                ttft_cdf=cdf_points(ttft.histogram) if ttft and ttft.count else [],
                tpot_cdf=cdf_points(tpot.histogram) if tpot and tpot.count else [],
            )
        )
    sweeps = [
        sweep_curve(store, row.experiment, row.capacity.capacity_sweep_id)
        for row in table.rows
        if row.capacity is not None and row.capacity.capacity_sweep_id is not None
    ]
    knob_sweeps = [
        result
        for row in table.rows
        if row.knob_sweep is not None
        and (result := store.get_knob_sweep(row.knob_sweep).result) is not None
    ]
    return ReportData(
        steps=steps,
        environments=environments,
        sweeps=sweeps,
        diagnoses=diagnoses,
        knob_sweeps=knob_sweeps,
    )
