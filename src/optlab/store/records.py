"""Plain, frozen records that cross the `optlab.store` boundary in both directions.

Callers hand these in and get these back; SQLAlchemy rows stay inside the store so that no
caller can trigger lazy loads on a closed session or write to the database by accident.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from optlab.config.slo import Slo
from optlab.store.reasons import Reason, ReasonCode, reasons_of
from optlab.store.summary import RunSummary
from optlab.store.sweep_result import SweepResult


class RunStatus(StrEnum):
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    FAILED = "FAILED"
    KILLED = "KILLED"
    # Set by `mark_crashed` for runs whose process stopped sending heartbeats.
    CRASHED = "CRASHED"


TERMINAL_STATUSES = frozenset(
    {RunStatus.FINISHED, RunStatus.FAILED, RunStatus.KILLED, RunStatus.CRASHED}
)


@dataclass(frozen=True, slots=True)
class StoredConfig:
    id: int
    experiment: str
    config: dict[str, Any]
    config_hash: str
    change: dict[str, Any] | None
    variable: str | None
    parent_config_hash: str | None
    source_path: str
    source_hash: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class ExperimentRecord:
    name: str
    kind: str
    parent: str | None
    description: str | None
    hypothesis: str | None
    current_config: StoredConfig | None
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class EnvironmentRecord:
    id: int
    fingerprint: dict[str, Any]
    fingerprint_hash: str
    material_hash: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RunRecord:
    id: int  # this database's id
    uid: str  # the run's identity in every database (see `optlab export` / `optlab import`)
    experiment: str
    config_id: int
    config_hash: str
    environment_id: int | None
    status: str
    protocol_name: str
    protocol: dict[str, Any]
    provisional: bool
    repeat: bool
    code_identity: dict[str, Any]
    git_commit: str | None
    git_dirty: bool | None
    hostname: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    finished_at: datetime | None
    warmup_s: float | None
    duration_s: float | None
    valid: bool | None
    reasons: tuple[str, ...]
    requests: int | None
    errors: int | None
    qps: float | None
    summary: RunSummary | None
    error_message: str | None
    # Each reason's code, in the order of `reasons` (store.reasons); () for a record built
    # by hand, whose reasons then read as `other`.
    reason_codes: tuple[ReasonCode, ...] = ()

    @property
    def verdict_reasons(self) -> tuple[Reason, ...]:
        """The reasons with their codes."""
        return reasons_of(self.reasons, self.reason_codes)

    def reason(self, *codes: ReasonCode) -> Reason | None:
        """The first reason with one of these codes; None when there is none."""
        return next((r for r in self.verdict_reasons if r.code in codes), None)


@dataclass(frozen=True, slots=True)
class RunFinal:
    """What a run's end decides: `Store.finish_run` and `Store.complete_run` store it, and a
    pending bundle carries it. Durations are unrounded here (the summary shows them to 1 ms)."""

    status: str
    valid: bool | None = None
    reasons: tuple[str, ...] = ()
    requests: int | None = None
    errors: int | None = None  # how many requests failed; by type in the run's error rows
    qps: float | None = None
    warmup_s: float | None = None
    duration_s: float | None = None
    summary: RunSummary | None = None
    error_message: str | None = None
    # Each reason's code, in the order of `reasons`; missing ones are stored as `other`.
    reason_codes: tuple[ReasonCode, ...] = ()

    def __post_init__(self) -> None:
        if self.status not in TERMINAL_STATUSES:
            allowed = sorted(TERMINAL_STATUSES)
            raise ValueError(f"a run finishes as one of {allowed}, not {self.status!r}")
        # A StrEnum status is stored, and compared, as its plain value.
        object.__setattr__(self, "status", str(self.status))
        object.__setattr__(self, "reasons", tuple(self.reasons))
        coded = reasons_of(self.reasons, self.reason_codes)
        object.__setattr__(self, "reason_codes", tuple(r.code for r in coded))


@dataclass(frozen=True, slots=True)
class StageStatsRow:
    """Latency of one stage in one phase; percentiles are None when `count` is 0."""

    stage: str
    phase: str
    count: int
    histogram: str
    min_ms: float | None = None
    mean_ms: float | None = None
    stddev_ms: float | None = None
    p50_ms: float | None = None
    p90_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None
    max_ms: float | None = None


# A streaming target's per-second figures (WindowStats below).
LLM_WINDOW_FIELDS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "output_tps")


@dataclass(frozen=True, slots=True)
class WindowStats:
    """One second of a run; latency fields are None for a second where nothing completed."""

    phase: str
    t_s: int
    completed: int
    errors: int
    qps: float
    p50_ms: float | None = None
    p99_ms: float | None = None
    send_lag_p99_ms: float | None = None
    offered: int | None = None  # requests sent in this second
    in_flight: int | None = None  # requests in flight at its end
    # A streaming target's streams that ended in this second (None: none, or before
    # optlab recorded them).
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    output_tps: float | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU at one instant. None means "not readable here", never zero."""

    index: int
    util_pct: float | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    sm_clock_mhz: float | None = None
    throttle_reasons: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ResourceSample:
    """Machine and process resources at one instant. None means "not readable here"."""

    phase: str
    t_s: float
    cpu_process_pct: float | None = None
    cpu_system_pct: float | None = None
    cpu_per_core: tuple[float, ...] | None = None
    rss_bytes: int | None = None
    mem_used_bytes: int | None = None
    mem_total_bytes: int | None = None
    iowait_pct: float | None = None
    service_cpu_pct: float | None = None  # a service optlab started: its own process tree
    service_rss_bytes: int | None = None
    steal_pct: float | None = None  # CPU the hypervisor took away, all cores, 0..100
    other_cpu_pct: float | None = None  # CPU of processes outside the run, % of one core
    # None: no GPU telemetry at all; an empty tuple: telemetry works and there are no GPUs.
    gpus: tuple[GpuSample, ...] | None = None


