"""Which load a sweep measures next (`optlab.sweep.strategy` has the method)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import numpy as np

from optlab.config.models import MAX_CONCURRENCY, MAX_RATE
from optlab.store.sweep_result import Limit
from optlab.sweep.model import (
    FIT_SLACK,
    INTERVAL_CONFIDENCE,
    Fit,
    bootstrap,
    bracket,
    fit_model,
)
from optlab.sweep.probe import (
    MEASURES_PER_RATE,
    Level,
    Probe,
    Settings,
    judge,
    refining,
    remeasure,
    settled,
)

GROWTH = 2.0

CLOSED_GAIN_MIN = 0.05  # twice the clients for < 5% more throughput: it stopped growing

FIRST_RATE_FRACTION = 0.5  # the first open rate, as a share of one client's throughput

MIN_RATE_FLOOR = 0.1  # requests/s: below this a level would take minutes to say anything

MIN_REFINE = 1  # model-placed levels before the interval may stop the search

MAX_REFINE = 4

MAX_LEVELS = 40  # a safety stop: no sweep needs more probes than this


def _spent(levels: Sequence[Level]) -> float:
    return sum(level.measured_s for level in levels)


def next_probe(levels: Sequence[Level], settings: Settings) -> Probe | None:
    """The next level to measure, or None when the sweep has its answer."""
    if len(levels) >= MAX_LEVELS:
        return None
    if settings.budget_s is not None and levels:
        per_level = _spent(levels) / len(levels)
        if _spent(levels) + per_level > settings.budget_s:
            return None
    if settings.mode == "closed":
        return _next_closed(levels, settings)
    probe = _next_open(levels, settings)
    if probe is not None and probe.mode == "open":
        same = sum(1 for lv in levels if lv.mode == "open" and math.isclose(lv.load, probe.load))
        if same > MEASURES_PER_RATE:
            return None  # a rate whose levels keep coming out inconclusive: nothing more to learn
    return probe


def _first_rate(levels: Sequence[Level], settings: Settings) -> float | None:
    if settings.min_rate is not None:
        return settings.min_rate
    pilot = next((lv for lv in levels if lv.mode == "closed"), None)
    if pilot is None or not pilot.achieved_qps:
        return None
    rate = min(max(pilot.achieved_qps * FIRST_RATE_FRACTION, MIN_RATE_FLOOR), MAX_RATE)
    if settings.max_rate is not None:
        rate = min(rate, settings.max_rate)
    return rate


def _next_open(levels: Sequence[Level], settings: Settings) -> Probe | None:
    opened = settled(levels, settings)
    if settings.min_rate is None and not any(lv.mode == "closed" for lv in levels):
        return Probe("closed", 1, "one client")
    if not opened:
        pilot = levels[-1] if levels else None
        if pilot is not None and judge(pilot, settings) in ("errors", "slo"):
            return None  # one client alone misses: no rate will meet the SLO
        first = _first_rate(levels, settings)
        return None if first is None else Probe("open", first, "growth")
    lo, hi = bracket(opened, settings)
    again = remeasure(levels, settings, hi)
    if again is not None:
        return again
    if hi is None:  # every level passed: grow, up to --max-rate (and the open loop's most)
        top = max(lv.load for lv in opened)
        ceiling = min(settings.max_rate or MAX_RATE, MAX_RATE)
        if top >= ceiling * (1 - 1e-9):
            return None
        return Probe("open", min(top * GROWTH, ceiling), "growth")
    if lo is None:
        # The lowest rate tried already fails. Look lower once (the one-client level passed),
        # unless the user fixed the lowest rate.
        lowest = min(lv.load for lv in opened)
        if settings.min_rate is not None or len(opened) > 1 or lowest <= MIN_RATE_FLOOR:
            return None
        return Probe("open", max(lowest / (GROWTH * GROWTH), MIN_RATE_FLOOR), "growth")
    refined = _refinements(opened, settings)
    fit = fit_model(opened, settings)
    if fit is None or not lo * (1 - FIT_SLACK) <= fit.capacity <= hi * (1 + FIT_SLACK):
        # No usable model: bisection, until the bracket itself is within the tolerance.
        if hi / lo - 1 <= settings.tolerance or refined >= MAX_REFINE + 2:
            return _confirm(opened, settings, lo)
        return Probe("open", math.sqrt(lo * hi), "bisection")
    if refined >= MAX_REFINE:
        return None
    if refined >= MIN_REFINE:
        drawn = bootstrap(opened, settings, fit)
        tail = (1 - INTERVAL_CONFIDENCE) / 2 * 100
        half_width = (
            None if drawn is None else float(np.ptp(np.percentile(drawn, [tail, 100 - tail]))) / 2
        )
        if half_width is not None and half_width <= settings.tolerance * fit.capacity:
            return None
    return Probe("open", _refine(fit, lo, hi), "model")


def _confirm(levels: Sequence[Level], settings: Settings, lo: float) -> Probe | None:
    """The bracket's passing end measured again at the refining length, when only a short
    growth level vouches for it: a short level reads a queue's tail low, and the answer would
    stand on it."""
    at_lo = [lv for lv in levels if lv.load == lo]
    if any(refining(lv) for lv in at_lo):
        return None
    return Probe("open", lo, "confirm")


def _refinements(levels: Sequence[Level], settings: Settings) -> int:
    """Open levels measured after the first that failed: the growth phase's end."""
    for index, level in enumerate(levels):
        if judge(level, settings) is not None:
            return len(levels) - index - 1
    return 0


