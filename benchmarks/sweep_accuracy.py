"""How close `optlab sweep`'s capacity comes to queueing truth, and at what cost in seconds.

The sweep's strategy (`optlab.sweep.strategy`: `next_probe` / `conclude`) is driven with
SIMULATED levels: each probe's queue is simulated at the probe's rate for exactly the time the
driver would measure it (quick protocol: 1 s warmup, then max(5 s x duration_factor,
730 / rate) measured), and the level's figures are computed from the simulated latencies the
way a real level's are (P50/P99 over the measured phase, per-second windows, achieved rate =
completions in the measured phase / measured seconds). Scenarios: FCFS c-server queues with
Poisson arrivals, SLO P99 <= 100 ms: M/M/1, M/M/2, M/M/4, M/M/8 (exponential service, mean
10 ms; truth exact through Erlang C), M/G/4 (lognormal service, median 10 ms, sigma 0.5) and
M/D/2 (fixed 10 ms), whose truths come from long simulations (see TRUTH_NOTE).

In the same run a REFERENCE policy, modelled on Triton perf_analyzer's `--binary-search` with
`--latency-threshold`, measures the same queues: the start rate (ours) passes and the end rate
(4x the truth) fails, then bisection until the bracket is narrower than 2.5% of the capacity;
each probe is measured in 5 s windows until the last 3 are stable (each window's QPS and mean
latency within +-10% of the three's average: perf_analyzer's rule; at most 10 windows), its
P99 taken over those 3 windows; a probe that never stabilises counts as failing. Its capacity
is the bracket's passing end.

Goals (ours, per scenario): capacity within +-10% of the truth in >= 18 of 20 seeds (how many
land within +-5% and more than 5% above is printed too); the interval covers the truth in
>= 90% of sweeps; measured seconds (warmup + measure of every level) <= 50% of the
reference's (mean ratio, per scenario).
It is a measurement, not a test: PASS/MISS is printed and the exit status is 0 either way.

Run: ``PYTHONPATH=src python benchmarks/sweep_accuracy.py [--seeds 20] [--smoke]
[--scenarios M/M/2,M/D/2] [--verbose]``. With ``--real`` the sweeps run REAL levels instead
(``benchmarks/sweep_real.py``: in-process M/M/1, M/M/4, M/M/8 and an M/D/1 HTTP server, each
level a real run judged by the same checks as a user's), minutes per sweep:
``PYTHONPATH=src python benchmarks/sweep_accuracy.py --real --seeds 10``.
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from provenance import source_hashes

from optlab.config.slo import Slo
from optlab.reference.queueing import mmc_capacity, simulate_sojourn
from optlab.store.sweep_result import SweepResult
from optlab.sweep.strategy import Level, Probe, Settings, conclude, next_probe

SLO_MS = 100.0
Q = 0.99
SERVICE_S = 0.010
WARMUP_S = 1.0  # the quick protocol's
BASE_MEASURE_S = 5.0
SATURATED_STOP_S = 4.0
CODE = ("sweep/plan.py", "sweep/model.py", "sweep/answer.py", "sweep/probe.py")
MIN_REQUESTS = 730  # a level is extended until it holds about this many requests
REF_WINDOW_S = 5.0
REF_STABLE = 3
REF_MAX_WINDOWS = 10
REF_STABILITY = 0.10
REF_STEP = 0.025  # of the capacity
REF_END = 4.0  # x the truth
GOAL_WITHIN = 18  # of 20, within +-10% (9 of 10)
GOAL_COVER = 0.90
GOAL_RATIO = 0.5

# Simulated truths (no closed form): simulated_capacity's method (common random numbers over
# one unit-rate stream, brentq on the rate), 20,000 s of arrivals after 100 s of warmup, mean
# of 3 seeds; the seeds spread 0.3/s.
TRUTH_NOTE = "M/G/4 and M/D/2 by simulation (3 x 20,000 s)"
SIMULATED_TRUTH = {"M/G/4": 321.1, "M/D/2": 176.0}


@dataclass(frozen=True)
class Scenario:
    name: str
    servers: int
    distribution: str  # exponential, lognormal, fixed
    sigma: float = 0.0

    def services(self, n: int, rng: np.random.Generator) -> np.ndarray:
        if self.distribution == "exponential":
            return rng.exponential(SERVICE_S, n)
        if self.distribution == "lognormal":
            return rng.lognormal(math.log(SERVICE_S), self.sigma, n)
        return np.full(n, SERVICE_S)

    @property
    def mean_service_s(self) -> float:
        if self.distribution == "lognormal":
            return SERVICE_S * math.exp(self.sigma**2 / 2)
        return SERVICE_S

    def truth(self) -> float:
        if self.distribution == "exponential":
            return mmc_capacity(self.servers, 1 / SERVICE_S, SLO_MS / 1000, Q)
        return SIMULATED_TRUTH[self.name]


SCENARIOS = (
    Scenario("M/M/1", 1, "exponential"),
    Scenario("M/M/2", 2, "exponential"),
    Scenario("M/M/4", 4, "exponential"),
    Scenario("M/M/8", 8, "exponential"),
    Scenario("M/G/4", 4, "lognormal", 0.5),
    Scenario("M/D/2", 2, "fixed"),
)

# -- queueing truth: optlab.reference.queueing (Erlang C; the FCFS simulator) ----------------


def poisson(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    n = rng.poisson(rate * duration_s)
    return np.sort(rng.uniform(0.0, duration_s, n))


# -- one simulated level, as the driver would measure it -------------------------------------


def measure_s(rate: float, factor: float) -> float:
    return max(BASE_MEASURE_S * factor, MIN_REQUESTS / rate)


def _se(window_p99: list[float]) -> float | None:
    """The driver's standard error: batch means of the per-second P99s."""
    if len(window_p99) < 3:
        return None
    return float(np.std(window_p99, ddof=1) / math.sqrt(len(window_p99)))


