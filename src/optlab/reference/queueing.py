"""Queueing ground truth: what an FCFS c-server queue's sojourn time and capacity really are.

The synthetic target with ``servers`` set is such a queue (M/G/c under Poisson arrivals), so
these figures are what an honest measurement of it must report; ``tests/unit/test_queueing.py``,
``tests/unit/test_synthetic.py`` and ``benchmarks/sweep_accuracy.py`` judge optlab against them.

Exact, for exponential service (M/M/c):

* :func:`erlang_c`, the probability that an arrival waits, through the Erlang B recursion
  ``B(k) = a B(k-1) / (k + a B(k-1))`` with ``a = λ/μ``, then ``C = c B / (c - a (1 - B))``
  (Erlang 1917; any teletraffic text). The textbook sum of ``a^k / k!`` overflows and cancels
  long before c = 64; the recursion stays in [0, 1] throughout.
* :func:`mmc_sojourn_sf`: FCFS sojourn T = W + S. A waiting arrival's wait is Exp(θ = cμ - λ),
  independent of its own service S ~ Exp(μ), so
  ``P(T > t) = (1 - C) e^{-μt} + C P(W' + S > t)``, the second term the tail of a
  hypoexponential. The M/M/m queue and its waiting probability are in Kleinrock, *Queueing
  Systems* vol. 1 (1975), §3.5; the exponential law of a waiting arrival's FCFS wait follows
  from it (all c servers busy, departures at rate cμ).

Exact, for fixed service on one server (M/D/1): :func:`md1_wait_cdf`, Erlang's (1909) formula
for the FCFS waiting time, ``P(W <= t) = (1 - ρ) Σ_{k=0}^{⌊t/D⌋} (λ(kD - t))^k / k! e^{-λ(kD - t)}``
(Crommelin 1932), summed with ``math.fsum``: its terms alternate in sign and grow as e^{λt},
so it is exact to ~1e-9 while λt stays below about 9 (an SLO of up to ~10 service times at
any stable load), and refuses beyond; :func:`md1_capacity` searches the rate.

Simulated, for the others (M/D/c, M/G/c with lognormal service): :func:`simulate_sojourn` runs
the Kiefer–Wolfowitz recursion (each arrival takes the server that frees first) over a long
Poisson stream; :func:`simulated_quantile` and :func:`simulated_capacity` read the quantile and
search the rate. The capacity search uses common random numbers: one unit-rate arrival stream
and one set of service draws, time-scaled to each candidate rate, so every waiting time is
monotone in the rate and the search sees a smooth curve instead of fresh noise per step.

Simulation error, measured on two servers with 10 ms mean service and an SLO of P99 <= 100 ms
(M/M/2's exact capacity is 151.60/s): with the defaults (2,000 s of arrivals after a 100 s
warm-up), ``simulated_capacity`` with exponential service over 20 seeds had a mean of 151.25/s
and a standard deviation of 1.1/s (0.7%); over 6 seeds of 20,000 s, a mean of 151.59/s. Fixed
service (M/D/2, ~176/s) and lognormal σ = 0.3 (~165/s) spread 1.0/s over 10 seeds. Sojourn
times are autocorrelated (a busy period delays many requests), so formulas for independent
draws understate this error; it shrinks as 1/sqrt(duration_s). The cost grows with
rate x duration_s: about 0.25 s per million arrivals per evaluation; one capacity search took
~0.8 s here.
"""

from __future__ import annotations

import functools
import heapq
import math
from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy.optimize import brentq  # type: ignore[import-untyped]  # no stubs

__all__ = [
    "Distribution",
    "capacity",
    "erlang_c",
    "md1_capacity",
    "md1_wait_cdf",
    "mean_service",
    "mmc_capacity",
    "mmc_mean_sojourn",
    "mmc_sojourn_quantile",
    "mmc_sojourn_sf",
    "poisson_arrivals",
    "service_times",
    "simulate_sojourn",
    "simulated_capacity",
    "simulated_quantile",
]

