"""Confidence intervals and step significance for per-second time series: pure functions.

Method: non-overlapping **batch means** (Law & Kelton, *Simulation Modeling and Analysis*,
ch. 9.5; Schmeiser, "Batch size effects in the analysis of simulation output", Operations
Research 30(3), 1982). A run's per-second windows (QPS, P50, P99 of each second) are
autocorrelated: a slow second tends to follow a slow second (a GC pause, a noisy neighbour, a
queue that takes a while to drain). Treating the windows as independent understates the
variance. Batch means cuts the series into ``b`` contiguous batches of ``m`` windows; once a
batch is much longer than the correlation time, the batch means are nearly independent and
nearly normal, and a Student-t interval on them with ``b - 1`` degrees of freedom has its
nominal coverage. Schmeiser shows that 10 to 30 batches is the useful range (fewer wastes
degrees of freedom, more makes batches short enough to stay correlated), so ``b`` is
``sqrt(n)`` clamped to [min_batches, 30]: a 600 s run gives 24 batches of 25 s.

Why not a block bootstrap (Künsch 1989): it needs the same block-length choice as batch
means, costs thousands of resamples per metric per run (the table recomputes every step), and
for the mean of a series it estimates the same long-run variance as batch means, without an
exact small-sample reference distribution. Batch means is closed-form, deterministic, and its
t interval is what the tests check against scipy.

A run-level figure (the P99 of the whole run, its QPS) is not the mean of its windows, but
its sampling noise scales the same way (the variance of an empirical quantile falls as 1/N
like a mean's), so :func:`run_interval` centres the batch-means half-width on the run's own
figure. A step is judged by Welch's t interval on the difference of the two sides; with
``--repeats`` the run-to-run spread is used too (never narrower than the within-run answer),
and with ``--paired`` (A B A B ...) the paired differences, in which a slow drift of a shared
machine cancels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from optlab.metrics.change import signed_pct

__all__ = [
    "Comparison",
    "Interval",
    "VERDICT_CONFIDENCE",
    "batch_means",
    "compare",
    "metric_label",
    "run_interval",
    "step_verdict",
]

MAX_BATCHES = 30
# The confidence a step's verdict should use (benchmarks/calibration.py): the verdict is a
# family of three tests (QPS, P50, P99), any of which calls the step, so each is held to
# about 1 - 0.01/3 (Bonferroni), rounded up to 0.999 because short runs on a shared machine
# also carry run-to-run noise their own windows cannot show. Measured on the synthetic target:
# 98/100 A/A within noise and 49/50 regressions of 10% found, against 89/100 at 0.99.
VERDICT_CONFIDENCE = 0.999
# Below min_batches windows, compare() still judges a run from its windows taken as
# independent batches of one (a quick 5 s run has 5 windows), if it has at least this many.
MIN_WINDOWS = 3


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    confidence: float
    n: int  # windows the interval was computed from
    method: str


@dataclass(frozen=True)
class Comparison:
    metric: str
    delta_pct: float
    low_pct: float
    high_pct: float
    significant: bool
    better: bool | None  # True improved beyond noise, False worsened beyond noise, None within
    method: str


@dataclass(frozen=True)
class _Spread:
    """A mean, its standard error and the degrees of freedom of that error."""

    mean: float
    se: float
    df: float
    method: str


def _clean(values: Sequence[float | None]) -> np.ndarray:
    array = np.array([np.nan if v is None else float(v) for v in values], dtype=float)
    finite: np.ndarray = array[np.isfinite(array)]
    return finite


def _t(confidence: float, df: float) -> float:
    from scipy import stats  # type: ignore[import-untyped]  # slow to import; no stubs

    return float(stats.t.ppf(0.5 + confidence / 2, df))


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), not {confidence}")


def _batch_spread(values: np.ndarray, min_batches: int) -> _Spread | None:
    """Batch means of a cleaned series; the earliest windows are dropped when n % m != 0."""
    n = len(values)
    if n < max(min_batches, 2):
        return None
    target = min(max(int(math.sqrt(n)), min_batches), MAX_BATCHES)
    size = max(1, n // target)
    batches = n // size
    used = values[n - batches * size :]  # the earliest windows are the least settled ones
    means = used.reshape(batches, size).mean(axis=1)
    se = float(np.std(means, ddof=1) / math.sqrt(batches))
    method = f"batch means ({batches} batches of {size} windows)"
    return _Spread(float(values.mean()), se, batches - 1, method)


def _window_spread(values: np.ndarray, min_batches: int) -> _Spread | None:
    """Batch means, or for a short run its windows taken as independent (labelled so)."""
    spread = _batch_spread(values, min_batches)
    if spread is not None or len(values) < MIN_WINDOWS:
        return spread
    se = float(np.std(values, ddof=1) / math.sqrt(len(values)))
    n = len(values)
    return _Spread(float(values.mean()), se, n - 1, f"{n} windows as batches (short run)")


def batch_means(
    values: Sequence[float], *, confidence: float = 0.99, min_batches: int = 10
) -> Interval | None:
    """CI of the mean of an autocorrelated per-second series (None when too short to say)."""
    _check_confidence(confidence)
    clean = _clean(values)
    spread = _batch_spread(clean, min_batches)
    if spread is None:
        return None
    half = _t(confidence, spread.df) * spread.se
    return Interval(
        spread.mean, spread.mean - half, spread.mean + half, confidence, len(clean), spread.method
    )


def run_interval(
    windows: Sequence[float], estimate: float, *, confidence: float = 0.99
) -> Interval | None:
    """CI for a run-level figure from its per-second window values, centred on `estimate`."""
    _check_confidence(confidence)
    clean = _clean(windows)
    spread = _batch_spread(clean, 10)
    if spread is None or not math.isfinite(estimate):
        return None
    half = _t(confidence, spread.df) * spread.se
    return Interval(
        estimate, estimate - half, estimate + half, confidence, len(clean), spread.method
    )


def _welch_df(parts: Sequence[tuple[float, float]]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of (se, df) terms."""
    total = sum(se**2 for se, _ in parts)
    denominator = sum(se**4 / df for se, df in parts if df > 0)
    if total == 0 or denominator == 0:
        return float(max(min(df for _, df in parts), 1))
    return total**2 / denominator


