"""Harness memory must not grow with the number of requests: histograms, not lists of samples.

A no-op target is driven open-loop at a fixed rate (constant arrivals, default 10,000
requests/s) with a Collector drained every runner tick, for a short and a long duration (1 and
5 minutes; ``--smoke``: 2 s and 4 s; ``--long`` adds 15 minutes). Each duration runs in a
fresh subprocess, so the runs share no heap and the second does not inherit the first's
high-water mark. The child samples its RSS with psutil every second and reports the peak, the
requests completed, and how much RSS grew per million requests.

Before the runs, a few seconds at the requested rate check that this machine sustains it; if
it does not, the rate is lowered to what it does sustain and the script says so (a rate the
generator cannot keep would make the long run's request count grow less than its duration).

Goal: peak RSS of the long run within 20 MiB of the short run's while the request count grew
at least 4x. A measurement, not a test: PASS/MISS is printed and the exit status is 0.

Run: ``PYTHONPATH=src python benchmarks/memory.py [--smoke] [--long] [--rate N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from provenance import source_hashes

RUNNER_TICK_S = 0.25  # optlab.run.phases.TICK_S: how often the runner drains the collector
SAMPLE_S = 1.0  # RSS sampling period
WARMUP_S = 1.0
MIB = 2**20
GOAL_GROWTH_MIB = 20.0
GOAL_COUNT_RATIO = 4.0
SUSTAINED_FRACTION = 0.97  # a calibration run completing less than this share fell behind
CALIBRATE_S = 5.0


@dataclass(frozen=True)
class ChildResult:
    seconds: float
    rate: float
    requests: int
    achieved_rate: float
    rss_start_mib: float  # after imports and set-up, before the generator starts
    rss_first_mib: float  # after the 1 s warmup: threads and buffers exist
    rss_peak_mib: float  # highest of the per-second samples (and the final one)
    maxrss_mib: float  # getrusage's high-water mark: catches a peak between two samples
    send_lag_p99_ms: float | None
    held_samples: int  # raw samples the collector still held at the end (bounded by design)
    # RSS at the end of each quarter of the run: growth that stops is warm-up (allocator
    # arenas, thread stacks touched for the first time); growth that goes on is a leak.
    rss_quarters_mib: list[float]

    @property
    def growth_mib(self) -> float:
        return self.rss_peak_mib - self.rss_first_mib


def noop(request: Any) -> Any:
    return request


def child(seconds: float, rate: float, max_in_flight: int | None) -> ChildResult:
    """One run in this (fresh) process; imports are here so the parent stays light."""
    import psutil

    from optlab.config.models import OpenLoad
    from optlab.load.generator import ThreadLoadGenerator
    from optlab.metrics.log import Collector
    from optlab.metrics.stages import SEND_LAG

    process = psutil.Process()
    extra: dict[str, Any] = {} if max_in_flight is None else {"max_in_flight": max_in_flight}
    load = OpenLoad(mode="open", rate=rate, arrival="constant", **extra)
    collector = Collector()
    generator = ThreadLoadGenerator(noop, list(range(64)), load, timeout_s=60.0)
    clock = time.perf_counter_ns
    rss_start = process.memory_info().rss
    collector.set_phase("warmup", clock())
    generator.start(collector)
    # A second of warmup, as the runner has: thread start-up (hundreds of open-loop threads)
    # is neither counted in the rate nor mistaken for growth.
    warm_end = clock() + int(WARMUP_S * 1e9)
    while (left := warm_end - clock()) > 0:
        time.sleep(min(RUNNER_TICK_S, left / 1e9))
        collector.drain()
    samples: list[int] = [process.memory_info().rss]
    start = clock()
    collector.set_phase("measure", start)
    end = start + int(seconds * 1e9)
    next_sample = start + int(SAMPLE_S * 1e9)
    # The runner's loop: sleep a tick, drain; RSS is sampled once a second on the same thread.
    while (left := end - clock()) > 0:
        time.sleep(min(RUNNER_TICK_S, left / 1e9))
        collector.drain()
        if clock() >= next_sample:
            samples.append(process.memory_info().rss)
            next_sample += int(SAMPLE_S * 1e9)
    stop_at = clock()
    collector.set_phase("done", stop_at)
    report = generator.stop(drain_timeout_s=5.0)
    collector.finish()
    if report.failure is not None:
        raise RuntimeError("the generator failed") from report.failure
    samples.append(process.memory_info().rss)
    # samples[0] was taken at the end of the warmup and the last one after the stop.
    measured = samples[1:-1] or samples
    quarters = [measured[max(0, len(measured) * q // 4 - 1)] for q in (1, 2, 3, 4)]
    ok, _ = collector.totals("measure")
    lag = collector.histograms("measure").get(SEND_LAG)
    lag_p99 = lag.value_at_percentile_ns(99.0) if lag is not None else None
    # Linux reports ru_maxrss in KiB.
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return ChildResult(
        seconds=(stop_at - start) / 1e9,
        rate=rate,
        requests=ok,
        achieved_rate=ok / ((stop_at - start) / 1e9),
        rss_start_mib=rss_start / MIB,
        rss_first_mib=samples[0] / MIB,
        rss_peak_mib=max(samples) / MIB,
        maxrss_mib=maxrss / MIB,
        send_lag_p99_ms=None if lag_p99 is None else lag_p99 / 1e6,
        held_samples=collector.held_samples(),
        rss_quarters_mib=[value / MIB for value in quarters],
    )


def run_child(seconds: float, rate: float, max_in_flight: int | None) -> ChildResult:
    command = [sys.executable, __file__, "--child", str(seconds), "--rate", str(rate)]
    if max_in_flight is not None:
        command += ["--max-in-flight", str(max_in_flight)]
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, timeout=seconds + 120
    )
    if done.returncode != 0:
        raise RuntimeError(f"child run failed ({done.returncode}):\n{done.stderr}")
    return ChildResult(**json.loads(done.stdout.strip().splitlines()[-1]))


def sustained_rate(rate: float, seconds: float, max_in_flight: int | None) -> float:
    """The requested rate if this machine keeps it, else the highest it kept (halving)."""
    while True:
        got = run_child(seconds, rate, max_in_flight)
        if got.achieved_rate >= SUSTAINED_FRACTION * rate:
            return rate
        # Two significant digits of 90% of what it achieved: below the rate it did keep.
        lower = float(f"{max(1.0, got.achieved_rate * 0.9):.2g}")
        print(
            f"# rate {rate:,.0f}/s not sustained (achieved {got.achieved_rate:,.0f}/s): "
            f"trying {lower:,.0f}/s"
        )
        if lower >= rate or got.requests == 0:
            return lower
        rate = lower


def code_id() -> str:
    return source_hashes(
        "load/generator.py", "metrics/log.py", "metrics/windows.py", "metrics/histogram.py"
    )


def describe(r: ChildResult) -> str:
    lag = "-" if r.send_lag_p99_ms is None else f"{r.send_lag_p99_ms:.3f} ms"
    per_million = r.growth_mib / (r.requests / 1e6) if r.requests else float("nan")
    quarters = ", ".join(f"{value:.1f}" for value in r.rss_quarters_mib)
    return (
        f"{r.seconds:6.0f} s  {r.requests:>11,} requests ({r.achieved_rate:,.0f}/s)  "
        f"RSS before start {r.rss_start_mib:.1f} MiB, after warmup {r.rss_first_mib:.1f} MiB, "
        f"peak {r.rss_peak_mib:.1f} MiB (getrusage max {r.maxrss_mib:.1f} MiB)  "
        f"growth after warmup {r.growth_mib:+.1f} MiB = {per_million:+.3f} MiB per million "
        f"requests; RSS at each quarter {quarters} MiB; send-lag P99 {lag}; "
        f"raw samples held at end {r.held_samples:,}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="2 s and 4 s")
    parser.add_argument("--long", action="store_true", help="add the 15-minute run")
    parser.add_argument("--rate", type=float, default=10_000.0, help="requests/s")
    parser.add_argument("--max-in-flight", type=int, default=None, help="open-loop threads")
    parser.add_argument("--child", type=float, metavar="SECONDS", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(asdict(child(args.child, args.rate, args.max_in_flight))))
        return 0

    durations = [2.0, 4.0] if args.smoke else [60.0, 300.0]
    if args.long:
        durations.append(900.0)
    load1, _, _ = os.getloadavg()
    print(
        f"# memory: Python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{load1:.2f}; code: {code_id()}; open loop, constant arrivals, no-op target, "
        f"collector drained every {RUNNER_TICK_S:g} s, RSS sampled every {SAMPLE_S:g} s"
    )
    calibrate_s = 1.0 if args.smoke else CALIBRATE_S
    rate = sustained_rate(args.rate, calibrate_s, args.max_in_flight)
    if rate != args.rate:
        print(f"# rate lowered from {args.rate:,.0f}/s to {rate:,.0f}/s: what this machine kept")
    else:
        print(f"# rate {rate:,.0f}/s: sustained in a {calibrate_s:g} s check")

    results = []
    for seconds in durations:
        result = run_child(seconds, rate, args.max_in_flight)
        results.append(result)
        print(f"run {describe(result)}")

    short = results[0]
    print("# goal")
    for long in results[1:]:
        delta = long.rss_peak_mib - short.rss_peak_mib
        ratio = long.requests / short.requests if short.requests else float("inf")
        extra_m = (long.requests - short.requests) / 1e6
        per_million = delta / extra_m if extra_m > 0 else float("nan")
        small = delta < GOAL_GROWTH_MIB
        if ratio >= GOAL_COUNT_RATIO:
            verdict = "PASS" if small else "MISS"
        else:
            # Too few extra requests for the growth to mean anything (the --smoke durations).
            verdict = f"NOT JUDGED (the request count grew only {ratio:.1f}x)"
        print(
            f"{short.seconds:.0f} s -> {long.seconds:.0f} s: peak RSS {delta:+.1f} MiB "
            f"(goal < {GOAL_GROWTH_MIB:g} MiB) while requests grew {ratio:.2f}x "
            f"(goal >= {GOAL_COUNT_RATIO:g}x), {per_million:+.3f} MiB per extra million "
            f"requests {verdict}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
