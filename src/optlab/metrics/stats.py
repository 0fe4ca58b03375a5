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
figure.

A step's change is a ratio (QPS x4, P99 -30%), so :func:`compare` works on the log scale and
transforms back: its interval never crosses -100%, and x4 and /4 are equally far from zero.
One run a side: Welch's t on the two runs' relative within-run errors (the delta method,
se(ln x) = se(x)/x). With ``--repeats``: Welch on the runs' log estimates too; with ``--paired``
(A B A B ...): a t interval on the paired log-ratios, in which a slow drift of a shared machine
cancels. The wider of the within-run and run-to-run intervals is used.

The level. A step's verdict is a family of three tests (QPS, P50, P99), held to 1% false
alarms: each at 1 - 0.01/3 (Bonferroni), :data:`REPEATED_CONFIDENCE`, where repeats or pairs
measure the run-to-run spread. One run a side cannot see that spread (a shared machine's
drift between two runs); measured on the synthetic target (benchmarks/calibration.py), its
intervals need 99.9%, :data:`VERDICT_CONFIDENCE`, for the same 1-2% false alarms.
:func:`beyond_noise` is the one test every report applies to a change and its interval.
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
    "MIN_EFFECT_PCT",
    "REPEATED_CONFIDENCE",
    "VERDICT_CONFIDENCE",
    "batch_means",
    "beyond_noise",
    "log_error",
    "compare",
    "metric_label",
    "percentile",
    "ratio_interval",
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
# The level where repeats or pairs measure the run-to-run spread: the same family of three
# tests at 1% false alarms, Bonferroni, with nothing left unseen to round up for.
REPEATED_CONFIDENCE = 1 - 0.01 / 3
# A change smaller than this (%) is never called beyond noise, however tight its interval.
MIN_EFFECT_PCT = 1.0
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
    confidence: float = math.nan  # the level of [low_pct, high_pct]


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


def log_error(values: Sequence[float | None]) -> tuple[float, float] | None:
    """(standard error of ln(mean), its degrees of freedom) of a per-second series: the
    within-run error `compare` weighs (batch means; a short run's windows as batches), by
    the delta method se(ln x) = se(x) / x. None: too few windows, or a mean not above 0."""
    spread = _window_spread(_clean(values), 10)
    if spread is None or spread.mean <= 0:
        return None
    return spread.se / spread.mean, spread.df


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


def _logs(estimates: Sequence[float]) -> np.ndarray | None:
    """The natural logs of run estimates, or None where one is not a positive number."""
    array = np.asarray(estimates, dtype=float)
    if not np.all(np.isfinite(array)) or np.any(array <= 0):
        return None
    logs: np.ndarray = np.log(array)
    return logs


def _within(series: Sequence[Sequence[float]], logs: np.ndarray) -> _Spread | None:
    """The mean of the runs' log estimates and its within-run standard error: each run's
    batch-means error of its windows' mean, relative to that mean (the delta method:
    se(ln x) = se(x) / x), so that a ratio's interval is built on the log scale."""
    spreads = [_window_spread(_clean(s), 10) for s in series]
    if not spreads or any(s is None or s.mean <= 0 for s in spreads):
        return None
    k = len(spreads)
    parts = [(s.se / s.mean / k, s.df) for s in spreads if s is not None]
    se = math.sqrt(sum(p[0] ** 2 for p in parts))
    methods = "; ".join(sorted({s.method for s in spreads if s is not None}))
    return _Spread(float(logs.mean()), se, _welch_df(parts), methods)


def _nan_comparison(metric: str, delta: float, method: str) -> Comparison:
    return Comparison(metric, delta, math.nan, math.nan, False, None, method)


def _between(p_logs: np.ndarray, c_logs: np.ndarray, *, paired: bool) -> _Spread | None:
    """The run-to-run spread of the log difference, where the runs measure it: the paired
    log-ratios (k >= 2 pairs), or Welch on the two sides' log estimates (>= 2 runs a side).
    None: one run a side, or a single pair, has no run-to-run spread to weigh."""
    k = len(p_logs)
    if paired:
        if k < 2:
            return None
        ratios = c_logs - p_logs
        se = float(np.std(ratios, ddof=1) / math.sqrt(k))
        return _Spread(float(ratios.mean()), se, k - 1, f"paired t on log-ratios, {k} pairs")
    if k < 2 or len(c_logs) < 2:
        return None
    parts = [(float(np.std(x, ddof=1) / math.sqrt(len(x))), len(x) - 1) for x in (p_logs, c_logs)]
    se = math.hypot(parts[0][0], parts[1][0])
    diff = float(c_logs.mean() - p_logs.mean())
    method = f"Welch t on log run estimates, {k} vs {len(c_logs)} runs"
    return _Spread(diff, se, _welch_df(parts), method)