def _within(
    series: Sequence[Sequence[float]], estimates: Sequence[float]
) -> tuple[float, float, float, str] | None:
    """Mean of the run estimates, its within-run se and df, from each run's windows."""
    spreads = [_window_spread(_clean(s), 10) for s in series]
    if not spreads or any(s is None for s in spreads):
        return None
    k = len(spreads)
    parts = [(s.se / k, s.df) for s in spreads if s is not None]
    se = math.sqrt(sum(p[0] ** 2 for p in parts))
    methods = sorted({s.method for s in spreads if s is not None})
    return float(np.mean(estimates)), se, _welch_df(parts), "; ".join(methods)


def _nan_comparison(metric: str, delta: float, method: str) -> Comparison:
    return Comparison(metric, delta, math.nan, math.nan, False, None, method)


def _widest_spread(
    within: tuple[float, float, str],
    parent_estimates: Sequence[float],
    child_estimates: Sequence[float],
    *,
    paired: bool,
) -> tuple[float, float, str]:
    """(se, df, method): the within-run spread, or the run-to-run one where that is wider."""
    se, df, method = within
    k = len(parent_estimates)
    if paired and k >= 2:
        diffs = np.asarray(child_estimates, float) - np.asarray(parent_estimates, float)
        between_se = float(np.std(diffs, ddof=1) / math.sqrt(k))
        if between_se > se:
            return between_se, k - 1, f"paired t over {k} pairs (A B A B ...)"
        return se, df, f"paired, but the within-run spread is wider: {method}"
    # A single pair, or one run a side: there is no run-to-run spread to weigh.
    if paired or (k < 2 and len(child_estimates) < 2):
        return se, df, method
    between = []
    for estimates in (parent_estimates, child_estimates):
        n = len(estimates)
        between.append(
            (float(np.std(estimates, ddof=1) / math.sqrt(n)), n - 1) if n >= 2 else None
        )
    if all(b is not None for b in between):
        b_parts = [b for b in between if b is not None]
        between_se = math.sqrt(sum(b[0] ** 2 for b in b_parts))
        if between_se > se:
            runs = f"{k} vs {len(child_estimates)} runs"
            return between_se, _welch_df(b_parts), f"Welch t on run-to-run spread ({runs})"
    return se, df, method