Distribution = Literal["exponential", "fixed", "lognormal"]
FloatArray = npt.NDArray[np.float64]

DURATION_S = 2000.0
WARMUP_S = 100.0
# The capacity search stops within this fraction of the stability bound c/E[S]: far below the
# simulation's own error (~0.2%), so the search adds nothing measurable to it.
_RATE_RTOL = 1e-5


def _check_queue(servers: int, arrival_rate: float, service_rate: float) -> None:
    if servers < 1:
        raise ValueError(f"servers must be >= 1, not {servers}")
    if not service_rate > 0:
        raise ValueError(f"service_rate must be > 0, not {service_rate}")
    if not arrival_rate >= 0:
        raise ValueError(f"arrival_rate must be >= 0, not {arrival_rate}")


def _check_stable(servers: int, arrival_rate: float, service_rate: float) -> None:
    _check_queue(servers, arrival_rate, service_rate)
    if arrival_rate >= servers * service_rate:
        raise ValueError(
            f"unstable queue: arrival rate {arrival_rate:g}/s >= servers x service rate "
            f"{servers} x {service_rate:g}/s; the sojourn time has no stationary distribution"
        )


def _check_q(q: float) -> None:
    if not 0 < q < 1:
        raise ValueError(f"q must be in (0, 1), not {q}")


def erlang_c(servers: int, arrival_rate: float, service_rate: float) -> float:
    """P(an arrival waits) in M/M/c: Erlang C; 1.0 when the queue is unstable (λ >= cμ)."""
    _check_queue(servers, arrival_rate, service_rate)
    a = arrival_rate / service_rate
    if a >= servers:
        return 1.0
    b = 1.0  # Erlang B with 0 servers: every arrival is blocked
    for k in range(1, servers + 1):
        b = a * b / (k + a * b)
    return servers * b / (servers - a * (1.0 - b))


def mmc_mean_sojourn(servers: int, arrival_rate: float, service_rate: float) -> float:
    """E[T] in M/M/c, seconds: C/(cμ - λ) + 1/μ."""
    _check_stable(servers, arrival_rate, service_rate)
    c = erlang_c(servers, arrival_rate, service_rate)
    return c / (servers * service_rate - arrival_rate) + 1.0 / service_rate


def _hypoexp_sf(t: float, rate1: float, rate2: float) -> float:
    """P(X + Y > t) for independent X ~ Exp(rate1), Y ~ Exp(rate2).

    The textbook ``(θ e^{-μt} - μ e^{-θt}) / (θ - μ)`` cancels catastrophically as θ -> μ and
    overflows its pieces when one rate is far below the other. Written around the smaller rate
    a and the gap d = b - a >= 0 it is ``e^{-at} (1 + a t (1 - e^{-dt}) / (dt))``, with every
    factor bounded and the d -> 0 limit ``(1 + a t) e^{-at}`` reached smoothly.
    """
    a, b = min(rate1, rate2), max(rate1, rate2)
    x = (b - a) * t
    # (1 - e^{-x}) / x, which tends to 1 - x/2 as x -> 0
    ratio = -math.expm1(-x) / x if x > 1e-8 else 1.0 - x / 2
    return math.exp(-a * t) * (1.0 + a * t * ratio)


def mmc_sojourn_sf(t_s: float, servers: int, arrival_rate: float, service_rate: float) -> float:
    """P(T > t_s) for the FCFS sojourn time T = W + S in M/M/c (stable queues only)."""
    _check_stable(servers, arrival_rate, service_rate)
    if t_s <= 0:
        return 1.0
    c = erlang_c(servers, arrival_rate, service_rate)
    theta = servers * service_rate - arrival_rate
    return (1.0 - c) * math.exp(-service_rate * t_s) + c * _hypoexp_sf(t_s, theta, service_rate)


