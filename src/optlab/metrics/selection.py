"""Which of several values of one knob is best, and only beyond noise: pure functions.

`optlab sweep-knob` measures k + 1 arms (the parent, the control, and k sibling values) in
blocks: every block measures every arm once, in a random order, so a slow drift of a shared
machine is shared by the arms of a block and cancels out of their differences. This module
reads those measurements.

**Effects.** Each value's change against the parent is the house statistic,
:func:`optlab.metrics.stats.compare` with ``paired=True`` (blocks are the pairs), so a
sweep-knob effect and a stacked-table change cannot disagree.

**The winner: multiple comparisons with the best (MCB), Holm-adjusted.** The arm with the
best mean log figure is compared with every other arm j on its blocks' paired log
differences ``d_b = ±(ln x_best,b - ln x_j,b)`` (the sign makes larger better). Each
comparison's standard error is the larger of the between-block one (the paired differences'
spread, ``k - 1`` degrees of freedom; from 2 blocks) and the within-run one (each run's
batch-means error of its own windows, the delta method on the log; Welch-Satterthwaite
degrees of freedom): the same "never narrower than the within-run interval" rule as
`compare`. A capacity cell's error (its sweep's interval) is partly the search's own resolution,
which repeats in every block of the arm: it is not divided down by the blocks (on the
benchmark's "additive" batching surface, dividing it let quick-sweep biases of a few % pass for
interactions in 4 of 20 tunes). Its p-value is two-sided although the question is
one-sided, because the best arm was chosen by the same data: for two arms this makes "the
best beats the other" a test at exactly ``alpha``; for more, the top two of several equal
arms are closer together than two arms alone, so the false-winner rate stays below
``alpha`` (Hsu, *Multiple Comparisons*, 1996, ch. 4, on comparing with the best). The m = k
comparisons are Holm-adjusted
(Holm 1979: the i-th smallest p-value times m - i + 1, made monotone), and a winner is named
only when every adjusted p-value is below ``alpha`` and its margin over the runner-up is at
least :data:`optlab.metrics.stats.MIN_EFFECT_PCT`. An arm with no valid measurement at
all takes part in no comparison and is reported apart (`unmeasured`). Otherwise the **tie
set** is the best arm and every arm it does not beat that way; the caller applies its
declared tie-break. "The parent is best" and "no value beats the parent beyond noise" are
both answers: the parent is an arm like the others.

Checked against brute force and scipy in tests/unit/test_selection.py; its false-winner rate
(A/A) and power are measured by benchmarks/knob_search.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from optlab.metrics.stats import MIN_EFFECT_PCT

__all__ = ["ALPHA", "Arm", "Effect", "PairTest", "Selection", "effect", "holm", "select_best"]

# The family-wise rate of naming a winner that is not better (A/A): one in twenty sweeps.
ALPHA = 0.05
# Degrees of freedom given to a within-run error with no count of its own.
_LARGE_DF = 1e6


@dataclass(frozen=True)
class Arm:
    """One arm's measurements, block by block: the log of its figure (nan where the block has
    no valid run of it), and that log's within-run standard error and its degrees of freedom
    (nan where the run has too few windows to say)."""

    logs: Sequence[float]
    within_se: Sequence[float]
    within_df: Sequence[float]
    # False: each block's error is partly the method's own (a capacity sweep's bracket and
    # model), shared by every block of the arm, so averaging blocks does not shrink it.
    averages_out: bool = True


@dataclass(frozen=True)
class PairTest:
    """The best arm against one other: the margin (% better), the p-value, Holm's."""

    other: int
    margin_pct: float
    blocks: int
    se: float  # of the mean log difference
    df: float
    p: float
    p_holm: float
    method: str


