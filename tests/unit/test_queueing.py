"""The queueing ground truth: Erlang C, the M/M/c sojourn law, the simulator and capacities,
each checked against an independent computation (a direct sum, scipy, a textbook formula)."""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pytest
from scipy import integrate, stats  # type: ignore[import-untyped]

from optlab.reference.queueing import (
    capacity,
    erlang_c,
    md1_capacity,
    md1_wait_cdf,
    mean_service,
    mmc_capacity,
    mmc_mean_sojourn,
    mmc_sojourn_quantile,
    mmc_sojourn_sf,
    poisson_arrivals,
    service_times,
    simulate_sojourn,
    simulated_capacity,
    simulated_quantile,
)

Floats = npt.NDArray[np.float64]


def erlang_c_by_the_sum(servers: int, load: Fraction) -> float:
    """The textbook formula in exact rationals: no overflow, no cancellation."""
    top = load**servers / math.factorial(servers) * Fraction(servers) / (servers - load)
    below = sum(load**k / math.factorial(k) for k in range(servers))
    return float(top / (below + top))


def batch_mean_se(values: Floats, statistic: Callable[[Floats], float], batches: int = 25) -> float:
    """Standard error of ``statistic`` over the whole run, from consecutive batches.

    A queue's sojourn times are autocorrelated (one busy period delays many requests), so the
    i.i.d. formulas understate the error; batches long against a busy period are close to
    independent, and their spread / sqrt(batches) estimates the error of the whole-run value.
    """
    per_batch = [statistic(chunk) for chunk in np.array_split(values, batches)]
    return float(np.std(per_batch, ddof=1) / math.sqrt(batches))


def p99(values: Floats) -> float:
    return float(np.quantile(values, 0.99))


def mean(values: Floats) -> float:
    return float(np.mean(values))


@pytest.mark.parametrize("servers", [1, 2, 5, 16, 64])
@pytest.mark.parametrize("utilisation", [Fraction(1, 10), Fraction(7, 10), Fraction(99, 100)])
def test_erlang_c_matches_the_direct_sum(servers: int, utilisation: Fraction) -> None:
    service_rate = 100.0
    load = utilisation * servers
    arrival_rate = float(load) * service_rate
    assert erlang_c(servers, arrival_rate, service_rate) == pytest.approx(
        erlang_c_by_the_sum(servers, load), rel=1e-10
    )


def test_erlang_c_edges() -> None:
    assert erlang_c(1, 60.0, 100.0) == pytest.approx(0.6)  # M/M/1: P(wait) = ρ
    assert erlang_c(3, 0.0, 100.0) == 0.0
    assert erlang_c(2, 200.0, 100.0) == 1.0  # unstable: everyone waits
    with pytest.raises(ValueError, match="servers"):
        erlang_c(0, 1.0, 1.0)


def test_single_server_sojourn_is_exponential() -> None:
    # M/M/1 FCFS: T ~ Exp(μ - λ) exactly.
    mu, lam = 100.0, 60.0
    law = stats.expon(scale=1 / (mu - lam))
    for t in (0.001, 0.01, 0.05, 0.2):
        assert mmc_sojourn_sf(t, 1, lam, mu) == pytest.approx(law.sf(t), rel=1e-12)
    assert mmc_sojourn_quantile(0.99, 1, lam, mu) == pytest.approx(
        -math.log(0.01) / (mu - lam), rel=1e-9
    )
    assert mmc_sojourn_quantile(0.5, 1, lam, mu) == pytest.approx(law.ppf(0.5), rel=1e-9)
    assert mmc_mean_sojourn(1, lam, mu) == pytest.approx(law.mean())


def sojourn_sf_by_integration(t: float, servers: int, lam: float, mu: float) -> float:
    """(1-C) e^{-μt} + C P(W'+S > t), the convolution integrated numerically."""
    waits = erlang_c(servers, lam, mu)
    theta = servers * mu - lam
    # P(W' + S > t) = P(W' > t) + ∫_0^t θ e^{-θw} P(S > t - w) dw
    inside, _ = integrate.quad(lambda w: theta * math.exp(-theta * w - mu * (t - w)), 0, t)
    return (1 - waits) * math.exp(-mu * t) + waits * (math.exp(-theta * t) + inside)


