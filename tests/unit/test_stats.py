"""metrics.stats against numpy/scipy, and against AR(1) series whose mean is known."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from optlab.metrics.stats import (
    REPEATED_CONFIDENCE,
    VERDICT_CONFIDENCE,
    Comparison,
    Interval,
    batch_means,
    beyond_noise,
    compare,
    metric_label,
    ratio_interval,
    run_interval,
    step_verdict,
)


def ar1(n: int, phi: float, mean: float, rng: np.random.Generator) -> np.ndarray:
    """A stationary AR(1) series: x_t = mean + phi (x_{t-1} - mean) + e_t, unit innovations."""
    noise = rng.standard_normal(n)
    out = np.empty(n)
    out[0] = noise[0] / math.sqrt(1 - phi**2)
    for i in range(1, n):
        out[i] = phi * out[i - 1] + noise[i]
    return out + mean


def test_batch_means_of_ten_windows_is_the_t_interval() -> None:
    values = np.random.default_rng(1).normal(10, 2, 10)
    got = batch_means(list(values), confidence=0.99)
    assert isinstance(got, Interval)
    low, high = sps.t.interval(0.99, 9, loc=values.mean(), scale=sps.sem(values))
    assert got.estimate == pytest.approx(values.mean())
    assert (got.low, got.high) == pytest.approx((low, high))
    assert got.n == 10 and got.confidence == 0.99 and "10 batches of 1" in got.method


def test_batch_means_batches_a_long_series() -> None:
    values = np.random.default_rng(2).normal(0, 1, 103)
    got = batch_means(list(values), confidence=0.95)
    assert got is not None
    # sqrt(103) = 10 batches of 10 windows; the 3 earliest windows are dropped from the spread.
    means = values[3:].reshape(10, 10).mean(axis=1)
    half = sps.t.ppf(0.975, 9) * np.std(means, ddof=1) / math.sqrt(10)
    assert got.estimate == pytest.approx(values.mean())
    assert got.high - got.estimate == pytest.approx(half)
    assert "10 batches of 10" in got.method
    long = batch_means(list(np.zeros(600) + np.arange(600) % 7))
    assert long is not None and "24 batches of 25" in long.method


def test_batch_means_too_short_or_gappy() -> None:
    assert batch_means([1.0] * 9) is None
    assert batch_means([1.0, 2.0, 3.0], min_batches=3) is not None
    with_gaps = batch_means([float("nan"), None, *range(10)])  # type: ignore[list-item]
    assert with_gaps is not None and with_gaps.n == 10
    with pytest.raises(ValueError):
        batch_means([1.0] * 20, confidence=1.0)


def test_run_interval_is_centred_on_the_run_figure() -> None:
    windows = list(np.random.default_rng(3).normal(5, 1, 30))
    spread = batch_means(windows)
    got = run_interval(windows, 4.2)
    assert spread is not None and got is not None
    assert got.estimate == 4.2
    assert got.high - got.low == pytest.approx(spread.high - spread.low)
    assert run_interval(windows[:5], 4.2) is None


@pytest.mark.parametrize("phi", [0.0, 0.5, 0.8])
def test_batch_means_covers_an_ar1_mean_at_its_nominal_level(phi: float) -> None:
    rng = np.random.default_rng(42)
    trials, hits, naive_hits = 400, 0, 0
    for _ in range(trials):
        series = ar1(600, phi, 3.0, rng)
        interval = batch_means(list(series), confidence=0.95)
        assert interval is not None
        hits += interval.low <= 3.0 <= interval.high
        naive = sps.t.interval(0.95, 599, loc=series.mean(), scale=sps.sem(series))
        naive_hits += naive[0] <= 3.0 <= naive[1]
    # 95% nominal; 400 trials give a binomial sd of ~1.1 points.
    assert 0.92 <= hits / trials <= 0.98
    if phi >= 0.5:
        assert naive_hits / trials < 0.85  # treating the seconds as independent undercovers


def _ratio_pct(log_ratio: float, low: float, high: float) -> tuple[float, float, float]:
    """A log-scale interval of a ratio back in % of the parent."""
    return tuple(math.expm1(v) * 100 for v in (log_ratio, low, high))  # type: ignore[return-value]


def test_compare_one_run_a_side_is_welch_on_the_log_scale() -> None:
    rng = np.random.default_rng(4)
    parent = rng.normal(100, 5, 10)
    child = rng.normal(80, 8, 10)
    got = compare(
        "p50",
        [list(parent)],
        [list(child)],
        parent_estimates=[parent.mean()],
        child_estimates=[child.mean()],
        higher_is_better=False,
    )
    # The delta method: se(ln mean) = se(mean) / mean, i.e. Welch on each side over its mean.
    ci = sps.ttest_ind(
        child / child.mean(), parent / parent.mean(), equal_var=False
    ).confidence_interval(0.99)
    log_ratio = math.log(child.mean() / parent.mean())
    expected = _ratio_pct(log_ratio, log_ratio + ci.low, log_ratio + ci.high)
    assert got.delta_pct == pytest.approx((child.mean() - parent.mean()) / parent.mean() * 100)
    assert (got.delta_pct, got.low_pct, got.high_pct) == pytest.approx(expected)
    assert got.significant and got.better is True and "Welch" in got.method
    assert got.confidence == 0.99
    worse = compare(
        "qps",
        [list(parent)],
        [list(child)],
        parent_estimates=[parent.mean()],
        child_estimates=[child.mean()],
        higher_is_better=True,
    )
    assert worse.significant and worse.better is False


def test_compare_paired_is_ttest_rel_on_log_ratios_when_the_pairs_spread_more() -> None:
    rng = np.random.default_rng(5)
    drift = np.linspace(0, 20, 6)  # a machine slowing down: cancels within each pair
    parent_est = 100 + drift + rng.normal(0, 0.5, 6)
    child_est = 95 + drift + rng.normal(0, 0.5, 6)
    tight = [[e - 0.001, e, e + 0.001] * 4 for e in parent_est]
    tight_c = [[e - 0.001, e, e + 0.001] * 4 for e in child_est]
    args = dict(parent_estimates=list(parent_est), child_estimates=list(child_est))
    got = compare("p50", tight, tight_c, higher_is_better=False, paired=True, **args)  # type: ignore[arg-type]
    logs_c, logs_p = np.log(child_est), np.log(parent_est)
    ci = sps.ttest_rel(logs_c, logs_p).confidence_interval(0.99)
    mean = float((logs_c - logs_p).mean())
    assert (got.delta_pct, got.low_pct, got.high_pct) == pytest.approx(
        _ratio_pct(mean, ci.low, ci.high)
    )
    assert got.significant and got.better is True and "paired" in got.method
    unpaired = compare("p50", tight, tight_c, higher_is_better=False, **args)  # type: ignore[arg-type]
    assert not unpaired.significant  # the drift swamps the 5% change without the pairing


def test_compare_repeats_use_run_to_run_spread_never_narrower_than_within() -> None:
    rng = np.random.default_rng(6)
    p_est, c_est = rng.normal(100, 3, 4), rng.normal(104, 3, 4)
    tight = [[e - 0.001, e, e + 0.001] * 4 for e in p_est]
    tight_c = [[e - 0.001, e, e + 0.001] * 4 for e in c_est]
    got = compare(
        "qps",
        tight,
        tight_c,
        parent_estimates=list(p_est),
        child_estimates=list(c_est),
        higher_is_better=True,
    )
    ci = sps.ttest_ind(np.log(c_est), np.log(p_est), equal_var=False).confidence_interval(0.99)
    mean = float(np.log(c_est).mean() - np.log(p_est).mean())
    assert (got.low_pct, got.high_pct) == pytest.approx(_ratio_pct(mean, ci.low, ci.high)[1:])
    assert "run" in got.method and "Welch" in got.method
    # Very noisy windows, identical run estimates: the within-run answer is the wider one.
    noisy = [list(rng.normal(e, 30, 12)) for e in [100.0, 100.0]]
    noisy_c = [list(rng.normal(e, 30, 12)) for e in [101.0, 101.0]]
    both = compare(
        "qps",
        noisy,
        noisy_c,
        parent_estimates=[100.0, 100.0],
        child_estimates=[101.0, 101.0],
        higher_is_better=True,
    )
    assert both.high_pct - both.low_pct > 10 and not both.significant
    assert "within-run spread is wider" in both.method


def test_repeated_confidence_applies_only_where_runs_measure_the_run_to_run_spread() -> None:
    windows = [[10.0, 10.1, 9.9, 10.05, 9.95]]
    one = compare(
        "qps",
        windows,
        windows,
        parent_estimates=[10.0],
        child_estimates=[10.0],
        higher_is_better=True,
        confidence=VERDICT_CONFIDENCE,
        repeated_confidence=REPEATED_CONFIDENCE,
    )
    assert one.confidence == VERDICT_CONFIDENCE
    three = compare(
        "qps",
        windows * 3,
        windows * 3,
        parent_estimates=[10.0, 10.2, 9.9],
        child_estimates=[10.1, 10.0, 9.8],
        higher_is_better=True,
        confidence=VERDICT_CONFIDENCE,
        repeated_confidence=REPEATED_CONFIDENCE,
        paired=True,
    )
    assert three.confidence == REPEATED_CONFIDENCE == pytest.approx(1 - 0.01 / 3)


def test_a_consistent_4x_gain_over_three_pairs_is_significant() -> None:
    """+300%, +376%, +315% pair by pair: the t interval on the log-ratios (scipy's) lies far
    above zero, and no latency interval crosses -100%."""
    parent_qps = np.array([500.0, 430.0, 520.0])
    child_qps = parent_qps * np.array([4.0, 4.76, 4.15])
    flat = [[q * f for f in (0.99, 1.0, 1.01, 1.0, 1.0)] for q in parent_qps]
    flat_c = [[q * f for f in (0.99, 1.0, 1.01, 1.0, 1.0)] for q in child_qps]
    got = compare(
        "qps",
        flat,
        flat_c,
        parent_estimates=list(parent_qps),
        child_estimates=list(child_qps),
        higher_is_better=True,
        confidence=VERDICT_CONFIDENCE,
        repeated_confidence=REPEATED_CONFIDENCE,
        paired=True,
    )
    logs = np.log(child_qps / parent_qps)
    ci = sps.ttest_rel(np.log(child_qps), np.log(parent_qps)).confidence_interval(
        REPEATED_CONFIDENCE
    )
    assert (got.delta_pct, got.low_pct, got.high_pct) == pytest.approx(
        _ratio_pct(float(logs.mean()), ci.low, ci.high)
    )
    assert got.low_pct > 50 and got.significant and got.better is True
    assert got.delta_pct == pytest.approx((np.prod(child_qps / parent_qps) ** (1 / 3) - 1) * 100)
    # The latency of the same runs: a quarter of the parent's, pairs spread wide apart.
    p99 = compare(
        "p99",
        flat,
        flat_c,
        parent_estimates=[40.0, 9.0, 60.0],
        child_estimates=[10.0, 8.0, 2.0],
        higher_is_better=False,
        confidence=VERDICT_CONFIDENCE,
        repeated_confidence=REPEATED_CONFIDENCE,
        paired=True,
    )
    assert -100 < p99.low_pct < p99.delta_pct < p99.high_pct
    assert not p99.significant  # -75%, -11%, -97%: too inconsistent over three pairs


def test_ratio_interval_never_crosses_minus_100() -> None:
    assert ratio_interval(0.0, 5.0)[1] > -100 and ratio_interval(0.0, 50.0)[1] >= -100
    change, low, high = ratio_interval(math.log(4), math.log(2))
    assert (change, low, high) == pytest.approx((300.0, 100.0, 700.0))


def test_paired_ratio_interval_covers_the_true_ratio_at_its_level() -> None:
    """Pairs with a shared drift and lognormal run-to-run noise around a true ratio of 1.3:
    the 95% interval covers 30% in about 95% of trials; an A/A family of three metrics at
    REPEATED_CONFIDENCE calls about 1% of trials a change."""
    rng = np.random.default_rng(8)
    trials, hits, alarms = 600, 0, 0
    windows = [[1.0, 1.0, 1.0]] * 4
    for _ in range(trials):
        drift = rng.normal(0, 0.3, 4)
        parent = np.exp(5 + drift + rng.normal(0, 0.05, 4))
        child = np.exp(5 + math.log(1.3) + drift + rng.normal(0, 0.05, 4))
        got = compare(
            "qps",
            windows,
            windows,
            parent_estimates=list(parent),
            child_estimates=list(child),
            higher_is_better=True,
            confidence=0.95,
            repeated_confidence=0.95,
            paired=True,
        )
        hits += got.low_pct <= 30.0 <= got.high_pct
        family = []
        for _metric in range(3):
            a = np.exp(5 + drift + rng.normal(0, 0.05, 4))
            b = np.exp(5 + drift + rng.normal(0, 0.05, 4))
            family.append(
                compare(
                    "qps",
                    windows,
                    windows,
                    parent_estimates=list(a),
                    child_estimates=list(b),
                    higher_is_better=True,
                    confidence=VERDICT_CONFIDENCE,
                    repeated_confidence=REPEATED_CONFIDENCE,
                    paired=True,
                    min_effect_pct=0.0,
                ).significant
            )
        alarms += any(family)
    assert 0.92 <= hits / trials <= 0.98  # binomial sd ~0.9 points
    assert alarms / trials <= 0.03  # 1% nominal


def test_beyond_noise_is_one_test() -> None:
    assert beyond_noise(5.0, 1.0, 9.0) is True
    assert beyond_noise(-5.0, -9.0, -1.0) is True
    assert beyond_noise(5.0, -1.0, 9.0) is False
    assert beyond_noise(0.5, 0.1, 0.9) is False  # under the 1% floor
    assert beyond_noise(5.0, None, 9.0) is None
    assert beyond_noise(math.nan, 1.0, 9.0) is None


def test_compare_min_effect_and_missing_data() -> None:
    flat = [[100.0, 100.01, 99.99] * 4]
    flat_c = [[100.5, 100.51, 100.49] * 4]
    kwargs = dict(parent_estimates=[100.0], child_estimates=[100.5], higher_is_better=True)
    small = compare("qps", flat, flat_c, **kwargs)  # type: ignore[arg-type]
    assert small.low_pct > 0 and not small.significant and small.better is None
    assert compare("qps", flat, flat_c, min_effect_pct=0.1, **kwargs).significant  # type: ignore[arg-type]
    short = compare("qps", [[100.0]], [[120.0]], **kwargs)  # type: ignore[arg-type]
    assert short.delta_pct == pytest.approx(0.5) and math.isnan(short.low_pct)
    assert not short.significant and short.better is None
    quick = compare(  # a quick 5 s run: its five windows, taken as independent
        "p50",
        [[2.0, 2.02, 1.98, 2.01, 1.99]],
        [[1.0, 1.01, 0.99, 1.02, 0.98]],
        parent_estimates=[2.0],
        child_estimates=[1.0],
        higher_is_better=False,
    )
    assert quick.significant and quick.better is True and "short run" in quick.method
    with pytest.raises(ValueError):
        compare(
            "qps",
            [[1.0], [2.0]],
            [[1.0]],
            parent_estimates=[1.0],
            child_estimates=[1.0],
            higher_is_better=True,
            paired=True,
        )


def test_aa_false_alarms_on_ar1_near_the_nominal_rate() -> None:
    rng = np.random.default_rng(7)
    trials, alarms = 400, 0
    for _ in range(trials):
        a, b = ar1(100, 0.6, 50, rng), ar1(100, 0.6, 50, rng)
        c = compare(
            "qps",
            [list(a)],
            [list(b)],
            parent_estimates=[a.mean()],
            child_estimates=[b.mean()],
            higher_is_better=True,
            confidence=0.95,
            min_effect_pct=0.0,
        )
        alarms += c.significant
    assert alarms / trials <= 0.09  # 5% nominal


def _c(metric: str, delta: float, better: bool | None) -> Comparison:
    return Comparison(metric, delta, delta - 1, delta + 1, better is not None, better, "t")


def test_step_verdict_and_flags() -> None:
    assert step_verdict([_c("qps", 0.3, None), _c("p99", -0.2, None)]) == ("within noise", [])
    assert step_verdict([_c("qps", 12.0, True), _c("p99", 0.2, None)]) == ("gain", [])
    assert step_verdict([_c("p50_ms", 3.0, False)]) == ("regressed", [])
    verdict, flags = step_verdict(
        [_c("qps", 40.0, True), _c("p50", 0.1, None), _c("p99", 25.0, False)]
    )
    assert verdict == "regressed"
    assert flags == ["optimised QPS (+40%), broke P99 (+25%)"]
    assert step_verdict([]) == ("within noise", [])
    assert [metric_label(m) for m in ("qps", "p99_ms", "p999", "p50", "cpu")] == [
        "QPS",
        "P99",
        "P99.9",
        "P50",
        "cpu",
    ]