@dataclass(frozen=True)
class Selection:
    best: int | None  # the arm with the best mean; None: no arm has a figure
    winner: int | None  # `best`, where it beats every other arm beyond noise
    tie: tuple[int, ...]  # the arms not told apart from the best (the best first)
    tests: tuple[PairTest, ...]
    alpha: float
    unmeasured: tuple[int, ...] = ()  # arms with no valid measurement: in no comparison


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [1.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def _welch_df(parts: Sequence[tuple[float, float]]) -> float:
    numerator = sum(se**2 for se, _ in parts) ** 2
    denominator = sum(se**4 / df for se, df in parts if df > 0 and se > 0)
    return numerator / denominator if denominator > 0 else _LARGE_DF


def _t_dist() -> Any:
    from scipy import stats  # type: ignore[import-untyped]  # no stubs; only when judged

    return stats.t


def _two_sided_p(t: float, df: float) -> float:
    return float(min(1.0, 2.0 * _t_dist().sf(t, df)))


@dataclass(frozen=True)
class _Difference:
    """The mean log difference of two arms over the blocks both have, and its error."""

    mean: float
    blocks: int
    se: float
    df: float
    method: str


def _difference(a_arm: Arm, b_arm: Arm, sign: float) -> _Difference | None:
    """sign * (ln a - ln b) averaged over the blocks both arms have, with the larger of the
    between-block and within-run errors (by p-value at the mean: the surer of the two is
    never used); None: no block has both."""
    a = np.asarray(a_arm.logs, dtype=float)
    b = np.asarray(b_arm.logs, dtype=float)
    both = np.isfinite(a) & np.isfinite(b)
    k = int(both.sum())
    if k == 0:
        return None
    diffs = sign * (a[both] - b[both])
    mean = float(diffs.mean())
    errors: list[tuple[float, float, str]] = []
    parts: list[tuple[float, float]] = []
    for arm in (a_arm, b_arm):
        se = np.asarray(arm.within_se, dtype=float)[both]
        df = np.asarray(arm.within_df, dtype=float)[both]
        if not np.all(np.isfinite(se)):
            parts = []
            break
        # The mean of k block differences: each run's error once, over k; an error the blocks
        # share stays what one block's is (their root mean square).
        if arm.averages_out:
            parts += [
                (float(s) / k, float(d) if math.isfinite(d) else _LARGE_DF)
                for s, d in zip(se, df, strict=True)
            ]
        else:
            parts.append((float(np.sqrt(np.mean(se**2))), float(np.min(df))))
    if parts:
        errors.append((math.sqrt(sum(s**2 for s, _ in parts)), _welch_df(parts), "within-run"))
    if k >= 2:
        se_between = float(np.std(diffs, ddof=1) / math.sqrt(k))
        errors.append((se_between, float(k - 1), f"paired t over {k} blocks"))
    if not errors:
        return _Difference(mean, k, math.nan, math.nan, "no spread: one block, no windows")
    se, df, method = max(errors, key=lambda e: _t_quantile(0.975, e[1]) * e[0])
    return _Difference(mean, k, se, df, method)


def _t_quantile(q: float, df: float) -> float:
    return float(_t_dist().ppf(q, df))


def _pair(best: Arm, other: Arm, index: int, sign: float) -> PairTest | None:
    """The best arm against `other`; None: no block has both."""
    d = _difference(best, other, sign)
    if d is None:
        return None
    if not math.isfinite(d.se) or d.se <= 0:
        p = 0.0 if d.mean > 0 and d.se == 0 else 1.0
    else:
        p = _two_sided_p(d.mean / d.se, d.df)
    if d.mean <= 0:
        p = 1.0  # the best is never shown worse than another: a tie at most
    return PairTest(index, math.expm1(d.mean) * 100, d.blocks, d.se, d.df, p, p, d.method)


@dataclass(frozen=True)
class Effect:
    """An arm's change against the control in % with its interval, and whether that is
    beyond noise (`stats.beyond_noise`: the interval on one side of zero, the 1% floor)."""

    delta_pct: float
    low_pct: float
    high_pct: float
    significant: bool
    blocks: int
    method: str


def effect(control: Arm, arm: Arm, *, confidence: float = 1 - ALPHA) -> Effect | None:
    """`arm` against `control` on their shared blocks (paired), as a ratio: the interval is
    built on the log scale and never crosses -100%. None: no block has both."""
    from optlab.metrics.stats import beyond_noise, ratio_interval

    d = _difference(arm, control, 1.0)
    if d is None:
        return None
    if not math.isfinite(d.se):
        delta = math.expm1(d.mean) * 100
        return Effect(delta, math.nan, math.nan, False, d.blocks, d.method)
    half = _t_quantile(0.5 + confidence / 2, d.df) * d.se
    delta, low, high = ratio_interval(d.mean, half)
    return Effect(delta, low, high, bool(beyond_noise(delta, low, high)), d.blocks, d.method)


def select_best(
    arms: Sequence[Arm],
    *,
    higher_is_better: bool,
    alpha: float = ALPHA,
    min_effect_pct: float = MIN_EFFECT_PCT,
) -> Selection:
    """The best arm, whether it beats every other beyond noise (the winner), and the tie set."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), not {alpha}")
    sign = 1.0 if higher_is_better else -1.0
    means = []
    for arm in arms:
        logs = np.asarray(arm.logs, dtype=float)
        finite = logs[np.isfinite(logs)]
        means.append(sign * float(finite.mean()) if finite.size else -math.inf)
    if not arms or all(m == -math.inf for m in means):
        return Selection(None, None, (), (), alpha, tuple(range(len(arms))))
    best = int(np.argmax(means))
    unmeasured = tuple(i for i, m in enumerate(means) if m == -math.inf)
    raw = [
        _pair(arms[best], arm, i, sign)
        for i, arm in enumerate(arms)
        if i != best and i not in unmeasured
    ]
    # An arm measured, but never in a block beside the best: not told apart from it.
    apart = [t for t in raw if t is not None]
    no_shared = tuple(
        i
        for i in range(len(arms))
        if i != best and i not in unmeasured and all(t.other != i for t in apart)
    )
    adjusted = holm([t.p for t in apart])
    tests = [
        PairTest(t.other, t.margin_pct, t.blocks, t.se, t.df, t.p, q, t.method)
        for t, q in zip(apart, adjusted, strict=True)
    ]
    beaten = {t.other for t in tests if t.p_holm < alpha and t.margin_pct >= min_effect_pct}
    rest = [t.other for t in tests if t.other not in beaten] + list(no_shared)
    tie = (best, *sorted(rest, key=lambda i: -means[i]))
    winner = best if len(tie) == 1 else None
    return Selection(best, winner, tie, tuple(tests), alpha, unmeasured)