def _refine(fit: Fit, lo: float, hi: float) -> float:
    """The model's capacity, kept inside the bracket: the levels there decide the answer, and
    each one measured at the capacity itself adds the most to the fit where it is read."""
    margin = 0.05 * (hi - lo)
    return min(max(fit.capacity, lo + margin), hi - margin)


def _next_closed(levels: Sequence[Level], settings: Settings) -> Probe | None:
    closed = sorted((lv for lv in levels if lv.mode == "closed"), key=lambda lv: lv.load)
    start = max(1, round(settings.min_rate or 1))
    most = MAX_CONCURRENCY if settings.max_rate is None else math.floor(settings.max_rate)
    cap = max(start, min(most, MAX_CONCURRENCY))
    if not closed:
        return Probe("closed", start, "one client" if start == 1 else "growth")
    fails = [lv for lv in closed if closed_limit(lv, closed, settings) is not None]
    if not fails:
        top = int(closed[-1].load)
        if top >= cap:
            return None
        return Probe("closed", min(top * 2, cap), "growth")
    hi = int(min(lv.load for lv in fails))
    passes = [int(lv.load) for lv in closed if lv.load < hi]
    if not passes or hi - max(passes) <= 1:
        return None
    lo = max(passes)
    lo_qps = next(lv.achieved_qps for lv in closed if lv.load == lo) or 0.0
    hi_qps = next(lv.achieved_qps for lv in fails if lv.load == hi) or 0.0
    if hi_qps and lo_qps and hi_qps / lo_qps - 1 <= settings.tolerance:
        return None
    return Probe("closed", (lo + hi) // 2, "bisection")


def closed_limit(
    level: Level, closed: Sequence[Level], settings: Settings
) -> Limit | Literal["invalid"] | None:
    """A closed level's limit: its own (SLO, errors), or saturation when twice the clients of
    an earlier level bought < 5% more throughput."""
    own = judge(level, settings)
    if own is not None:
        return own
    half = next((lv for lv in closed if lv.load * 2 == level.load), None)
    if (
        half is not None
        and half.achieved_qps
        and level.achieved_qps is not None
        and level.achieved_qps < half.achieved_qps * (1 + CLOSED_GAIN_MIN)
    ):
        return "saturation"
    return None