def mmc_sojourn_quantile(q: float, servers: int, arrival_rate: float, service_rate: float) -> float:
    """The q-quantile of the M/M/c FCFS sojourn time, seconds; ValueError when λ >= cμ."""
    _check_q(q)
    _check_stable(servers, arrival_rate, service_rate)
    target = 1.0 - q

    def excess(t: float) -> float:
        return mmc_sojourn_sf(t, servers, arrival_rate, service_rate) - target

    # T is at least S, whose quantile -ln(1-q)/μ is a lower bound; double up to a bracket.
    lo = 0.0
    hi = -math.log(target) / service_rate
    while excess(hi) > 0:
        lo, hi = hi, 2 * hi
    if excess(hi) == 0:
        return hi
    return float(brentq(excess, lo, hi, xtol=1e-15, rtol=1e-12))


def mmc_capacity(servers: int, service_rate: float, slo_s: float, q: float = 0.99) -> float:
    """The highest arrival rate (/s) whose M/M/c sojourn q-quantile is <= slo_s.

    0.0 when even an empty system misses the SLO (the service time's own quantile exceeds it).
    """
    _check_q(q)
    _check_queue(servers, 0.0, service_rate)

    def excess(rate: float) -> float:
        return mmc_sojourn_quantile(q, servers, rate, service_rate) - slo_s

    if excess(0.0) >= 0:
        return 0.0
    bound = servers * service_rate
    # The quantile grows without limit as λ -> cμ, so some rate just below the bound misses.
    hi = bound * (1 - 1e-9)
    if excess(hi) <= 0:
        return hi
    return float(brentq(excess, 0.0, hi, xtol=bound * 1e-12, rtol=1e-12))


# Erlang's M/D/1 sum cancels: its terms alternate in sign and grow as e^{λt}, so each carries
# a rounding error of ~1e-16 of its size. Past this absolute error the answer is refused.
MD1_MAX_ERROR = 1e-9


def md1_wait_cdf(t_s: float, arrival_rate: float, service_s: float) -> float:
    """P(W <= t_s) for the FCFS waiting time of an M/D/1 queue (stable queues only).

    ValueError where the sum's cancellation leaves an error above MD1_MAX_ERROR (λ t beyond
    about 9: an SLO many service times long at a high load); simulate there instead."""
    if not service_s > 0:
        raise ValueError(f"service_s must be > 0, not {service_s}")
    _check_stable(1, arrival_rate, 1.0 / service_s)
    if t_s < 0:
        return 0.0
    rho = arrival_rate * service_s
    terms = []
    for k in range(int(math.floor(t_s / service_s)) + 1):
        x = arrival_rate * (k * service_s - t_s)  # <= 0
        terms.append(x**k / math.factorial(k) * math.exp(-x))
    error = 4e-16 * math.fsum(abs(term) for term in terms) * (len(terms) + 1)
    if error > MD1_MAX_ERROR:
        raise ValueError(
            f"Erlang's M/D/1 sum at t = {t_s:g} s ({t_s / service_s:.0f} service times) and "
            f"{arrival_rate:g}/s cancels to an error of ~{error:.0e}: simulate "
            "(simulated_quantile) instead"
        )
    return min(1.0, max(0.0, (1.0 - rho) * math.fsum(terms)))


def md1_capacity(service_s: float, slo_s: float, q: float = 0.99) -> float:
    """The highest arrival rate (/s) whose M/D/1 sojourn q-quantile (wait + D) is <= slo_s;
    0.0 when the service time alone misses the SLO."""
    _check_q(q)
    if slo_s < service_s:
        return 0.0
    bound = 1.0 / service_s

    def excess(rate: float) -> float:
        return q - md1_wait_cdf(slo_s - service_s, rate, service_s)

    if excess(0.0) > 0:
        return 0.0
    hi = bound * (1 - 1e-9)
    if excess(hi) <= 0:
        return hi
    return float(brentq(excess, 0.0, hi, xtol=bound * 1e-12, rtol=1e-12))