def open_level(scn: Scenario, probe: Probe, rng: np.random.Generator) -> Level:
    rate = probe.load
    measured = measure_s(rate, probe.duration_factor)
    end = WARMUP_S + measured
    arrivals = poisson(rate, end, rng)
    so = simulate_sojourn(arrivals, scn.services(arrivals.size, rng), scn.servers)
    done = arrivals + so
    kept = arrivals >= WARMUP_S
    lat = so[kept] * 1000
    sent = arrivals[kept]
    completed = int(np.sum((done >= WARMUP_S) & (done < end)))
    windows = [
        lat[(sent >= WARMUP_S + k) & (sent < WARMUP_S + k + 1)] for k in range(int(measured))
    ]
    w99 = [float(np.percentile(w, 99)) for w in windows if w.size >= 5]
    p99 = float(np.percentile(lat, 99)) if lat.size else None
    if completed < 0.83 * rate * measured:
        # The driver stops a plainly saturated level once its backlog has risen for 3 s
        # (optlab.run.validity.plainly_saturated): about 4 s measured, not the whole level.
        measured = min(measured, SATURATED_STOP_S)
        end = WARMUP_S + measured
    return Level(
        "open",
        rate,
        completed / measured,
        float(np.percentile(lat, 50)) if lat.size else None,
        p99,
        _se(w99),
        0.0,
        lat.size >= 100,
        measured_s=end,
        duration_s=measured,
        p99_ms=p99,
        purpose=probe.purpose,
    )


def closed_level(scn: Scenario, probe: Probe, rng: np.random.Generator) -> Level:
    """k clients with no think time on the c servers (FCFS by issue time)."""
    clients = int(probe.load)
    expected = min(clients, scn.servers) / scn.mean_service_s
    measured = measure_s(expected, probe.duration_factor)
    end = WARMUP_S + measured
    issue = [(0.0, i) for i in range(clients)]
    free = [0.0] * scn.servers
    sent, lat = [], []
    draws = iter(scn.services(int(expected * end * 2 + 1000), rng))
    while issue:
        t, who = heapq.heappop(issue)
        if t >= end:
            continue
        start = max(t, free[0])
        finish = start + next(draws)
        heapq.heapreplace(free, finish)
        sent.append(t)
        lat.append(finish - t)
        heapq.heappush(issue, (finish, who))
    sent_a, lat_a = np.asarray(sent), np.asarray(lat) * 1000
    done = sent_a + lat_a / 1000
    kept = sent_a >= WARMUP_S
    lat_m = lat_a[kept]
    completed = int(np.sum((done >= WARMUP_S) & (done < end)))
    w99 = [
        float(
            np.percentile(
                lat_m[(sent_a[kept] >= WARMUP_S + k) & (sent_a[kept] < WARMUP_S + k + 1)], 99
            )
        )
        for k in range(int(measured))
    ]
    p99 = float(np.percentile(lat_m, 99))
    return Level(
        "closed",
        clients,
        completed / measured,
        float(np.percentile(lat_m, 50)),
        p99,
        _se(w99),
        0.0,
        True,
        measured_s=end,
        duration_s=measured,
        p99_ms=p99,
        purpose=probe.purpose,
    )


