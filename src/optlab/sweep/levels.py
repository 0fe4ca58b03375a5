"""A measured run read as a sweep level: its load, its percentile with that percentile's
uncertainty, whether the target kept up, and whether the load generator did."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from optlab.config.slo import Slo
from optlab.metrics.stages import SEND_LAG
from optlab.run.pace import LITTLE_TOLERANCE, fell_short, held_back, littles_law
from optlab.store import RunRecord, WindowStats
from optlab.store.reasons import GENERATOR, NODES, NOT_STEADY, SATURATION
from optlab.sweep.strategy import Level, Mode

__all__ = ["LITTLE_TOLERANCE", "held_back_ms", "level_of", "littles_law_gap"]


def littles_law_gap(
    windows: Sequence[WindowStats], qps: float | None, mean_ms: float | None
) -> tuple[float, float, float] | None:
    """Little's law over a level's windows (`optlab.run.pace.littles_law`): each window's
    last in-flight count against achieved rate x mean latency."""
    return littles_law([w.in_flight for w in windows if w.in_flight is not None], qps, mean_ms)


def held_back_ms(record: RunRecord, windows: Sequence[WindowStats]) -> tuple[float, str] | None:
    """How long the load generator held requests back, in ms, and what says so; None when
    nothing says it did. The send-lag P99 when the verdict says the generator fell behind;
    the Little's-law shortfall (mean in flight short of rate x mean latency, beyond its noise)
    as a mean hold-back per request."""
    summary = record.summary
    found: tuple[float, str] | None = None
    behind = record.reason(*GENERATOR)
    if behind is not None:
        lag = summary.harness_ms.get(SEND_LAG) if summary is not None else None
        found = ((lag.p99 if lag is not None else None) or 0.0, behind.text)
    if summary is None or record.reason(*NOT_STEADY) is not None:
        # Little's law holds for a steady queue; a backlog that grows breaks it by itself.
        return found
    total = summary.total
    gap = littles_law_gap(windows, record.qps, total.mean)
    if gap is None or total.mean is None:
        return found
    relative = gap[0]
    if held_back(gap):
        hidden = -relative * total.mean
        why = (
            f"Little's law is off by {relative:+.0%}: mean in flight vs achieved rate x mean "
            f"latency ({record.qps:.1f}/s x {total.mean:.2f} ms); the generator held requests "
            f"back ~{hidden:.2f} ms each"
        )
        if found is None or hidden > found[0]:
            return hidden, why
    return found


# The per-second P99 series that stands for an objective's metric in `_value_se`.
_WINDOW_P99 = {"latency": "p99_ms", "ttft": "ttft_p99_ms", "tpot": "tpot_p99_ms"}


def _value_se(
    windows: Sequence[WindowStats], value: float | None, slo: Slo, summary: Any
) -> float | None:
    """The standard error of the level's percentile: the spread of its seconds' P99 (batch
    means with one-second batches) of the binding objective's series (the one nearest its
    bound: E2E latency, TTFT or TPOT; ITL has no per-second series, E2E's stands in), scaled
    to the percentile judged."""
    field = "p99_ms"
    shares = [
        (observed / objective.ms, objective.metric)
        for objective in slo.objectives
        if (observed := objective.observed(summary) if summary is not None else None) is not None
    ]
    if shares:
        field = _WINDOW_P99.get(max(shares)[1], "p99_ms")
    series = [getattr(w, field) for w in windows]
    p99s = np.array([v for v in series if v is not None], dtype=float)
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


def _generator(
    record: RunRecord, windows: Sequence[WindowStats], mode: Mode, load: float, slo: Slo
) -> tuple[str | None, tuple[str, ...]]:
    """(why the load generator, not the target, decided this level's verdict, or None; the
    run's generator reasons that did not decide it).

    Judged against what the level measured, not by an absolute lag: latency is counted from
    the INTENDED send time, so the time a request was held back is already inside it. A level
    that met the SLO with that time counted, at the rate asked, met it; one that missed the SLO
    by more than the hold-back would have missed it anyway. Only a level the hold-back could
    have tipped over the SLO, or one whose completions fell short of the rate with no backlog
    of the target's making, is the generator's."""
    own = tuple(r.text for r in record.verdict_reasons if r.code in GENERATOR)
    node = next((r.text for r in record.verdict_reasons if r.code in NODES), None)
    if node is not None:
        return node, ()  # a node did not send its share: no claim rests on that level
    if mode != "open":
        return (own[0] if own else None), ()
    held = held_back_ms(record, windows)
    if held is None:
        return None, ()
    hidden, why = held
    summary = record.summary
    value = slo.value_of(summary)
    short = fell_short(load, record.qps, record.duration_s or 0.0)
    if short or value is None or (value > slo.ms and value - hidden <= slo.ms):
        return why, ()
    return None, own


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
    value = slo.value_of(summary)
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
    generator, excused = _generator(record, windows, mode, load, slo)
    if mode == "open" and value is not None and value <= slo.ms:
        # A level too short for MLPerf's query bound at a rate so low that the longest level
        # the protocol allows cannot reach it (583 queries in 60 s at 9.7/s) met the SLO all
        # the same: measuring it again gives as few, and the next rate up has enough.
        excused += tuple(r.text for r in record.verdict_reasons if r.code == "few-queries")
    return Level(
        mode=mode,
        load=load,
        achieved_qps=record.qps,
        p50_ms=total.p50 if total is not None else None,
        value_ms=value,
        value_se_ms=_value_se(windows, value, slo, summary),
        error_rate=errors / sent if sent else 0.0,
        valid=bool(record.valid),
        reasons=tuple(record.reasons),
        generator=generator,
        excused=excused,
        failed=failed,
        measured_s=(record.warmup_s or 0.0) + (record.duration_s or 0.0),
        duration_s=record.duration_s or 0.0,
        run_id=record.id,
        p99_ms=total.p99 if total is not None else None,
        qps_se=_qps_se(windows),
        purpose=purpose,
        saturated=_saturated(record, mode),
    )


def _saturated(record: RunRecord, mode: Mode) -> bool | None:
    """Open loop: whether the run's verdict found the target saturated (its `saturated` code,
    `run.pace.saturated_by` on the run's backlog, or `stopped-early`: stopped as plainly
    saturated; the codes diagnose reads too); None where no verdict judged it."""
    if mode != "open" or record.valid is None:
        return None
    return record.reason(*SATURATION) is not None