def compare(
    metric: str,
    parent: Sequence[Sequence[float]],
    child: Sequence[Sequence[float]],
    *,
    parent_estimates: Sequence[float],
    child_estimates: Sequence[float],
    higher_is_better: bool,
    confidence: float = 0.99,
    min_effect_pct: float = 1.0,
    paired: bool = False,
) -> Comparison:
    """The child's change against the parent in %, its interval, and whether it is beyond noise.

    One run a side: Welch's t on the two runs' within-run (batch-means) errors. Several runs a
    side: also the run-to-run spread of the run estimates; whichever is wider is used, so the
    answer is never narrower than the within-run one. ``paired``: parent[i] and child[i] were
    measured back to back, and the interval is that of the mean paired difference.
    """
    _check_confidence(confidence)
    if len(parent) != len(parent_estimates) or len(child) != len(child_estimates):
        raise ValueError("one estimate per run series is needed on each side")
    if not parent_estimates or not child_estimates:
        raise ValueError("each side needs at least one run")
    if paired and len(parent) != len(child):
        raise ValueError("paired comparison needs as many parent runs as child runs")
    p_mean = float(np.mean(parent_estimates))
    c_mean = float(np.mean(child_estimates))
    if not (math.isfinite(p_mean) and math.isfinite(c_mean)) or p_mean == 0:
        return _nan_comparison(metric, math.nan, "no estimate")
    delta = (c_mean - p_mean) / abs(p_mean) * 100
    within_p = _within(parent, parent_estimates)
    within_c = _within(child, child_estimates)
    if within_p is None or within_c is None:
        return _nan_comparison(metric, delta, f"too few windows (< {MIN_WINDOWS}) for an interval")
    parts = [(within_p[1], within_p[2]), (within_c[1], within_c[2])]
    se = math.sqrt(within_p[1] ** 2 + within_c[1] ** 2)
    df = _welch_df(parts)
    method = f"Welch t on within-run spread: parent {within_p[3]}, child {within_c[3]}"
    se, df, method = _widest_spread(
        (se, df, method), parent_estimates, child_estimates, paired=paired
    )
    half = _t(confidence, df) * se
    low = (c_mean - p_mean - half) / abs(p_mean) * 100
    high = (c_mean - p_mean + half) / abs(p_mean) * 100
    beyond = low > 0 or high < 0
    significant = bool(beyond and abs(delta) >= min_effect_pct)
    better = None if not significant else (delta > 0) == higher_is_better
    return Comparison(metric, delta, low, high, significant, better, method)


def metric_label(metric: str) -> str:
    """`qps` -> QPS, `p99_ms` -> P99, `p999` -> P99.9; other names as given."""
    name = metric.removesuffix("_ms")
    if name == "qps":
        return "QPS"
    if name == "p999":
        return "P99.9"
    if len(name) > 1 and name[0] == "p" and name[1:].isdigit():
        return name.upper()
    return name


def step_verdict(comparisons: Sequence[Comparison]) -> tuple[str, list[str]]:
    """("gain" | "within noise" | "regressed", flags): any metric worse beyond noise regresses."""
    better = [c for c in comparisons if c.significant and c.better is True]
    worse = [c for c in comparisons if c.significant and c.better is False]
    flags = []
    if better and worse:
        gained = ", ".join(f"{metric_label(c.metric)} ({signed_pct(c.delta_pct)})" for c in better)
        broke = ", ".join(f"{metric_label(c.metric)} ({signed_pct(c.delta_pct)})" for c in worse)
        flags.append(f"optimised {gained}, broke {broke}")
    if worse:
        return "regressed", flags
    return ("gain" if better else "within noise"), flags
