"""A measured run read as a sweep level: its load, its percentile with that percentile's
uncertainty, whether the target kept up, and whether the load generator did."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from optlab.store import RunRecord, WindowStats
from optlab.sweep.slo import Slo
from optlab.sweep.strategy import Level, Mode

__all__ = ["LITTLE_TOLERANCE", "level_of", "littles_law_gap"]

# Mean in flight against achieved rate x mean latency: off by more than this (and by more
# than the samples' own noise), the latency was not measured where the requests were.
LITTLE_TOLERANCE = 0.05
LITTLE_SIGMAS = 3.0
GENERATOR_REASON = "the load generator fell behind"
NOT_STEADY = ("the target is saturated", "stopped after", "unstable")


def littles_law_gap(
    windows: Sequence[WindowStats], qps: float | None, mean_ms: float | None
) -> tuple[float, float] | None:
    """(relative gap, its standard error) between the mean of the in-flight samples and
    achieved rate x mean latency (Little's law, L = lambda W); None without samples.

    In the open loop latency is counted from the INTENDED send time, and in flight from the
    actual send: when the generator holds requests back (no worker free, the GIL), L falls
    short of lambda W. The samples are each second's last in-flight count, so the gap has
    noise of its own; its standard error says how much.
    """
    samples = np.array([w.in_flight for w in windows if w.in_flight is not None], dtype=float)
    if len(samples) < 3 or not qps or mean_ms is None or mean_ms <= 0:
        return None
    expected = qps * mean_ms / 1000
    if expected <= 0:
        return None
    gap = (float(samples.mean()) - expected) / expected
    se = float(samples.std(ddof=1)) / math.sqrt(len(samples)) / expected
    return gap, se


def _value_se(windows: Sequence[WindowStats], value: float | None) -> float | None:
    """The standard error of the level's percentile: the spread of its seconds' P99 (batch
    means with one-second batches), scaled to the percentile judged."""
    p99s = np.array([w.p99_ms for w in windows if w.p99_ms is not None], dtype=float)
    if value is None or len(p99s) < 3 or p99s.mean() <= 0:
        return None
    relative = float(p99s.std(ddof=1) / p99s.mean()) / math.sqrt(len(p99s))
    return relative * value


def _qps_se(windows: Sequence[WindowStats]) -> float | None:
    """The standard error of the level's achieved rate: its seconds taken as batches."""
    rates = np.array([w.qps for w in windows], dtype=float)
    if len(rates) < 3:
        return None
    return float(rates.std(ddof=1) / math.sqrt(len(rates)))


def _generator(record: RunRecord, windows: Sequence[WindowStats], mode: Mode) -> str | None:
    """Why the load generator, not the target, set this level's limit; None when it kept up."""
    for reason in record.reasons:
        if reason.startswith(GENERATOR_REASON):
            return reason
    summary = record.summary
    if mode != "open" or summary is None:
        return None
    if any(reason.startswith(NOT_STEADY) for reason in record.reasons):
        # Little's law holds for a steady queue; a backlog that grows breaks it by itself.
        return None
    total = summary.total
    found = littles_law_gap(windows, record.qps, total.mean)
    if found is None:
        return None
    gap, se = found
    if abs(gap) > LITTLE_TOLERANCE and abs(gap) > LITTLE_SIGMAS * se:
        return (
            f"Little's law is off by {gap:+.0%}: mean in flight vs achieved rate x mean "
            f"latency ({record.qps:.1f}/s x {total.mean:.2f} ms); the latency was not "
            "measured where the requests were (the generator held them back)"
        )
    return None


def level_of(
    record: RunRecord,
    windows: Sequence[WindowStats],
    mode: Mode,
    load: float,
    slo: Slo,
    purpose: str = "",
) -> Level:
    """The run `record` (its measured-phase `windows`) as a level at `load`, measured for
    `purpose` (the probe's)."""
    summary = record.summary
    total = summary.total if summary is not None else None
    value = getattr(total, slo.field) if total is not None else None
    completed = record.requests or 0
    errors = record.errors or 0
    sent = completed + errors
    failed = None
    if record.status == "FAILED":
        failed = record.error_message or "the run FAILED"
    elif errors and not completed:
        kinds = summary.errors_by_type if summary is not None else {}
        top = max(kinds.items(), key=lambda kv: kv[1])[0] if kinds else "errors"
        failed = f"every request failed ({errors} x {top})"
    return Level(
        mode=mode,
        load=load,
        achieved_qps=record.qps,
        p50_ms=total.p50 if total is not None else None,
        value_ms=value,
        value_se_ms=_value_se(windows, value),
        error_rate=errors / sent if sent else 0.0,
        valid=bool(record.valid),
        reasons=tuple(record.reasons),
        generator=_generator(record, windows, mode),
        failed=failed,
        measured_s=(record.warmup_s or 0.0) + (record.duration_s or 0.0),
        duration_s=record.duration_s or 0.0,
        run_id=record.id,
        p99_ms=total.p99 if total is not None else None,
        qps_se=_qps_se(windows),
        purpose=purpose,
    )
