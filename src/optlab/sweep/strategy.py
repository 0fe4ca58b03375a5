"""Which load to measure next, and what the measured levels say: the sweep's strategy.

Pure functions over measured levels (no store, no target), so the strategy is tested and
benchmarked against queueing ground truth directly (`benchmarks/sweep_accuracy.py`).

Open loop (rates):

1. One client first (the method's first tier): its P-latency is the unloaded latency ``a`` and
   its throughput ``X1`` sets the first rate, ``X1 / 2`` (or ``--min-rate``).
2. Grow the rate geometrically (x2) while the level meets the SLO and the target keeps up.
3. Once a level fails, place up to MAX_REFINE longer levels (4x the quick protocol) at the
   model's capacity, inside the bracket [highest passing, lowest failing rate]; stop early
   when the capacity's interval (not just the bracket) is within the tolerance. With no
   usable model, bisect the bracket's geometric midpoint until it is within the tolerance.
4. The capacity is read off the model; its interval is a parametric bootstrap of the levels'
   percentiles, each redrawn from its honest noise (below). The capacity reported is the
   bootstrap's 30th percentile when that is lower than the fit: above the truth overloads a
   service, below it only leaves headroom. A level that fell behind caps the answer.

Why levels near capacity need care: a queue's latencies are autocorrelated and its tail is
set by a few busy periods, so one level's P99 is noisy and biased low when short. Simulated
M/M/c levels near capacity had a log-standard deviation of 0.19 at 20 s measured (0.23 at 5 s,
0.13 at 80 s) and a median 7% low (18% at 5 s), while batch means of their 1 s windows said
3-5x less noise. The fit assumes at least that noise (NOISE_AT_20S) and corrects the bias
(BIAS_AT_20S), both scaled by the measured seconds. A tail fit (exponential above P80 or P90)
in place of the sample P99 cut the noise only from 0.19 to 0.15-0.18 in the same simulation:
the autocorrelation, not the order statistic, dominates, so it is not used.

The model: ln(percentile) as a straight line in the rate, fitted by weighted least squares
with a Gaussian kernel in ln(P / SLO) (KERNEL_WIDTH), so only levels near the crossing decide
it: the curve is flat near the unloaded latency and has a pole at saturation, and no single
global form fits both M/M/1 and M/M/8. A fit that does not rise with the rate, or that lands
more than FIT_SLACK outside the bracket, is not used: the capacity is then the bracket's
passing end.

Measured (`benchmarks/sweep_accuracy.py`, 20 seeds each, SLO P99 <= 100 ms): within +-5% of
the truth in 10 (M/M/1), 17 (M/M/2), 12 (M/M/4), 9 (M/M/8), 16 (M/G/4) and 15 (M/D/2) of 20
sweeps, > 5% above in 1-5; the interval covers the truth in 60-100%; 124-134 measured seconds
a sweep, 0.34-0.48 of the perf_analyzer-style binary search's. The accuracy goals (19/20,
never > 5% above) are missed: at +-5% the P99 of M/M/1 moves only ~6% (elasticity ~1.2), so
no level short of minutes pins it.

Closed loop (clients): 1, 2, 4, ... clients until the SLO breaks or throughput stops growing
(< 5% more for twice the clients), then bisection of the client count between the last
passing and the first failing level. The capacity is the highest throughput that met the SLO.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from optlab.sweep.slo import Slo

__all__ = [
    "LIMITS",
    "Level",
    "Probe",
    "Result",
    "Settings",
    "conclude",
    "judge",
    "knee",
    "next_probe",
]

Mode = Literal["open", "closed"]
Limit = Literal["slo", "saturation", "errors", "generator"]
LIMITS: tuple[Limit, ...] = ("slo", "saturation", "errors", "generator")

GROWTH = 2.0
SATURATION_SHORTFALL = 0.05  # achieved below 95% of the offered rate: the target fell behind
CLOSED_GAIN_MIN = 0.05  # twice the clients for < 5% more throughput: it stopped growing
FIRST_RATE_FRACTION = 0.5  # the first open rate, as a share of one client's throughput
MIN_RATE_FLOOR = 0.1  # requests/s: below this a level would take minutes to say anything
BOOTSTRAP = 400
INTERVAL_CONFIDENCE = 0.95
CONSERVATIVE_PERCENTILE = 30.0  # the capacity reported: this percentile of the fit's draws
KERNEL_WIDTH = 0.2  # ln units: a level at 1.2x or 0.8x the SLO weighs 0.6 of one at it
REFINE_DURATION_FACTOR = 4.0
FIT_SLACK = 0.10
MIN_REFINE = 1  # model-placed levels before the interval may stop the search
MAX_REFINE = 4
FIT_MAX_SLO = 3.0  # levels whose percentile is beyond 3x the SLO are far off the curve's part read
# A level's percentile is noisier than its seconds say: a queue's latencies are autocorrelated,
# and its tail is set by a few busy periods. Simulated M/M/c levels near capacity (20 s
# measured) had a log-standard deviation of 0.19 and a median 7% low (5 s: 0.23, 18% low;
# 80 s: 0.13, 2% low), while batch means of their 1 s windows said 3-5x less. These are the
# per-level noise and bias the fit assumes at the least, scaled as (20 s / measured)^power.
NOISE_AT_20S = 0.19
NOISE_POWER = 0.3
BIAS_AT_20S = 0.07
BIAS_POWER = 0.75
MAX_LEVELS = 40  # a safety stop: no sweep needs more probes than this


@dataclass(frozen=True)
class Settings:
    mode: Mode
    slo: Slo
    min_rate: float | None = None  # requests/s (open) or clients (closed)
    max_rate: float | None = None
    tolerance: float = 0.05  # the bracket's relative width at which the search stops
    budget_s: float | None = None  # measured seconds (warmup included) the sweep may spend
    max_error_rate: float = 0.01


@dataclass(frozen=True)
class Probe:
    """One level to measure: `clients` closed-loop clients, or `rate` requests/s."""

    mode: Mode
    load: float  # requests/s (open) or clients (closed)
    purpose: str  # "one client", "growth", "model", "bisection": said in the progress line

    @property
    def duration_factor(self) -> float:
        """Levels that narrow the bracket measure longer: their percentile decides the
        capacity, and a tail percentile's noise falls only as the square root of time."""
        return REFINE_DURATION_FACTOR if self.purpose in ("model", "bisection") else 1.0

    @property
    def key(self) -> tuple[str, float]:
        return (self.mode, round(self.load, 6))


