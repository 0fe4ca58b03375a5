"""Rows to records (and GPU samples to JSON): the only place that reads ORM attributes
on behalf of callers, so the record shapes and the table shapes can evolve separately.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict
from typing import Any

from optlab.store.models import (
    SqlConfig,
    SqlExperiment,
    SqlResourceSample,
    SqlRun,
    SqlStageStats,
    SqlWindow,
)
from optlab.store.reasons import reasons_of
from optlab.store.records import (
    ExperimentRecord,
    GpuSample,
    ResourceSample,
    RunErrorCount,
    RunRecord,
    StageStatsRow,
    StoredConfig,
    WindowStats,
)
from optlab.store.summary import LatencyStats, RunSummary, from_stored, stored_form


def stored_config(row: SqlConfig, experiment: str) -> StoredConfig:
    return StoredConfig(
        id=row.id,
        experiment=experiment,
        config=row.config_json,
        config_hash=row.config_hash,
        change=row.change_json,
        variable=row.variable,
        parent_config_hash=row.parent_config_hash,
        source_path=row.source_path,
        source_hash=row.source_hash,
        created_at=row.created_at,
    )


def experiment_record(row: SqlExperiment) -> ExperimentRecord:
    config = row.current_config
    return ExperimentRecord(
        name=row.name,
        kind=row.kind,
        parent=None if row.parent is None else row.parent.name,
        description=row.description,
        hypothesis=row.hypothesis,
        current_config=None if config is None else stored_config(config, row.name),
        created_at=row.created_at,
        updated_at=row.updated_at,
    )


def latency_stats(row: StageStatsRow) -> LatencyStats:
    return LatencyStats(
        p50=row.p50_ms,
        p95=row.p95_ms,
        p99=row.p99_ms,
        p999=row.p999_ms,
        max=row.max_ms,
        mean=row.mean_ms,
        count=row.count,
    )


def measured_latency(rows: Iterable[StageStatsRow]) -> dict[str, LatencyStats]:
    """The measure phase's series by name: what a run's summary takes from its stage rows."""
    return {row.stage: latency_stats(row) for row in rows if row.phase == "measure"}


def error_counts(rows: Iterable[RunErrorCount]) -> dict[str, int]:
    return {row.error_type: row.count for row in sorted(rows, key=lambda e: e.error_type)}


def summary_json(
    summary: RunSummary | None,
    stage_rows: Sequence[StageStatsRow],
    error_rows: Sequence[RunErrorCount],
) -> dict[str, Any] | None:
    """`runs.summary_json` for a run stored with these measurement rows."""
    if summary is None:
        return None
    return stored_form(summary, measured_latency(stage_rows), error_counts(error_rows))


def _rounded(seconds: float | None) -> float | None:
    # The summary shows phase lengths to the millisecond; the columns keep them whole.
    return None if seconds is None else round(seconds, 3)


def run_summary(
    row: SqlRun,
    experiment: str,
    latency: dict[str, LatencyStats],
    errors_by_type: dict[str, int],
) -> RunSummary | None:
    """The run's summary from its stored form, its columns and its measurement rows."""
    if row.summary_json is None:
        return None
    facts = {
        "run_id": row.id,
        "experiment": experiment,
        "status": row.status,
        "valid": row.valid,
        "provisional": row.provisional,
        "reasons": row.reasons_json,
        "protocol": row.protocol_name,
        "requests": row.requests,
        "errors": row.errors,
        "qps": row.qps,
        "warmup_s": _rounded(row.warmup_s),
        "duration_s": _rounded(row.duration_s),
    }
    return from_stored(row.summary_json, facts, latency, errors_by_type)