def simulate_sojourn(arrivals_s: FloatArray, services_s: FloatArray, servers: int) -> FloatArray:
    """Each arrival's sojourn time in an FCFS c-server queue that starts empty.

    Arrivals must be in order. Each takes the server that frees first (Kiefer–Wolfowitz): a heap
    of the c servers' free times. ~0.25 s per million arrivals.
    """
    if servers < 1:
        raise ValueError(f"servers must be >= 1, not {servers}")
    arrivals = np.asarray(arrivals_s, dtype=np.float64)
    services = np.asarray(services_s, dtype=np.float64)
    if arrivals.shape != services.shape or arrivals.ndim != 1:
        raise ValueError(
            f"arrivals and services must be 1-D and the same length, not "
            f"{arrivals.shape} and {services.shape}"
        )
    if arrivals.size > 1 and bool(np.any(np.diff(arrivals) < 0)):
        raise ValueError("arrivals must be in nondecreasing order (FCFS is by arrival)")
    free = [-math.inf] * servers
    done = [0.0] * arrivals.size
    replace = heapq.heapreplace
    # Python floats and a list, not numpy scalars: this loop is the whole cost.
    for i, (arrival, service) in enumerate(zip(arrivals.tolist(), services.tolist(), strict=True)):
        first_free = free[0]
        finish = (arrival if arrival > first_free else first_free) + service
        replace(free, finish)
        done[i] = finish
    return np.asarray(done, dtype=np.float64) - arrivals


def poisson_arrivals(rate: float, duration_s: float, rng: np.random.Generator) -> FloatArray:
    """Poisson arrival times in [0, duration_s), seconds, in order."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, not {rate}")
    expected = rate * duration_s
    # Enough gaps to pass the horizon with overwhelming probability (+8 standard deviations);
    # on the rare shortfall, draw more from where the stream stopped.
    chunk = int(expected + 8 * math.sqrt(expected) + 16)
    times = np.cumsum(rng.exponential(1.0 / rate, chunk))
    while times[-1] < duration_s:
        more = times[-1] + np.cumsum(rng.exponential(1.0 / rate, chunk))
        times = np.concatenate([times, more])
    return times[: int(np.searchsorted(times, duration_s, side="left"))]


def service_times(
    distribution: Distribution,
    mean_or_median_s: float,
    sigma: float,
    n: int,
    rng: np.random.Generator,
) -> FloatArray:
    """n service times, seconds, with the synthetic target's conventions.

    exponential: ``mean_or_median_s`` is the mean; fixed: it is the time; lognormal: it is the
    median (log-mean ln(median)), ``sigma`` the log-standard deviation. ``sigma`` is ignored
    by the other two.
    """
    if mean_or_median_s < 0:
        raise ValueError(f"the service time must be >= 0, not {mean_or_median_s}")
    if distribution == "fixed" or mean_or_median_s == 0:
        return np.full(n, float(mean_or_median_s))
    if distribution == "exponential":
        return rng.exponential(mean_or_median_s, n)
    if distribution == "lognormal":
        return rng.lognormal(math.log(mean_or_median_s), sigma, n)
    raise ValueError(f"unknown distribution {distribution!r}")


def mean_service(distribution: Distribution, mean_or_median_s: float, sigma: float) -> float:
    """E[S] in seconds under :func:`service_times`' conventions (lognormal: median e^{σ²/2})."""
    if distribution == "lognormal":
        return mean_or_median_s * math.exp(sigma * sigma / 2)
    return mean_or_median_s


def _stability_bound(
    servers: int, distribution: Distribution, service_s: float, sigma: float
) -> float:
    mean = mean_service(distribution, service_s, sigma)
    if not mean > 0:
        raise ValueError("a zero service time has no finite capacity")
    return servers / mean