@dataclass(frozen=True)
class Level:
    """What one measured level came to."""

    mode: Mode
    load: float  # requests/s offered (open) or clients (closed)
    achieved_qps: float | None
    p50_ms: float | None
    value_ms: float | None  # the SLO's percentile of the end-to-end latency
    value_se_ms: float | None  # its standard error (batch means of the level's seconds)
    error_rate: float
    valid: bool
    reasons: tuple[str, ...] = ()
    generator: str | None = None  # why the load generator, not the target, set the limit
    failed: str | None = None  # the run FAILED: its error
    measured_s: float = 0.0  # warmup + measurement
    duration_s: float = 0.0  # the measured phase alone
    run_id: int | None = None
    p99_ms: float | None = None
    window_p99_ms: tuple[float, ...] = ()  # the SLO's percentile in each measured second
    requests: int | None = None  # requests measured (the percentile's sample)

    @property
    def offered_qps(self) -> float | None:
        return self.load if self.mode == "open" else None


def judge(level: Level, settings: Settings) -> Limit | Literal["invalid"] | None:
    """None when the level meets the SLO and the target kept up; else the limit it hit."""
    if level.failed is not None:
        return "errors"
    if level.error_rate > settings.max_error_rate:
        return "errors"
    if level.generator is not None:
        return "generator"
    if level.mode == "open" and _fell_behind(level):
        return "saturation"
    if level.value_ms is None or level.value_ms > settings.slo.ms:
        return "slo"
    if not level.valid:
        return "invalid"
    return None


