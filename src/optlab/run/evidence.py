"""The evidence section of a run's summary: what `optlab diagnose` reads beyond latency and
resources (docs/run-json.md "evidence"), from what the run observed over its measured phase.

Pure, like `optlab.run.summarize`: `run_evidence()` reads its inputs only. A figure the run
could not observe is None, never 0.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optlab.metrics.gcpause import pause_figures
from optlab.metrics.profile import Profile
from optlab.metrics.resources import ResourceReading
from optlab.metrics.trend import least_squares, served_by
from optlab.metrics.usage import ProcessUsage
from optlab.metrics.windows import Window
from optlab.store.evidence import (
    BatchingEvidence,
    GcEvidence,
    MemoryTrend,
    Neighbour,
    NetworkEvidence,
    ProcessEvidence,
    ProfileEvidence,
    RunEvidence,
    ThreadCpu,
)
from optlab.store.summary import RunSummary
from optlab.targets.kind import TargetKind

__all__ = ["MEMORY_LEAST_SAMPLES", "SERVER_TOTALS", "Observed", "memory_trend", "run_evidence"]

MEMORY_LEAST_SAMPLES = 5
# A server's own total among its Server-Timing stages: its `total` (renamed, since `total` is
# the client's series) or, as `optlab serve` names its whole handler, `app`.
SERVER_TOTALS = ("server_total", "app")


@dataclass(frozen=True)
class Observed:
    """What a run observed for its evidence, over the measured phase."""

    cores: int | None = None  # CPUs the run may use (its affinity)
    process: ProcessUsage | None = None  # optlab's process tree
    service: ProcessUsage | None = None  # the target's service's tree
    # The target has a service apart from optlab's process: a command target's, or an http
    # target's found listening on this host.
    started_service: bool = False
    # The processes outside the run that used the most CPU over the phase, as the resource
    # sampler names them: {"name", "pid", "cpu_pct"}.
    neighbours: Sequence[Mapping[str, Any]] = ()
    gc_pauses_ns: Sequence[int] | None = None  # None: not timed (the phase never began)
    windows: Sequence[Window] = ()  # the measured phase's windows
    window_s: float = 1.0
    window_in_flight: Sequence[int | None] = ()  # in flight at each window's end
    # When the measured phase began, in seconds on the resource readings' clock (t_s).
    measure_start_s: float | None = None
    # (t_s, optlab's RSS, the service's RSS) read when the phase began and when it ended.
    tree_rss: Sequence[tuple[float, int | None, int | None]] = ()
    profile: Profile | None = None  # `optlab run --profile`: py-spy's samples
    # The stage a request waits in for its batch: the target kind's (TargetKind.batch_wait_stage).
    batch_wait_stage: str | None = TargetKind.batch_wait_stage
    # The section of the target's figures that reports its batches (TargetKind.batch_figures).
    batch_figures: str | None = TargetKind.batch_figures


def run_evidence(
    observed: Observed,
    readings: Sequence[ResourceReading],
    *,
    measured_s: float,
    in_flight_max: int | None,
    in_process: bool,
    summary: RunSummary,
) -> RunEvidence:
    """The evidence of a run whose summary (latency, target figures) is `summary`."""
    measured = [r for r in readings if r.phase == "measure"]
    in_flight = [n for n in observed.window_in_flight if n is not None]
    most = max([*in_flight, *([] if in_flight_max is None else [in_flight_max])], default=None)
    return RunEvidence(
        cores=observed.cores,
        process=_process(observed.process),
        service=_process(observed.service),
        neighbour_cpu_pct=_mean([r.other_cpu_pct for r in measured], 2),
        neighbours=tuple(Neighbour.model_validate(n) for n in observed.neighbours),
        steal_pct=_mean([r.steal_pct for r in measured], 2),
        gc=_gc(observed.gc_pauses_ns, measured_s),
        memory=memory_trend(observed, measured),
        in_flight_mean=_mean([float(n) for n in in_flight], 2),
        in_flight_max=most,
        batching=_batching(summary, observed.batch_figures, observed.batch_wait_stage),
        network=None if in_process else _network(summary),
        profile=None if observed.profile is None else _profile(observed.profile),
    )


def _profile(profile: Profile) -> ProfileEvidence:
    return ProfileEvidence.model_validate(dataclasses.asdict(profile))


def _mean(values: Sequence[float | None], digits: int) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.fmean(known), digits) if known else None


def _process(usage: ProcessUsage | None) -> ProcessEvidence | None:
    if usage is None:
        return None
    per_s = (usage.ctx_voluntary_per_s, usage.ctx_involuntary_per_s)
    voluntary, involuntary = (None if v is None else round(v, 1) for v in per_s)
    return ProcessEvidence(
        cpu_user_pct=round(usage.cpu_user_pct, 2),
        cpu_system_pct=round(usage.cpu_system_pct, 2),
        ctx_voluntary_per_s=voluntary,
        ctx_involuntary_per_s=involuntary,
        threads=tuple(ThreadCpu(name=name, cpu_pct=round(pct, 2)) for name, pct in usage.threads),
    )


def _gc(pauses_ns: Sequence[int] | None, measured_s: float) -> GcEvidence | None:
    figures = None if pauses_ns is None else pause_figures(pauses_ns, measured_s)
    if figures is None:
        return None
    return GcEvidence(
        collections=figures.collections,
        pause_total_ms=round(figures.total_ms, 3),
        pause_max_ms=round(figures.max_ms, 3),
        pause_p99_ms=None if figures.p99_ms is None else round(figures.p99_ms, 3),
        share_pct=round(figures.share_pct, 3),
    )


def memory_trend(observed: Observed, measured: Sequence[ResourceReading]) -> MemoryTrend | None:
    """RSS (MiB) against the requests served so far (thousands), least squares over the
    measured phase's samples and the readings taken when it began and ended; None with fewer
    than MEMORY_LEAST_SAMPLES points or no requests."""
    start, started_service = observed.measure_start_s, observed.started_service
    if start is None:
        return None
    points: list[tuple[float, int | None]] = [
        (r.t_s, r.service_rss_bytes if started_service else r.rss_bytes) for r in measured
    ]
    points += [(t, service if started_service else own) for t, own, service in observed.tree_rss]
    known = sorted((max(0.0, t - start), rss) for t, rss in points if rss is not None)
    if len(known) < MEMORY_LEAST_SAMPLES:
        return None
    window_s = observed.window_s
    windows = [(w.t_s * window_s, w.span_s, w.completed) for w in observed.windows]
    served = served_by([t for t, _ in known], windows)
    if not any(served):
        return None
    fit = least_squares([n / 1000 for n in served], [rss / 2**20 for _, rss in known])
    if fit is None:
        return None
    return MemoryTrend(
        mib_per_1k_requests=round(fit.slope, 4),
        r2=round(fit.r2, 4),
        samples=len(known),
        series="service_rss_bytes" if started_service else "rss_bytes",
    )


def _batching(
    summary: RunSummary, section: str | None, wait_stage: str | None
) -> BatchingEvidence | None:
    """From a batching target's own figures (its kind's `section` of them, as JSON) and its
    wait stage (its kind's); None for a target that reports no batching."""
    if section is None:
        return None
    mean_batch = _number(summary.target_figure(section, "mean_batch_size"))
    max_batch = _number(summary.target_figure(section, "max_batch_size"))
    if mean_batch is None and max_batch is None:
        return None
    wait = summary.stages.get(wait_stage) if wait_stage is not None else None
    fill = None
    if mean_batch is not None and max_batch is not None and max_batch > 0:
        fill = round(mean_batch / max_batch, 4)
    return BatchingEvidence(
        mean_batch=None if mean_batch is None else round(mean_batch, 3),
        max_batch=None if max_batch is None else int(max_batch),
        fill_ratio=fill,
        wait_ms_mean=None if wait is None else wait.mean,
        wait_ms_p99=None if wait is None else wait.p99,
    )


def _network(summary: RunSummary) -> NetworkEvidence | None:
    client = summary.total.p50
    server = next(
        (stats.p50 for name in SERVER_TOTALS if (stats := summary.stages.get(name)) is not None),
        None,
    )
    if client is None or server is None or client <= 0:
        return None
    # Each request's server time is part of its client time, so the medians keep that order;
    # below 0 is only the header's rounding.
    overhead = max(0.0, client - server)
    return NetworkEvidence(
        client_p50_ms=client,
        server_p50_ms=server,
        overhead_p50_ms=round(overhead, 3),
        overhead_share=round(min(1.0, overhead / client), 4),
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