def simulated_quantile(
    q: float,
    servers: int,
    rate: float,
    distribution: Distribution,
    service_s: float,
    sigma: float,
    *,
    duration_s: float = DURATION_S,
    seed: int = 0,
    warmup_s: float = WARMUP_S,
) -> float:
    """The sojourn q-quantile (seconds) of an M/G/c queue, simulated.

    Poisson arrivals for ``warmup_s + duration_s``; those in the first ``warmup_s`` (the queue
    starts empty) are left out. ValueError when rate >= c/E[S] (unstable).
    """
    _check_q(q)
    bound = _stability_bound(servers, distribution, service_s, sigma)
    if rate >= bound:
        raise ValueError(f"unstable queue: rate {rate:g}/s >= c/E[S] = {bound:g}/s")
    rng = np.random.default_rng(seed)
    arrivals = poisson_arrivals(rate, warmup_s + duration_s, rng)
    services = service_times(distribution, service_s, sigma, arrivals.size, rng)
    sojourn = simulate_sojourn(arrivals, services, servers)
    kept = sojourn[arrivals >= warmup_s]
    if kept.size == 0:
        raise ValueError("no arrivals after the warm-up: raise duration_s or the rate")
    return float(np.quantile(kept, q))


def simulated_capacity(
    servers: int,
    distribution: Distribution,
    service_s: float,
    sigma: float,
    slo_s: float,
    q: float = 0.99,
    *,
    duration_s: float = DURATION_S,
    seed: int = 0,
    warmup_s: float = WARMUP_S,
) -> float:
    """The highest Poisson rate (/s) whose simulated sojourn q-quantile is <= slo_s.

    0.0 when the service time's own q-quantile misses the SLO. One unit-rate arrival stream and
    one set of service draws serve every candidate rate (common random numbers: see the module
    docstring); the stream covers the horizon up to the stability bound, so memory and time
    grow with c/E[S] x (warmup_s + duration_s).
    """
    _check_q(q)
    bound = _stability_bound(servers, distribution, service_s, sigma)
    horizon = warmup_s + duration_s
    rng = np.random.default_rng(seed)
    # Unit-rate arrivals over bound x horizon: divided by a rate r <= bound, they are a rate-r
    # Poisson stream whose first arrivals cover [0, horizon).
    unit = poisson_arrivals(1.0, bound * horizon, rng)
    services = service_times(distribution, service_s, sigma, unit.size, rng)

    def excess(rate: float) -> float:
        if rate <= 0:
            # An empty system: each request's sojourn is its service time.
            return float(np.quantile(services, q)) - slo_s
        arrivals = unit / rate
        n = int(np.searchsorted(arrivals, horizon))
        sojourn = simulate_sojourn(arrivals[:n], services[:n], servers)
        kept = sojourn[arrivals[:n] >= warmup_s]
        return float(np.quantile(kept, q)) - slo_s if kept.size else -slo_s

    if excess(0.0) >= 0:
        return 0.0
    hi = bound * (1 - 1e-6)
    if excess(hi) <= 0:
        return hi
    return float(brentq(excess, 0.0, hi, xtol=bound * _RATE_RTOL))


@functools.lru_cache(maxsize=256)
def capacity(
    servers: int,
    distribution: Distribution,
    service_s: float,
    sigma: float,
    slo_s: float,
    q: float = 0.99,
) -> float:
    """The highest Poisson rate (/s) meeting ``P_q(sojourn) <= slo_s`` on the synthetic target's
    queue: exact (Erlang C) for exponential service, :func:`simulated_capacity` with its
    defaults otherwise. Cached: tests and benchmarks ask for the same queues many times."""
    if distribution == "exponential":
        if service_s <= 0:
            raise ValueError("a zero service time has no finite capacity")
        return mmc_capacity(servers, 1.0 / service_s, slo_s, q)
    return simulated_capacity(servers, distribution, service_s, sigma, slo_s, q)