def _fell_behind(level: Level) -> bool:
    """Completions short of the offered rate by more than 5%, and by more than Poisson
    arrivals' own noise (3 sigma of the count): a short level at a low rate is not called
    saturated for a few requests the schedule happened not to send."""
    if level.achieved_qps is None:
        return True
    expected = level.load * level.duration_s
    missing = expected - level.achieved_qps * level.duration_s
    return level.achieved_qps < (1 - SATURATION_SHORTFALL) * level.load and missing > 3 * math.sqrt(
        max(expected, 1.0)
    )


@dataclass(frozen=True)
class Result:
    capacity_qps: float | None
    interval: tuple[float, float] | None
    knee_qps: float | None
    knee_clients: int | None
    limited_by: Limit | None
    message: str  # one sentence: what the sweep found
    method: str  # how the capacity was estimated
    notes: tuple[str, ...] = field(default=())


# -- the plan -------------------------------------------------------------------------------


def _open(levels: Sequence[Level]) -> list[Level]:
    return [level for level in levels if level.mode == "open"]


def _bracket(levels: Sequence[Level], settings: Settings) -> tuple[float | None, float | None]:
    """(highest passing load below the lowest failing one, lowest failing load)."""
    fails = [lv.load for lv in levels if judge(lv, settings) is not None]
    hi = min(fails) if fails else None
    passes = [
        lv.load for lv in levels if judge(lv, settings) is None and (hi is None or lv.load < hi)
    ]
    return (max(passes) if passes else None), hi


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
    return _next_open(levels, settings)


def _first_rate(levels: Sequence[Level], settings: Settings) -> float | None:
    if settings.min_rate is not None:
        return settings.min_rate
    pilot = next((lv for lv in levels if lv.mode == "closed"), None)
    if pilot is None or not pilot.achieved_qps:
        return None
    rate = max(pilot.achieved_qps * FIRST_RATE_FRACTION, MIN_RATE_FLOOR)
    if settings.max_rate is not None:
        rate = min(rate, settings.max_rate)
    return rate


def _next_open(levels: Sequence[Level], settings: Settings) -> Probe | None:
    opened = _open(levels)
    if settings.min_rate is None and not any(lv.mode == "closed" for lv in levels):
        return Probe("closed", 1, "one client")
    if not opened:
        pilot = levels[-1] if levels else None
        if pilot is not None and judge(pilot, settings) in ("errors", "slo"):
            return None  # one client alone misses: no rate will meet the SLO
        first = _first_rate(levels, settings)
        return None if first is None else Probe("open", first, "growth")
    lo, hi = _bracket(opened, settings)
    if hi is None:  # every level passed: grow, up to --max-rate
        top = max(lv.load for lv in opened)
        if settings.max_rate is not None and top >= settings.max_rate * (1 - 1e-9):
            return None
        rate = top * GROWTH
        if settings.max_rate is not None:
            rate = min(rate, settings.max_rate)
        return Probe("open", rate, "growth")
    if lo is None:
        # The lowest rate tried already fails. Look lower once (the one-client level passed),
        # unless the user fixed the lowest rate.
        lowest = min(lv.load for lv in opened)
        if settings.min_rate is not None or len(opened) > 1 or lowest <= MIN_RATE_FLOOR:
            return None
        return Probe("open", max(lowest / (GROWTH * GROWTH), MIN_RATE_FLOOR), "growth")
    if any(judge(lv, settings) == "generator" for lv in opened if lv.load <= hi):
        return None  # nothing at or above a generator-bound level can be claimed
    refined = _refinements(opened, settings)
    fit = _fit(opened, settings)
    if fit is None or not lo * (1 - FIT_SLACK) <= fit.capacity <= hi * (1 + FIT_SLACK):
        # No usable model: bisection, until the bracket itself is within the tolerance.
        if hi / lo - 1 <= settings.tolerance or refined >= MAX_REFINE + 2:
            return None
        return Probe("open", math.sqrt(lo * hi), "bisection")
    if refined >= MAX_REFINE:
        return None
    if refined >= MIN_REFINE:
        drawn = _bootstrap(opened, settings, fit)
        tail = (1 - INTERVAL_CONFIDENCE) / 2 * 100
        half_width = (
            None if drawn is None else float(np.ptp(np.percentile(drawn, [tail, 100 - tail]))) / 2
        )
        if half_width is not None and half_width <= settings.tolerance * fit.capacity:
            return None
    return Probe("open", _refine(fit, lo, hi), "model")