def ours(scn: Scenario, seed: int) -> tuple[SweepResult, float, int]:
    """One sweep with the strategy; (result, measured seconds, levels)."""
    rng = np.random.default_rng([seed, scn.servers, len(scn.distribution)])
    settings = Settings("open", Slo("p99", SLO_MS))
    levels: list[Level] = []
    while (probe := next_probe(levels, settings)) is not None:
        measure = open_level if probe.mode == "open" else closed_level
        levels.append(measure(scn, probe, rng))
    return conclude(levels, settings), sum(lv.measured_s for lv in levels), len(levels)


# -- the reference policy (perf_analyzer --binary-search --latency-threshold) ----------------


def _stable(windows: list[tuple[float, float]]) -> bool:
    last = windows[-REF_STABLE:]
    for index in (0, 1):
        values = [w[index] for w in last]
        mean = sum(values) / len(values)
        if mean <= 0 or any(abs(v - mean) > REF_STABILITY * mean for v in values):
            return False
    return True


def reference_probe(scn: Scenario, rate: float, rng: np.random.Generator) -> tuple[bool, float]:
    """(passed, measured seconds): 5 s windows of one continuing run until 3 are stable."""
    horizon = REF_WINDOW_S * REF_MAX_WINDOWS
    arrivals = poisson(rate, horizon, rng)
    so = simulate_sojourn(arrivals, scn.services(arrivals.size, rng), scn.servers)
    done = arrivals + so
    windows: list[tuple[float, float]] = []
    for k in range(REF_MAX_WINDOWS):
        lo, hi = k * REF_WINDOW_S, (k + 1) * REF_WINDOW_S
        finished = (done >= lo) & (done < hi)
        qps = float(np.sum(finished)) / REF_WINDOW_S
        mean = float(np.mean(so[finished])) if finished.any() else 0.0
        windows.append((qps, mean))
        if len(windows) >= REF_STABLE and _stable(windows):
            start = (k + 1 - REF_STABLE) * REF_WINDOW_S
            span = (done >= start) & (done < hi)
            p99 = float(np.percentile(so[span], 99)) * 1000
            return p99 <= SLO_MS, hi
    return False, horizon


def reference(scn: Scenario, seed: int, start: float, truth: float) -> tuple[float | None, float]:
    rng = np.random.default_rng([seed, scn.servers, len(scn.distribution), 7])
    lo, hi = start, REF_END * truth
    passed, spent = reference_probe(scn, lo, rng)
    if not passed:
        return None, spent
    failed, more = reference_probe(scn, hi, rng)
    spent += more
    if failed:
        return hi, spent
    while hi - lo > REF_STEP * truth:
        mid = (lo + hi) / 2
        ok, more = reference_probe(scn, mid, rng)
        spent += more
        lo, hi = (mid, hi) if ok else (lo, mid)
    return lo, spent


# -- the table -------------------------------------------------------------------------------


@dataclass
class Tally:
    within: int = 0
    within10: int = 0
    above: int = 0
    covered: int = 0
    none: int = 0
    worst: float = 0.0
    seconds: float = 0.0
    runs: int = 0

    def add(self, capacity: float | None, truth: float, seconds: float, interval=None) -> None:
        self.runs += 1
        self.seconds += seconds
        if capacity is None:
            self.none += 1
            self.worst = max(self.worst, 100.0, key=abs)
            return
        error = (capacity / truth - 1) * 100
        self.within += abs(error) <= 5
        self.within10 += abs(error) <= 10
        self.above += error > 5
        self.worst = max(self.worst, error, key=abs)
        if interval is not None and interval[0] <= truth <= interval[1]:
            self.covered += 1

    def line(self, who: str, interval: bool) -> str:
        cover = f"covers {self.covered:2d}/{self.runs}" if interval else "covers    -"
        none = f", no answer {self.none}" if self.none else ""
        return (
            f"{who:9s} within +-5% {self.within:2d}/{self.runs}  "
            f"+-10% {self.within10:2d}/{self.runs}  >5% above {self.above:2d}  "
            f"worst {self.worst:+6.1f}%  {cover}  measured {self.seconds / self.runs:6.1f} s{none}"
        )


