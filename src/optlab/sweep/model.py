"""The sweep's model of a latency percentile against the rate, and what the levels say with
confidence (`optlab.sweep.strategy` has the method and its measured figures).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from optlab.sweep.probe import (
    Level,
    Settings,
    judge,
    open_levels,
    refining,
)

BOOTSTRAP = 400

INTERVAL_CONFIDENCE = 0.95

KERNEL_WIDTH = 0.2  # ln units: a level at 1.2x or 0.8x the SLO weighs 0.6 of one at it

NEAR_KERNELS = 2.0  # a level this many kernel widths from the SLO counts as near it

TRUST_Z = 1.0

FIT_SLACK = 0.10

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

EVIDENCE_Z = 1.96


@dataclass(frozen=True)
class Fit:
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
        for lv in open_levels(levels)
        if judge(lv, settings) in (None, "slo", "invalid")
        and lv.value_ms is not None
        and lv.value_ms <= FIT_MAX_SLO * settings.slo.ms
    ]


def level_noise(level: Level) -> tuple[float, float]:
    """(log-bias, log-standard deviation) of the level's percentile: the simulated floor (see
    NOISE_AT_20S), or the level's own batch means when they say more."""
    scale = 20.0 / max(level.duration_s, 1.0)
    sd = NOISE_AT_20S * scale**NOISE_POWER
    if level.value_se_ms is not None and level.value_ms:
        sd = max(sd, level.value_se_ms / level.value_ms)
    return BIAS_AT_20S * min(scale, 4.0) ** BIAS_POWER, sd


def _points(usable: Sequence[Level]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fit's (rates, percentiles corrected for the short level's low bias, their SEs)."""
    # The rate each level's arrivals really came at: a Poisson schedule's count over a short
    # level is off the offered rate by its own noise (1/sqrt(n)), and the percentile follows
    # the arrivals that came, not the rate asked for.
    rates = np.array([lv.achieved_qps or lv.load for lv in usable], dtype=float)
    noise = [level_noise(lv) for lv in usable]
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
    x, y = np.log(rates[keep]), np.log(values[keep])
    near = np.abs(y - math.log(slo_ms)) <= NEAR_KERNELS * KERNEL_WIDTH
    if near.sum() < 2:
        return None  # one level near the crossing: the line would hang on the far ones
    sd = np.maximum(ses[keep] / values[keep], 1e-3)
    w = np.exp(-0.5 * ((y - math.log(slo_ms)) / KERNEL_WIDTH) ** 2) / sd**2
    line = _line(x, y, w)
    if line is None:
        return None
    alpha, beta = line
    if beta <= 0:
        return None
    exponent = (math.log(slo_ms) - alpha) / beta
    if not -50 < exponent < 50:
        return None
    capacity = math.exp(exponent)
    return capacity, alpha, beta


def fit_model(levels: Sequence[Level], settings: Settings) -> Fit | None:
    floor = _floor(levels)
    usable = _usable(levels, settings)
    if floor is None or len(usable) < 2:
        return None
    # Interpolation only: a level on each side of the SLO that the target kept up with. Read
    # beyond the last level below the SLO, the line says nothing about where it crosses.
    if not any(judge(lv, settings) == "slo" for lv in usable) or not any(
        judge(lv, settings) is None for lv in usable
    ):
        return None
    rates, values, ses = _points(usable)
    solved = _solve(rates, values, ses, floor, settings.slo.ms)
    if solved is None or not solved[0] > 0:
        return None
    return Fit(solved[0], floor, solved[1], solved[2], len(usable))


def bootstrap(
    levels: Sequence[Level], settings: Settings, fit: Fit, seed: int = 0
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


def evidence_bounds(
    levels: Sequence[Level], settings: Settings
) -> tuple[float | None, float | None]:
    """(lower, upper): the highest rate whose level met the SLO beyond its own noise, and the
    lowest whose level missed it beyond its noise (or could not keep up at all). With the
    percentile rising with the rate, the capacity lies between them; each level's noise is
    the simulated floor of `level_noise`, its low bias corrected."""
    lower, upper = None, None
    log_slo = math.log(settings.slo.ms)
    for lv in levels:
        limit = judge(lv, settings)
        if limit in ("saturation", "generator", "errors"):
            upper = lv.load if upper is None else min(upper, lv.load)
            continue
        if not lv.value_ms:
            continue
        bias, sd = level_noise(lv)
        z = (log_slo - math.log(lv.value_ms) - bias) / sd
        if z >= EVIDENCE_Z and limit is None:
            lower = lv.load if lower is None else max(lower, lv.load)
        elif z <= -EVIDENCE_Z:
            upper = lv.load if upper is None else min(upper, lv.load)
    if lower is not None and upper is not None and lower >= upper:
        lower = None  # contradicting levels: let the fit's spread say it
    return lower, upper


def _trusted(level: Level, levels: Sequence[Level], settings: Settings) -> bool:
    """A passing level long enough to refine with, or one that passed beyond its noise."""
    if refining(level):
        return True
    if not level.value_ms:
        return False
    bias, sd = level_noise(level)
    return (math.log(settings.slo.ms) - math.log(level.value_ms) - bias) / sd >= TRUST_Z


def bracket(levels: Sequence[Level], settings: Settings) -> tuple[float | None, float | None]:
    """(highest passing load below the lowest failing one, lowest failing load)."""
    fails = [lv.load for lv in levels if judge(lv, settings) is not None]
    hi = min(fails) if fails else None
    passes = [
        lv.load for lv in levels if judge(lv, settings) is None and (hi is None or lv.load < hi)
    ]
    if hi is not None:
        # Once a level has failed, a short growth level that passed only narrowly no longer
        # vouches for its rate: a short level reads a queue's tail low.
        trusted = [lv.load for lv in levels if lv.load in passes and _trusted(lv, levels, settings)]
        passes = trusted or passes[:1] and [min(passes)]
    return (max(passes) if passes else None), hi