def _refinements(levels: Sequence[Level], settings: Settings) -> int:
    """Open levels measured after the first that failed: the growth phase's end."""
    for index, level in enumerate(levels):
        if judge(level, settings) is not None:
            return len(levels) - index - 1
    return 0


def _refine(fit: _Fit, lo: float, hi: float) -> float:
    """The model's capacity, kept inside the bracket: the levels there decide the answer, and
    each one measured at the capacity itself adds the most to the fit where it is read."""
    margin = 0.05 * (hi - lo)
    return min(max(fit.capacity, lo + margin), hi - margin)


def _next_closed(levels: Sequence[Level], settings: Settings) -> Probe | None:
    closed = sorted((lv for lv in levels if lv.mode == "closed"), key=lambda lv: lv.load)
    start = max(1, round(settings.min_rate or 1))
    cap = None if settings.max_rate is None else max(start, math.floor(settings.max_rate))
    if not closed:
        return Probe("closed", start, "one client" if start == 1 else "growth")
    fails = [lv for lv in closed if _closed_limit(lv, closed, settings) is not None]
    if not fails:
        top = int(closed[-1].load)
        if cap is not None and top >= cap:
            return None
        nxt = top * 2 if cap is None else min(top * 2, cap)
        return Probe("closed", nxt, "growth")
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