def start_rate(scn: Scenario) -> float:
    """Our first open rate (one client's throughput / 2), which the reference starts from."""
    return 0.5 / scn.mean_service_s


def run_scenario(
    scn: Scenario, seeds: int, verbose: bool, log: Callable[[str], None]
) -> tuple[float, Tally, Tally]:
    truth = scn.truth()
    mine, ref = Tally(), Tally()
    for seed in range(seeds):
        result, seconds, count = ours(scn, seed)
        mine.add(result.capacity_qps, truth, seconds, result.capacity_interval)
        cap, ref_seconds = reference(scn, seed, start_rate(scn), truth)
        ref.add(cap, truth, ref_seconds)
        if verbose:
            iv = result.capacity_interval
            log(
                f"  seed {seed:2d}: ours {result.capacity_qps or 0:7.1f}/s "
                f"[{iv[0] if iv else 0:7.1f}, {iv[1] if iv else 0:7.1f}] {count:2d} levels "
                f"{seconds:5.0f} s ({result.method}); "
                f"reference {cap or 0:7.1f}/s {ref_seconds:4.0f} s"
            )
    return truth, mine, ref


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--scenarios", help="comma-separated names, e.g. M/M/2,M/D/2")
    parser.add_argument("--smoke", action="store_true", help="2 scenarios x 2 seeds")
    parser.add_argument("--verbose", action="store_true", help="one line per sweep")
    parser.add_argument(
        "--real",
        action="store_true",
        help="real levels instead: `optlab sweep` of in-process M/M/1, M/M/4, M/M/8 queues and "
        "an M/D/1 HTTP server (benchmarks/sweep_real.py); --scenarios picks among them",
    )
    args = parser.parse_args()
    if args.real:
        from sweep_real import run_real

        run_real(args.seeds, args.scenarios.split(",") if args.scenarios else None)
        return
    chosen = list(SCENARIOS)
    if args.scenarios:
        names = args.scenarios.split(",")
        chosen = [s for s in SCENARIOS if s.name in names]
    if args.smoke:
        chosen, args.seeds = [SCENARIOS[1], SCENARIOS[5]], 2
    started = time.monotonic()
    print(
        f"# sweep_accuracy: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {os.getloadavg()[0]:.2f}; code: {source_hashes(*CODE)}; "
        f"SLO P99 <= {SLO_MS:g} ms, "
        f"{args.seeds} seeds; truths: M/M/c exact (Erlang C), {TRUTH_NOTE}"
    )
    results = []
    for scn in chosen:
        truth, mine, ref = run_scenario(scn, args.seeds, args.verbose, print)
        ratio = mine.seconds / ref.seconds if ref.seconds else math.inf
        print(f"{scn.name}  truth {truth:7.1f}/s")
        print("  " + mine.line("ours", True))
        print("  " + ref.line("reference", False))
        print(f"  measured seconds ours/reference {ratio:.2f}")
        results.append((scn, mine, ref, ratio))
    print(f"# goals ({time.monotonic() - started:.0f} s in all)")
    for scn, mine, _ref, ratio in results:
        need = math.ceil(GOAL_WITHIN / 20 * mine.runs)
        print(
            f"{scn.name} capacity within +-10% in >= {need}/{mine.runs}: "
            f"{mine.within10}/{mine.runs} (short by {max(need - mine.within10, 0)}) "
            + verdict(mine.within10 >= need)
        )
        print(f"{scn.name} > 5% above the truth: {mine.above} (within +-5%: {mine.within})")
        cover = mine.covered / mine.runs
        print(
            f"{scn.name} interval covers the truth in >= 90%: {cover:.0%} "
            f"(short by {max(GOAL_COVER - cover, 0) * 100:.0f} points) "
            + verdict(cover >= GOAL_COVER)
        )
        print(
            f"{scn.name} measured seconds <= 50% of the reference's: ratio {ratio:.2f} "
            + verdict(ratio <= GOAL_RATIO)
        )


if __name__ == "__main__":
    main()