@pytest.mark.parametrize(
    ("servers", "lam"),
    [
        (2, 140.0),  # θ = 60 < μ
        (4, 150.0),  # θ = 250 > μ
        (3, 200.0),  # θ = μ exactly: the (1 + μt) e^{-μt} limit
        (3, 200.0 + 1e-9),  # a hair away: the textbook form would cancel here
        (64, 6000.0),
    ],
)
def test_sojourn_sf_matches_numeric_convolution(servers: int, lam: float) -> None:
    mu = 100.0
    for t in (0.0005, 0.005, 0.02, 0.08, 0.3):
        expected = sojourn_sf_by_integration(t, servers, lam, mu)
        assert mmc_sojourn_sf(t, servers, lam, mu) == pytest.approx(expected, rel=1e-7, abs=1e-15)
    assert mmc_sojourn_sf(0.0, servers, lam, mu) == 1.0


def test_sojourn_quantile_inverts_the_sf_and_refuses_unstable_queues() -> None:
    for q in (0.5, 0.9, 0.99, 0.999):
        t = mmc_sojourn_quantile(q, 4, 300.0, 100.0)
        assert mmc_sojourn_sf(t, 4, 300.0, 100.0) == pytest.approx(1 - q, rel=1e-9)
    with pytest.raises(ValueError, match="unstable"):
        mmc_sojourn_quantile(0.99, 2, 200.0, 100.0)
    with pytest.raises(ValueError, match="unstable"):
        mmc_sojourn_sf(0.1, 2, 250.0, 100.0)
    with pytest.raises(ValueError, match="q must be"):
        mmc_sojourn_quantile(1.0, 2, 10.0, 100.0)


def test_mmc_capacity_two_servers_10ms_p99_100ms() -> None:
    rate = mmc_capacity(2, 100.0, 0.1, q=0.99)
    assert rate == pytest.approx(151.6, abs=0.1)
    assert mmc_sojourn_quantile(0.99, 2, rate, 100.0) == pytest.approx(0.1, rel=1e-9)
    # More servers, more capacity; a laxer SLO, more capacity; never past the bound cμ.
    assert mmc_capacity(4, 100.0, 0.1) > 2 * rate
    assert rate < mmc_capacity(2, 100.0, 0.2) < 200.0


def test_mmc_capacity_is_zero_when_service_alone_misses_the_slo() -> None:
    # S's own P99 is -ln(0.01) x 10 ms = 46 ms: a 40 ms SLO is missed with no queue at all.
    assert mmc_capacity(2, 100.0, 0.04) == 0.0
    assert mmc_capacity(2, 100.0, 0.047) > 0.0


def test_simulate_sojourn_by_hand() -> None:
    arrivals = np.array([0.0, 0.0, 0.0, 1.0, 10.0])
    services = np.array([4.0, 2.0, 3.0, 1.0, 1.0])
    # Two servers: the third waits for the second's server (free at 2), the fourth for the
    # first's (free at 4, before the third's at 5); the last finds both idle.
    assert simulate_sojourn(arrivals, services, 2).tolist() == [4.0, 2.0, 5.0, 4.0, 1.0]
    assert simulate_sojourn(arrivals, services, 1).tolist() == [4.0, 6.0, 9.0, 9.0, 1.0]
    assert simulate_sojourn(arrivals, services, 5).tolist() == services.tolist()
    with pytest.raises(ValueError, match="order"):
        simulate_sojourn(np.array([1.0, 0.0]), np.array([1.0, 1.0]), 1)