def _closed_limit(
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


# -- the model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fit:
    capacity: float
    floor_ms: float
    alpha: float
    beta: float
    points: int


def _floor(levels: Sequence[Level]) -> float | None:
    """The unloaded latency percentile: the one-client level's, else 0.8x the lowest seen."""
    pilot = next((lv for lv in levels if lv.mode == "closed" and lv.load == 1), None)
    if pilot is not None and pilot.value_ms:
        return pilot.value_ms
    values = [lv.value_ms for lv in levels if lv.value_ms]
    return 0.8 * min(values) if values else None


def _usable(levels: Sequence[Level], settings: Settings) -> list[Level]:
    """Open levels whose percentile says something about the curve: the target kept up."""
    return [
        lv
        for lv in _open(levels)
        if judge(lv, settings) in (None, "slo", "invalid")
        and lv.value_ms is not None
        and lv.value_ms <= FIT_MAX_SLO * settings.slo.ms
    ]


def _noise(level: Level) -> tuple[float, float]:
    """(log-bias, log-standard deviation) of the level's percentile: the simulated floor (see
    NOISE_AT_20S), or the level's own batch means when they say more."""
    scale = 20.0 / max(level.duration_s, 1.0)
    sd = NOISE_AT_20S * scale**NOISE_POWER
    if level.value_se_ms is not None and level.value_ms:
        sd = max(sd, level.value_se_ms / level.value_ms)
    return BIAS_AT_20S * min(scale, 4.0) ** BIAS_POWER, sd


def _points(usable: Sequence[Level]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fit's (rates, percentiles corrected for the short level's low bias, their SEs)."""
    rates = np.array([lv.load for lv in usable], dtype=float)
    noise = [_noise(lv) for lv in usable]
    values = np.array(
        [(lv.value_ms or 0.0) * math.exp(bias) for lv, (bias, _) in zip(usable, noise, strict=True)]
    )
    ses = values * np.array([sd for _, sd in noise])
    return rates, values, ses


def _line(x: np.ndarray, u: np.ndarray, w: np.ndarray) -> tuple[float, float] | None:
    """Weighted least squares u = alpha + beta x."""
    if len(x) < 2 or not np.all(np.isfinite(w)) or w.sum() <= 0:
        return None
    xm = float(np.average(x, weights=w))
    um = float(np.average(u, weights=w))
    sxx = float(np.sum(w * (x - xm) ** 2))
    if sxx <= 0:
        return None
    beta = float(np.sum(w * (x - xm) * (u - um))) / sxx
    return um - beta * xm, beta


def _solve(
    rates: np.ndarray, values: np.ndarray, ses: np.ndarray, floor: float, slo_ms: float
) -> tuple[float, float, float] | None:
    """ln(percentile) as a straight line in the rate, read where it crosses the SLO.

    Local on purpose: each level's weight (1 / its log-variance) is tapered by how far its
    percentile is from the SLO (a Gaussian kernel in ln(P / SLO), width KERNEL_WIDTH), so the
    levels near the crossing decide it and the curve's shape far from it (flat near the
    unloaded latency, a pole at saturation) does not bend the answer."""
    keep = values > floor if floor < slo_ms else np.ones(values.size, dtype=bool)
    if keep.sum() < 2:
        return None
    x, y = rates[keep], np.log(values[keep])
    sd = np.maximum(ses[keep] / values[keep], 1e-3)
    w = np.exp(-0.5 * ((y - math.log(slo_ms)) / KERNEL_WIDTH) ** 2) / sd**2
    line = _line(x, y, w)
    if line is None:
        return None
    alpha, beta = line
    if beta <= 0:
        return None
    capacity = (math.log(slo_ms) - alpha) / beta
    return capacity, alpha, beta


def _fit(levels: Sequence[Level], settings: Settings) -> _Fit | None:
    floor = _floor(levels)
    usable = _usable(levels, settings)
    if floor is None or len(usable) < 2:
        return None
    rates, values, ses = _points(usable)
    solved = _solve(rates, values, ses, floor, settings.slo.ms)
    if solved is None or not solved[0] > 0:
        return None
    return _Fit(solved[0], floor, solved[1], solved[2], len(usable))


def _bootstrap(
    levels: Sequence[Level], settings: Settings, fit: _Fit, seed: int = 0
) -> np.ndarray | None:
    """Draws of the model's capacity: each level's percentile redrawn from
    its own uncertainty (lognormal, so it stays positive), the line refitted."""
    rates, values, ses = _points(_usable(levels, settings))
    sigma = np.clip(ses / values, 1e-4, 2.0)
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(BOOTSTRAP):
        drawn = values * np.exp(rng.normal(0.0, sigma) - sigma**2 / 2)
        solved = _solve(rates, drawn, ses * drawn / values, fit.floor_ms, settings.slo.ms)
        if solved is not None and solved[0] > 0:
            found.append(solved[0])
    if len(found) < BOOTSTRAP // 2:
        return None
    return np.array(found)


# -- the answer -----------------------------------------------------------------------------


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


def _none_meets(levels: Sequence[Level], settings: Settings) -> Result:
    lowest = min(levels, key=lambda lv: (lv.mode != "closed", lv.load))
    limit = judge(lowest, settings)
    what = "1 client" if lowest.mode == "closed" else f"{lowest.load:,.1f}/s"
    seen = "-" if lowest.value_ms is None else f"{lowest.value_ms:,.2f} ms"
    pct = settings.slo.percentile.upper()
    detail = {
        "errors": f"errors ({lowest.failed or f'{lowest.error_rate:.1%} of requests'})",
        "generator": f"the load generator fell behind ({lowest.generator})",
        "saturation": "the target could not keep up",
        "invalid": "; ".join(lowest.reasons) or "the level was INVALID",
    }.get(str(limit), "")
    message = f"no rate meets {settings.slo.label}: at {what} {pct} was {seen}" + (
        f" ({detail})" if detail else ""
    )
    return Result(None, None, knee(levels), None, _contract_limit(limit), message, "none", ())


def _contract_limit(limit: str | None) -> Limit | None:
    """`invalid` (unstable, too short) is reported as saturation: the target did not hold
    steady at that load."""
    if limit == "invalid":
        return "saturation"
    return limit if limit in LIMITS else None


def conclude(levels: Sequence[Level], settings: Settings) -> Result:
    """Capacity, its interval, the knee and the limit, from the levels measured so far."""
    if not levels:
        return Result(None, None, None, None, None, "nothing was measured", "none")
    if settings.mode == "closed":
        return _conclude_closed(levels, settings)
    opened = _open(levels)
    lo, hi = _bracket(opened, settings)
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
        return Result(lo, (lo, lo), knee_qps, None, None, message, "highest rate measured")
    limiting = next(lv for lv in opened if lv.load == hi and judge(lv, settings) is not None)
    limit = _contract_limit(judge(limiting, settings))
    notes: list[str] = []
    if limit == "generator":
        # No capacity is claimed at or above a level the load generator could not drive.
        notes.append(f"the load generator fell behind at {hi:,.1f}/s: {limiting.generator}")
    fit = _fit(opened, settings) if limit in ("slo", "saturation") else None
    if fit is not None and lo * (1 - FIT_SLACK) <= fit.capacity <= hi * (1 + FIT_SLACK):
        # The fit pools every level's percentile; the bracket's ends are single noisy levels,
        # so the fit may stand a little outside them, not far.
        capacity = fit.capacity
        method = f"model fit on {fit.points} levels"
        drawn = _bootstrap(opened, settings, fit)
        if drawn is None:
            interval = (lo, hi)
        else:
            tail = (1 - INTERVAL_CONFIDENCE) / 2 * 100
            interval = (float(np.percentile(drawn, tail)), float(np.percentile(drawn, 100 - tail)))
            # Reported low on purpose: a capacity above the truth overloads the service,
            # one below it only leaves headroom.
            capacity = min(capacity, float(np.percentile(drawn, CONSERVATIVE_PERCENTILE)))
        # A level that fell behind is no noisy percentile: nothing at or above it is claimed.
        saturated = [lv.load for lv in opened if judge(lv, settings) == "saturation"]
        if saturated and capacity >= min(saturated):
            capacity = lo
        interval = (min(interval[0], capacity), max(interval[1], capacity))
    else:
        capacity = lo
        method = "highest passing rate of the bracket"
        interval = (lo, hi)
    if fit is None and limit == "slo":
        notes.append("the model did not fit: the capacity is the bracket's passing end")
    seen = "-" if limiting.value_ms is None else f"{limiting.value_ms:,.2f} ms"
    message = (
        f"capacity {capacity:,.1f}/s at {settings.slo.label} "
        f"[{interval[0]:,.1f}, {interval[1]:,.1f}]; limited by {limit} "
        f"(at {hi:,.1f}/s {pct} was {seen})"
    )
    return Result(capacity, interval, knee_qps, None, limit, message, method, tuple(notes))


def _conclude_closed(levels: Sequence[Level], settings: Settings) -> Result:
    closed = sorted((lv for lv in levels if lv.mode == "closed"), key=lambda lv: lv.load)
    limits = {lv.load: _closed_limit(lv, closed, settings) for lv in closed}
    fails = [lv for lv in closed if limits[lv.load] is not None]
    hi = min((lv.load for lv in fails), default=None)
    passes = [lv for lv in closed if limits[lv.load] is None and (hi is None or lv.load < hi)]
    knee_clients, knee_qps = _closed_knee(closed)
    if not passes:
        return _none_meets(levels, settings)
    best = max(passes, key=lambda lv: lv.achieved_qps or 0.0)
    capacity = best.achieved_qps or 0.0
    if hi is None:
        limit: Limit | None = None
        upper = capacity
        how = "every client count measured met the SLO"
    else:
        first_fail = next(lv for lv in closed if lv.load == hi)
        limit = _contract_limit(limits[hi])
        upper = max(capacity, first_fail.achieved_qps or capacity)
        how = f"limited by {limit} at {int(hi)} clients"
    message = (
        f"capacity {capacity:,.1f}/s at {settings.slo.label} with {int(best.load)} clients "
        f"[{capacity:,.1f}, {upper:,.1f}]; {how}"
    )
    return Result(
        capacity,
        (capacity, upper),
        knee_qps,
        knee_clients,
        limit,
        message,
        "highest throughput that met the SLO",
    )