@dataclass(frozen=True, slots=True)
class RunErrorCount:
    """How often one kind of error happened in a run, with one example message."""

    error_type: str
    count: int
    example: str | None = None


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    url: str  # password masked
    revision: str | None  # None: an empty database
    head: str
    up_to_date: bool


@dataclass(frozen=True, slots=True)
class SweepLevelTag:
    """What makes a new run a sweep level: `Store.create_run(level=...)` writes both rows in
    one transaction, so the run is never seen as an ordinary run of its experiment."""

    sweep_id: int
    position: int
    mode: str  # open | closed
    load: float  # requests/s (open) or clients (closed)
    purpose: str


@dataclass(frozen=True, slots=True)
class SweepLevelRecord:
    position: int
    run_id: int
    mode: str
    load: float
    purpose: str
    reused: bool


@dataclass(frozen=True, slots=True)
class SweepRecord:
    id: int
    uid: str
    experiment: str
    config_id: int
    config_hash: str
    environment_id: int | None
    status: str
    mode: str
    slo_percentile: str
    slo_ms: float
    protocol: dict[str, Any]
    strategy: dict[str, Any]
    code_identity: dict[str, Any]
    hostname: str
    pid: int
    started_at: datetime
    finished_at: datetime | None
    result: SweepResult | None  # None until the sweep finishes
    measured_s: float | None
    error_message: str | None
    levels: tuple[SweepLevelRecord, ...]
    slo_json: dict[str, Any] | None = None  # the whole SLO, when it is not one percentile

    @property
    def slo(self) -> Slo:
        """The SLO the sweep judged its levels by."""
        if self.slo_json is not None:
            return Slo.model_validate(self.slo_json)
        return Slo(self.slo_percentile, self.slo_ms)


@dataclass(frozen=True, slots=True)
class KnobCellRecord:
    """One arm measured in one block of a knob sweep: its run, or its capacity sweep."""

    block: int
    arm: int  # 0: the parent; 1..k: the values in order
    position: int  # its place in the block's random order
    run_id: int | None
    sweep_id: int | None
    measured_s: float


@dataclass(frozen=True, slots=True)
class KnobSweepRecord:
    """An `optlab sweep-knob`: the request (`spec`), its cells, and what it found (`result`,
    docs/sweep-knob-json.md's document, None until it finishes)."""

    id: int
    uid: str
    experiment: str
    config_hash: str
    knob: str
    metric: str
    status: str
    spec: dict[str, Any]
    hostname: str
    pid: int
    started_at: datetime
    finished_at: datetime | None
    result: dict[str, Any] | None
    measured_s: float | None
    error_message: str | None
    cells: tuple[KnobCellRecord, ...]