def test_poisson_arrivals_and_service_conventions() -> None:
    rng = np.random.default_rng(1)
    arrivals = poisson_arrivals(500.0, 400.0, rng)
    # The count is Poisson(200,000): within 5 standard deviations (~450).
    assert abs(arrivals.size - 200_000) < 5 * math.sqrt(200_000)
    assert arrivals[0] >= 0 and arrivals[-1] < 400.0 and bool(np.all(np.diff(arrivals) >= 0))
    # Gaps are Exp(rate): a KS test with this many draws rejects anything visibly different.
    assert stats.kstest(np.diff(arrivals), stats.expon(scale=1 / 500).cdf).pvalue > 1e-3

    n = 100_000
    exponential = service_times("exponential", 0.01, 0.0, n, rng)
    assert np.mean(exponential) == pytest.approx(0.01, rel=5 * 1 / math.sqrt(n))  # mean
    lognormal = service_times("lognormal", 0.01, 0.5, n, rng)
    assert np.median(lognormal) == pytest.approx(0.01, rel=0.02)  # median
    assert np.std(np.log(lognormal)) == pytest.approx(0.5, rel=0.02)
    assert np.mean(lognormal) == pytest.approx(mean_service("lognormal", 0.01, 0.5), rel=0.02)
    assert service_times("fixed", 0.01, 0.5, 3, rng).tolist() == [0.01] * 3


def test_simulated_mm2_matches_the_exact_sojourn_law() -> None:
    # M/M/2 at ρ = 0.7, half a million arrivals: enough for the P99's standard error to stay
    # under 2% of it (1.6% with this seed), which the bounds below are multiples of.
    lam, mu = 140.0, 100.0
    rng = np.random.default_rng(7)
    arrivals = poisson_arrivals(lam, 500_000 / lam, rng)
    sojourn = simulate_sojourn(
        arrivals, service_times("exponential", 1 / mu, 0, arrivals.size, rng), 2
    )
    exact_p99 = mmc_sojourn_quantile(0.99, 2, lam, mu)  # 82.7 ms
    se = batch_mean_se(sojourn, p99)
    assert se < 0.02 * exact_p99  # the run is long enough to mean something
    assert p99(sojourn) == pytest.approx(exact_p99, abs=4 * se)
    exact_mean = mmc_mean_sojourn(2, lam, mu)
    assert mean(sojourn) == pytest.approx(exact_mean, abs=4 * batch_mean_se(sojourn, mean))
    # And the whole distribution: the simulated tail at a few points, within the same error.
    for t in (0.01, 0.03, 0.06):
        tail = float(np.mean(sojourn > t))
        se_tail = batch_mean_se(sojourn, lambda v, t=t: float(np.mean(v > t)))
        assert tail == pytest.approx(mmc_sojourn_sf(t, 2, lam, mu), abs=4 * se_tail)


def test_simulated_md1_mean_wait_is_pollaczek_khinchine() -> None:
    # M/D/1: E[W] = λ s² / (2 (1 - ρ)), at ρ = 0.7.
    lam, s = 70.0, 0.01
    rng = np.random.default_rng(3)
    arrivals = poisson_arrivals(lam, 5000.0, rng)
    waits = simulate_sojourn(arrivals, np.full(arrivals.size, s), 1) - s
    expected = lam * s * s / (2 * (1 - lam * s))  # 11.67 ms
    se = batch_mean_se(waits, mean)
    assert se < 0.02 * expected
    assert mean(waits) == pytest.approx(expected, abs=4 * se)


def test_simulated_capacity_of_mm2_matches_erlang_c() -> None:
    exact = mmc_capacity(2, 100.0, 0.1)
    # Default length: over 20 seeds the simulated capacity spread 1.1/s (module docstring);
    # 4 standard deviations.
    simulated = simulated_capacity(2, "exponential", 0.01, 0.0, 0.1, seed=11)
    assert simulated == pytest.approx(exact, abs=4.5)
    # At the exact capacity the simulated P99 is the SLO: over 12 seeds it spread 2.5 ms.
    at_capacity = simulated_quantile(0.99, 2, exact, "exponential", 0.01, 0.0, seed=5)
    assert at_capacity == pytest.approx(0.1, abs=4 * 0.0025)
    with pytest.raises(ValueError, match="unstable"):
        simulated_quantile(0.99, 2, 200.0, "exponential", 0.01, 0.0)


