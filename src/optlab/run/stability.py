"""Did the throughput drift between the two halves of the measured phase, beyond its own noise?

A server whose per-second QPS swings ±25% on a quiet machine (batching, a garbage collector, a
thread pool) gives halves 10% apart by chance on short runs; a fixed percentage then voids runs
of a system that never changed. The halves are instead compared against the spread of their
own seconds: Welch's t-test on batch means. Per-second QPS is autocorrelated (a slow second is
often followed by another), so each half's seconds are grouped into batches of about
sqrt(n/2) seconds and the batches' means, close to independent, carry the test (the
batch-means method of simulation output analysis); a half too short for two such batches has
its seconds taken as the batches. benchmarks/stability_false_alarms.py measures the false alarms
on stationary noisy series and the power on real drifts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["COLLAPSE", "STABILITY_ALPHA", "HalvesTest", "collapsed", "halves_test"]

# Two-sided: a stationary series is called unstable this often at most when its batches are
# independent; simulated iid and AR(0.5) series with ±25% swings stay at or under 1%.
STABILITY_ALPHA = 0.005
MIN_BATCHES = 2  # per half: one batch has no spread to judge by
# A half this far below the other is a drift whatever the test says: with two batches a half
# (runs of 4-15 s) the t-test has one to two degrees of freedom and let a 99% fall in QPS
# pass as noise. A server swinging ±25% a second never has halves this far apart (at most
# 1.25 / 0.75, 40%), nor do the stationary series of benchmarks/stability_false_alarms.py.
COLLAPSE = 0.5


def collapsed(first: float, second: float) -> bool:
    """The slower half ran at under (1 - COLLAPSE) of the faster half's QPS."""
    return min(first, second) < (1 - COLLAPSE) * max(first, second)


@dataclass(frozen=True)
class HalvesTest:
    """Welch's t-test of the first half's batch means against the second half's."""

    first: float  # mean QPS of the first half's batches
    second: float
    batch_s: int  # seconds per batch
    batches: int  # batches per half
    t: float  # (second - first) / its standard error; inf when neither half varied
    df: float  # Welch-Satterthwaite degrees of freedom
    p: float  # two-sided

    @property
    def significant(self) -> bool:
        return self.p < STABILITY_ALPHA

    def describe(self) -> str:
        p = "p < 0.0001" if self.p < 1e-4 else f"p = {self.p:.2g}"
        return (
            f"{p} against the seconds' own noise, Welch's t-test on {self.batches} + "
            f"{self.batches} batches of {self.batch_s} s"
        )


def halves_test(qps_per_second: Sequence[float]) -> HalvesTest | None:
    """The test on the measured phase's per-second QPS (oldest first); None when a half has
    fewer than two seconds (then the noise cannot be told)."""
    n = len(qps_per_second)
    half = n // 2
    size = max(1, round(math.sqrt(half)))
    if half // size < MIN_BATCHES:
        size = 1  # a short run: its seconds taken as the batches (3 s a half: 3 batches)
    count = half // size
    if count < MIN_BATCHES:
        return None
    used = count * size
    # The seconds next to the middle are kept: those far from it are the ones let go.
    first = _batch_means(qps_per_second[half - used : half], size)
    second = _batch_means(qps_per_second[n - half : n - half + used], size)
    m1, m2 = sum(first) / count, sum(second) / count
    v1, v2 = _variance(first, m1) / count, _variance(second, m2) / count
    se2 = v1 + v2
    df_floor = float(count - 1)
    if se2 <= 0:
        t = 0.0 if m1 == m2 else math.copysign(math.inf, m2 - m1)
        return HalvesTest(m1, m2, size, count, t, df_floor, 1.0 if m1 == m2 else 0.0)
    df = se2**2 / ((v1**2 + v2**2) / df_floor)
    t = (m2 - m1) / math.sqrt(se2)
    return HalvesTest(m1, m2, size, count, t, df, _two_sided_p(t, df))


def _batch_means(values: Sequence[float], size: int) -> list[float]:
    return [sum(values[i : i + size]) / size for i in range(0, len(values), size)]


def _variance(values: Sequence[float], mean: float) -> float:
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def _two_sided_p(t: float, df: float) -> float:
    # scipy.special, not scipy.stats: the verdict runs after every measurement, and
    # scipy.stats takes a good part of a second to import.
    from scipy.special import stdtr  # type: ignore[import-untyped]  # no stubs

    return float(2 * stdtr(df, -abs(t)))