def beyond_noise(
    delta_pct: float | None,
    low_pct: float | None,
    high_pct: float | None,
    min_effect_pct: float = MIN_EFFECT_PCT,
) -> bool | None:
    """The one test of "changed beyond noise" every report applies to a change and its
    interval: the interval lies wholly on one side of zero and the change is at least
    `min_effect_pct`. None where a number is missing (not judged)."""
    values = (delta_pct, low_pct, high_pct)
    if any(v is None or not math.isfinite(v) for v in values):
        return None
    assert delta_pct is not None and low_pct is not None and high_pct is not None
    return (low_pct > 0 or high_pct < 0) and abs(delta_pct) >= min_effect_pct


def ratio_interval(log_ratio: float, half: float) -> tuple[float, float, float]:
    """(change, low, high) in % of a ratio known on the log scale: exp(d) - 1 and
    exp(d -+ half) - 1. Never below -100%, whatever the spread."""
    return (
        math.expm1(log_ratio) * 100,
        math.expm1(log_ratio - half) * 100,
        math.expm1(log_ratio + half) * 100,
    )


def compare(
    metric: str,
    parent: Sequence[Sequence[float]],
    child: Sequence[Sequence[float]],
    *,
    parent_estimates: Sequence[float],
    child_estimates: Sequence[float],
    higher_is_better: bool,
    confidence: float = 0.99,
    repeated_confidence: float | None = None,
    min_effect_pct: float = MIN_EFFECT_PCT,
    paired: bool = False,
) -> Comparison:
    """The child's change against the parent in %, its interval, and whether it is beyond noise.

    A ratio: the interval is built on the log scale and transformed back, so it never crosses
    -100% and a 4x gain and a 4x loss are equally far from zero. One run a side: Welch's t on
    the two runs' within-run (batch-means) errors of the log. Several runs a side: also Welch
    on the runs' log estimates; ``paired`` (parent[i] and child[i] measured back to back):
    a t interval on the paired log-ratios, in which a slow drift of the machine cancels.
    Whichever interval is wider is used, so the answer is never narrower than the within-run
    one. Where the runs measure the run-to-run spread (>= 2 pairs, >= 2 runs a side),
    ``repeated_confidence`` (when given) is the level instead of ``confidence``.
    """
    _check_confidence(confidence)
    if repeated_confidence is not None:
        _check_confidence(repeated_confidence)
    if len(parent) != len(parent_estimates) or len(child) != len(child_estimates):
        raise ValueError("one estimate per run series is needed on each side")
    if not parent_estimates or not child_estimates:
        raise ValueError("each side needs at least one run")
    if paired and len(parent) != len(child):
        raise ValueError("paired comparison needs as many parent runs as child runs")
    p_logs, c_logs = _logs(parent_estimates), _logs(child_estimates)
    if p_logs is None or c_logs is None:
        return _nan_comparison(metric, math.nan, "no positive estimate on each side")
    delta = math.expm1(float(c_logs.mean() - p_logs.mean())) * 100
    within_p, within_c = _within(parent, p_logs), _within(child, c_logs)
    if within_p is None or within_c is None:
        return _nan_comparison(metric, delta, f"too few windows (< {MIN_WINDOWS}) for an interval")
    between = _between(p_logs, c_logs, paired=paired)
    level = confidence
    if between is not None and repeated_confidence is not None:
        level = repeated_confidence
    parts = [(within_p.se, within_p.df), (within_c.se, within_c.df)]
    se = math.hypot(within_p.se, within_c.se)
    half = _t(level, _welch_df(parts)) * se
    method = f"Welch t on log within-run spread: parent {within_p.method}, child {within_c.method}"
    if between is not None:
        between_half = _t(level, between.df) * between.se
        if between_half > half:
            half, method = between_half, between.method
        else:
            method = f"{between.method}, but the within-run spread is wider: {method}"
    _, low, high = ratio_interval(float(c_logs.mean() - p_logs.mean()), half)
    significant = bool(beyond_noise(delta, low, high, min_effect_pct))
    better = None if not significant else (delta > 0) == higher_is_better
    return Comparison(metric, delta, low, high, significant, better, method, level)


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


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) by linear interpolation, as numpy's default; None if empty
    (a few values, no array: diagnose's readings, a stream's token times)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
