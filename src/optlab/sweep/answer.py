"""What a sweep's levels say: capacity, its interval, the knee and the limit
(`optlab.sweep.strategy` has the method)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from optlab.store.sweep_result import Limit, SweepResult
from optlab.sweep.model import (
    FIT_SLACK,
    INTERVAL_CONFIDENCE,
    bootstrap,
    bracket,
    evidence_bounds,
    fit_model,
)
from optlab.sweep.plan import closed_limit
from optlab.sweep.probe import (
    Level,
    Settings,
    contract_limit,
    judge,
    open_levels,
    settled,
)

INTERVAL_Z = 1.96  # a closed sweep's 95% interval from its throughput's noise


def knee(levels: Sequence[Level]) -> float | None:
    """Kneedle (Satopää et al. 2011, the `kneed` package) on the latency-throughput curve:
    the achieved rate beyond which latency climbs faster than throughput grows."""
    points = sorted(
        (lv.achieved_qps, lv.value_ms)
        for lv in levels
        if lv.achieved_qps and lv.value_ms is not None and lv.failed is None
    )
    if len(points) < 3:
        return None
    from kneed import KneeLocator  # type: ignore[import-untyped]  # no stubs

    x = [p[0] for p in points]
    y = [p[1] for p in points]
    if len(set(x)) < 3:
        return None
    found = KneeLocator(x, y, curve="convex", direction="increasing").knee
    return None if found is None else float(found)


def _closed_knee(levels: Sequence[Level]) -> tuple[int | None, float | None]:
    """The concurrency knee: Kneedle on throughput against clients (concave, increasing)."""
    points = sorted((lv.load, lv.achieved_qps) for lv in levels if lv.achieved_qps)
    if len(points) < 3:
        return None, None
    from kneed import KneeLocator

    found = KneeLocator(
        [p[0] for p in points], [p[1] for p in points], curve="concave", direction="increasing"
    ).knee
    if found is None:
        return None, None
    qps = next(p[1] for p in points if p[0] == found)
    return int(found), float(qps)


MIN_INSIDE = 0.1  # of the draws: fewer inside the bracket, and the fit's own crossing stands


def _central(drawn: np.ndarray | None, fitted: float, low: float, high: float) -> float:
    """The capacity: the median of the bootstrap's draws that agree with the bracket (a level
    passed at `low`, one missed at `high`). A shallow line (levels a busy machine made slow at
    low rates) skews the draws' crossings far to the right (their median was 1.3x the truth on
    a real M/M/2 sweep) and can put the fit's own crossing at the failing level (1.16x on
    another); the draws inside the bracket said 1.01x and 0.92x."""
    if drawn is None:
        return fitted
    inside = drawn[(drawn >= low) & (drawn <= high)]
    if inside.size < MIN_INSIDE * drawn.size:
        return fitted
    return float(np.median(inside))


def _drawn(drawn: np.ndarray | None, percentile: float) -> float | None:
    return None if drawn is None else float(np.percentile(drawn, percentile))


def _none_meets(levels: Sequence[Level], settings: Settings) -> SweepResult:
    """No capacity: the lowest load tried (the lowest open rate in an open sweep, whose one
    client level only seeds it) already failed; the message says how."""
    measured = open_levels(levels) if settings.mode == "open" else []
    lowest = min(measured or levels, key=lambda lv: (lv.mode != "closed", lv.load))
    limit = judge(lowest, settings)
    what = (
        f"{int(lowest.load)} client{'s' if lowest.load != 1 else ''}"
        if lowest.mode == "closed"
        else f"{lowest.load:,.1f}/s"
    )
    seen = "-" if lowest.value_ms is None else f"{lowest.value_ms:,.2f} ms"
    pct = settings.slo.percentile.upper()
    if limit == "slo" or limit is None:
        message = f"no rate meets {settings.slo.label}: at {what} {pct} was {seen}"
    else:
        detail = {
            "errors": f"errors ({lowest.failed or f'{lowest.error_rate:.1%} of requests'})",
            "generator": str(lowest.generator),
            "saturation": f"the target could not keep up ({pct} {seen})",
            "invalid": "; ".join(lowest.reasons) or "the level was INVALID",
        }[str(limit)]
        message = f"no capacity claimed: at {what}, the lowest load tried, {detail}"
    return SweepResult(
        knee_qps=knee(levels), limited_by=contract_limit(limit), message=message, method="none"
    )


# An open sweep's interval wider than this (half-width over the capacity) gets a note saying
# how to narrow it: simulated M/M/1 sweeps at quick levels had +-20-50% intervals and landed
# within +-10% in 14 of 20; with levels 4x as long, in 18 of 20 (benchmarks/README.md).
WIDE_INTERVAL = 0.15


def conclude(levels: Sequence[Level], settings: Settings) -> SweepResult:
    """Capacity, its interval, the knee and the limit, from the levels measured so far."""
    if not levels:
        return SweepResult(message="nothing was measured", method="none")
    if settings.mode == "closed":
        return _conclude_closed(levels, settings)
    opened = settled(levels, settings)
    lo, hi = bracket(opened, settings)
    if lo is None:
        return _none_meets(levels, settings)
    knee_qps = knee(opened)
    pct = settings.slo.percentile.upper()
    if hi is None:
        message = (
            f"every rate up to {lo:,.1f}/s met {settings.slo.label}"
            + (" (--max-rate)" if settings.max_rate is not None else "")
            + ": the capacity is at least that"
        )
        return SweepResult(
            capacity_qps=lo,
            capacity_interval=(lo, lo),
            knee_qps=knee_qps,
            message=message,
            method="highest rate measured",
        )
    limiting = next(lv for lv in opened if lv.load == hi and judge(lv, settings) is not None)
    limit = contract_limit(judge(limiting, settings))
    notes: list[str] = []
    if limit == "generator":
        # No capacity is claimed at or above a level the load generator could not drive.
        notes.append(f"the load generator fell behind at {hi:,.1f}/s: {limiting.generator}")
    fit = fit_model(opened, settings) if limit in ("slo", "saturation") else None
    lower, upper = evidence_bounds(opened, settings)
    drawn = None
    if fit is not None and lo * (1 - FIT_SLACK) <= fit.capacity <= hi * (1 + FIT_SLACK):
        capacity = fit.capacity
        method = f"model fit on {fit.points} levels"
        # The central estimate, with the bootstrap's spread as its interval: a capacity
        # reported low on purpose (a low percentile of the draws) lands 10-20% under the
        # truth on working sweeps, and its interval says nothing about that bias.
        drawn = bootstrap(opened, settings, fit)
        capacity = _central(drawn, capacity, lo * (1 - FIT_SLACK), hi)
    else:
        fit = None
        capacity = lo
        method = "highest passing rate of the bracket"
    # Where no level passed or failed beyond its noise, the fit's own spread (or, without
    # one, the bracket stretched by its width) stands in for that end of the interval.
    tail = (1 - INTERVAL_CONFIDENCE) / 2 * 100
    if lower is not None and drawn is not None:
        # A confident pass far below (a growth level at half the rate) says less than the
        # model's spread near the crossing: the interval's low end is the nearer of the two.
        lower = max(lower, min(float(np.percentile(drawn, tail)), capacity))
    # Above, the bracket stretched by its own width bounds the fit's spread too: a draw whose
    # line is nearly flat puts its crossing anywhere (simulated M/M/4 sweeps reached 14x the
    # truth), though a level at `hi` already missed; an interval that wide cannot tell two
    # steps apart.
    stretch = 1 + max(settings.tolerance, hi / lo - 1)
    low_drawn, high_drawn = _drawn(drawn, tail), _drawn(drawn, 100 - tail)
    if lower is None:
        lower = lo if low_drawn is None else min(lo, low_drawn)
    if upper is None:
        upper = hi * stretch if high_drawn is None else min(max(hi, high_drawn), hi * stretch)
    # The answer stays inside the bracket (a failing level caps it) and the interval.
    capacity = min(max(capacity, lo * (1 - FIT_SLACK), min(lower, hi)), hi, upper)
    interval = (min(lower, capacity), max(upper, capacity))
    if fit is None and limit == "slo":
        notes.append("the model did not fit: the capacity is the bracket's passing end")
    spread = (interval[1] - interval[0]) / 2 / capacity if capacity > 0 else 0.0
    if spread > WIDE_INTERVAL:
        # A gentle latency curve (one server) moves its percentile little with the rate, so
        # one level's noise is a wide range of rates; the cure is measured seconds.
        notes.append(
            f"the interval is +-{spread:.0%} of the capacity: longer levels narrow it "
            "(--level-duration; a tail percentile's noise falls as the square root of the "
            "seconds measured)"
        )
    seen = "-" if limiting.value_ms is None else f"{limiting.value_ms:,.2f} ms"
    message = (
        f"capacity {capacity:,.1f}/s at {settings.slo.label} "
        f"[{interval[0]:,.1f}, {interval[1]:,.1f}]; limited by {limit} "
        f"(at {hi:,.1f}/s {pct} was {seen})"
    )
    return SweepResult(
        capacity_qps=capacity,
        capacity_interval=interval,
        knee_qps=knee_qps,
        limited_by=limit,
        message=message,
        method=method,
        notes=tuple(notes),
    )


def _conclude_closed(levels: Sequence[Level], settings: Settings) -> SweepResult:
    closed = sorted((lv for lv in levels if lv.mode == "closed"), key=lambda lv: lv.load)
    limits = {lv.load: closed_limit(lv, closed, settings) for lv in closed}
    fails = [lv for lv in closed if limits[lv.load] is not None]
    hi = min((lv.load for lv in fails), default=None)
    passes = [lv for lv in closed if limits[lv.load] is None and (hi is None or lv.load < hi)]
    knee_clients, knee_qps = _closed_knee(closed)
    if not passes:
        return _none_meets(levels, settings)
    best = max(passes, key=lambda lv: lv.achieved_qps or 0.0)
    capacity = best.achieved_qps or 0.0
    # The throughput's own noise (its seconds' batch means): a capacity is never exact.
    noise = INTERVAL_Z * (best.qps_se or 0.0)
    lower, upper = capacity - noise, capacity + noise
    if hi is None:
        limit: Limit | None = None
        how = "every client count measured met the SLO"
    else:
        first_fail = next(lv for lv in closed if lv.load == hi)
        limit = contract_limit(limits[hi])
        upper = max(upper, first_fail.achieved_qps or capacity)
        how = f"limited by {limit} at {int(hi)} clients"
    clients = int(best.load)
    message = (
        f"capacity {capacity:,.1f}/s at {settings.slo.label} with {clients} "
        f"client{'' if clients == 1 else 's'} [{lower:,.1f}, {upper:,.1f}]; {how}"
    )
    return SweepResult(
        capacity_qps=capacity,
        capacity_interval=(lower, upper),
        knee_qps=knee_qps,
        knee_clients=knee_clients,
        limited_by=limit,
        message=message,
        method="highest throughput that met the SLO",
    )