def run_record(
    row: SqlRun,
    experiment: str,
    config_hash: str,
    summary: RunSummary | None,
) -> RunRecord:
    return RunRecord(
        id=row.id,
        uid=row.uid,
        experiment=experiment,
        config_id=row.config_id,
        config_hash=config_hash,
        environment_id=row.environment_id,
        status=row.status,
        protocol_name=row.protocol_name,
        protocol=row.protocol_json,
        provisional=row.provisional,
        repeat=row.repeat,
        code_identity=row.code_identity_json,
        git_commit=row.git_commit,
        git_dirty=row.git_dirty,
        hostname=row.hostname,
        pid=row.pid,
        started_at=row.started_at,
        heartbeat_at=row.heartbeat_at,
        finished_at=row.finished_at,
        warmup_s=row.warmup_s,
        duration_s=row.duration_s,
        valid=row.valid,
        reasons=tuple(row.reasons_json),
        requests=row.requests,
        errors=row.errors,
        qps=row.qps,
        summary=summary,
        error_message=row.error_message,
        reason_codes=tuple(r.code for r in reasons_of(row.reasons_json, row.reason_codes_json)),
    )


def stage_stats(row: SqlStageStats) -> StageStatsRow:
    return StageStatsRow(
        stage=row.stage,
        phase=row.phase,
        count=row.count,
        histogram=row.histogram,
        min_ms=row.min_ms,
        mean_ms=row.mean_ms,
        stddev_ms=row.stddev_ms,
        p50_ms=row.p50_ms,
        p90_ms=row.p90_ms,
        p95_ms=row.p95_ms,
        p99_ms=row.p99_ms,
        p999_ms=row.p999_ms,
        max_ms=row.max_ms,
    )


def window_stats(row: SqlWindow) -> WindowStats:
    return WindowStats(
        phase=row.phase,
        t_s=row.t_s,
        completed=row.completed,
        errors=row.errors,
        qps=row.qps,
        p50_ms=row.p50_ms,
        p99_ms=row.p99_ms,
        send_lag_p99_ms=row.send_lag_p99_ms,
        offered=row.offered,
        in_flight=row.in_flight,
        ttft_p50_ms=row.ttft_p50_ms,
        ttft_p99_ms=row.ttft_p99_ms,
        tpot_p50_ms=row.tpot_p50_ms,
        tpot_p99_ms=row.tpot_p99_ms,
        output_tps=row.output_tps,
    )


def gpu_dicts(gpus: tuple[GpuSample, ...] | None) -> list[dict[str, Any]] | None:
    if gpus is None:
        return None
    dicts = []
    for gpu in gpus:
        value = asdict(gpu)
        reasons = gpu.throttle_reasons
        value["throttle_reasons"] = None if reasons is None else list(reasons)
        dicts.append(value)
    return dicts


def gpu_sample(value: dict[str, Any]) -> GpuSample:
    reasons = value.get("throttle_reasons")
    return GpuSample(
        index=value["index"],
        util_pct=value.get("util_pct"),
        mem_used_bytes=value.get("mem_used_bytes"),
        mem_total_bytes=value.get("mem_total_bytes"),
        temperature_c=value.get("temperature_c"),
        power_w=value.get("power_w"),
        sm_clock_mhz=value.get("sm_clock_mhz"),
        throttle_reasons=None if reasons is None else tuple(reasons),
    )


def resource_sample(row: SqlResourceSample) -> ResourceSample:
    cores = row.cpu_per_core_json
    gpus = row.gpu_json
    return ResourceSample(
        phase=row.phase,
        t_s=row.t_s,
        cpu_process_pct=row.cpu_process_pct,
        cpu_system_pct=row.cpu_system_pct,
        cpu_per_core=None if cores is None else tuple(cores),
        rss_bytes=row.rss_bytes,
        mem_used_bytes=row.mem_used_bytes,
        mem_total_bytes=row.mem_total_bytes,
        iowait_pct=row.iowait_pct,
        service_cpu_pct=row.service_cpu_pct,
        service_rss_bytes=row.service_rss_bytes,
        steal_pct=row.steal_pct,
        other_cpu_pct=row.other_cpu_pct,
        gpus=None if gpus is None else tuple(gpu_sample(gpu) for gpu in gpus),
    )