def test_lognormal_capacity_lies_between_deterministic_and_exponential() -> None:
    # Same mean-ish service, rising variability: fixed (SCV 0) > lognormal σ=0.3 (SCV 0.09)
    # > exponential (SCV 1). The gaps (~10/s each) are ~10 standard deviations of a 500 s run.
    fixed = simulated_capacity(2, "fixed", 0.01, 0.0, 0.1, duration_s=500.0, seed=2)
    lognormal = simulated_capacity(2, "lognormal", 0.01, 0.3, 0.1, duration_s=500.0, seed=2)
    assert mmc_capacity(2, 100.0, 0.1) + 5 < lognormal < fixed - 5
    assert fixed < 200.0  # below the stability bound c/s


def test_capacity_dispatches_and_caches() -> None:
    assert capacity(2, "exponential", 0.01, 0.0, 0.1) == mmc_capacity(2, 100.0, 0.1)
    first = capacity(1, "fixed", 0.01, 0.0, 0.05)
    # M/D/1 with a 50 ms P99 SLO on 10 ms: between M/M/1's exact capacity and the bound.
    assert mmc_capacity(1, 100.0, 0.05) < first < 100.0
    before = capacity.cache_info().hits
    assert capacity(1, "fixed", 0.01, 0.0, 0.05) == first
    assert capacity.cache_info().hits == before + 1
    assert simulated_capacity(1, "fixed", 0.02, 0.0, 0.015) == 0.0  # service alone misses


def test_md1_wait_law_is_erlangs_formula() -> None:
    lam, s = 70.0, 0.01  # rho = 0.7
    assert md1_wait_cdf(0.0, lam, s) == pytest.approx(1 - lam * s)  # P(no wait) = 1 - rho
    assert md1_wait_cdf(-1.0, lam, s) == 0.0
    # The mean from the law (integral of 1 - F) is Pollaczek-Khinchine's lambda s^2/(2(1-rho)):
    # at rho = 0.5 the tail past 15 service times holds a negligible part of it.
    half = 50.0
    mean_wait, _ = integrate.quad(
        lambda t: 1 - md1_wait_cdf(t, half, s),
        0,
        0.15,
        limit=200,
        points=[s * k for k in range(1, 15)],
    )
    assert mean_wait == pytest.approx(half * s * s / (2 * (1 - half * s)), rel=1e-4)
    # And the simulated waits follow it point by point.
    rng = np.random.default_rng(8)
    arrivals = poisson_arrivals(lam, 3000.0, rng)
    waits = simulate_sojourn(arrivals, np.full(arrivals.size, s), 1) - s
    for t in (0.005, 0.02, 0.05):
        below = float(np.mean(waits <= t))
        se = batch_mean_se(waits, lambda v, t=t: float(np.mean(v <= t)))
        assert below == pytest.approx(md1_wait_cdf(t, lam, s), abs=4 * se)
    with pytest.raises(ValueError, match="cancels"):
        md1_wait_cdf(1.0, lam, s)  # 100 service times: the sum has lost its precision
    with pytest.raises(ValueError, match="unstable"):
        md1_wait_cdf(0.05, 100.0, s)


def test_md1_capacity_matches_the_simulated_one() -> None:
    exact = md1_capacity(0.01, 0.1)
    assert exact == pytest.approx(77.35, abs=0.01)
    # The simulation's own spread at its default length is ~1/s (module docstring).
    assert simulated_capacity(1, "fixed", 0.01, 0.0, 0.1, seed=4) == pytest.approx(exact, abs=3)
    assert md1_capacity(0.01, 0.005) == 0.0  # the service alone misses
    assert mmc_capacity(1, 100.0, 0.1) < exact < 100.0
