"""Does optlab's open loop report the latency a stall really causes? (coordinated omission)

The synthetic target serves one request at a time (``single_server``) in 1 ms and freezes for
500 ms every 5 s, like a stop-the-world GC pause. It is driven open-loop at 200 requests/s with
constant arrivals, and optlab's percentiles are compared with the ground truth that
``simulate_open_loop`` computes for a FIFO single server with the same stalls, over the SAME
intended arrival times: the generator's schedule, shifted by the generator's time zero relative
to the target's construction (the stall clock's zero). Both sides go through a
``LatencyHistogram``, so the comparison is like with like (3 significant digits).

For contrast, a closed loop with one client measures the same kind of target for the same
duration: its client waits out each stall instead of sending the requests that would have
queued behind it, so its P99 stays near the service time (coordinated omission).

Goal: open-loop P99 and P99.9 within 10% of the ground truth. A measurement, not a test:
PASS/MISS is printed and the exit status is 0 either way.

Run: ``PYTHONPATH=src python benchmarks/coordinated_omission.py [--smoke]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from provenance import source_hashes

from optlab.config.models import ClosedLoad, OpenLoad
from optlab.load.generator import ThreadLoadGenerator
from optlab.metrics.histogram import LatencyHistogram
from optlab.metrics.log import Collector
from optlab.metrics.stages import SEND_LAG, TOTAL
from optlab.reference.synthetic import SyntheticKnobs, SyntheticTarget, simulate_open_loop

RUNNER_TICK_S = 0.25  # optlab.run.phases.TICK_S: how often the runner drains the collector
RATE = 200.0
SERVICE_MS = 1.0
STALL_EVERY_S = 5.0
STALL_MS = 500.0
GOAL_ERROR = 0.10
PERCENTILES = (("P50", 50.0), ("P99", 99.0), ("P99.9", 99.9))
JUDGED = ("P99", "P99.9")  # P50 is shown, not judged: it is the service time plus overheads
TIMEOUT_S = 30.0  # far above any stall, so no stalled request is counted as an error


@dataclass(frozen=True)
class Measured:
    hist: LatencyHistogram
    send_lag: LatencyHistogram | None
    issued: int
    completed: int
    errors: int
    # Intended send time of request 0, in ns after the target's construction: the stall phase.
    phase_ns: int


def knobs() -> SyntheticKnobs:
    return SyntheticKnobs(
        distribution="fixed",
        service_ms=SERVICE_MS,
        single_server=True,
        stall_every_s=STALL_EVERY_S,
        stall_ms=STALL_MS,
    )


def measure(load: ClosedLoad | OpenLoad, seconds: float) -> Measured:
    """Drive a freshly built target for ``seconds`` with the runner's drain loop."""
    target = SyntheticTarget(knobs())
    collector = Collector()
    generator = ThreadLoadGenerator(target, list(range(64)), load, timeout_s=TIMEOUT_S)
    clock = time.perf_counter_ns
    # One phase from before the start: every request sent is counted, none is left out, so
    # the ground truth can be computed over exactly the arrivals that were sent.
    collector.set_phase("measure", clock())
    generator.start(collector)
    # Neither side offers its time zero publicly; both are read here, only to line the
    # ground truth's stall clock up with the schedule. A phase error of a few ms would move
    # the tail little, but there is no reason to accept any.
    phase_ns: int = generator._t0 - target._t0
    end = generator._t0 + int(seconds * 1e9)
    while (left := end - clock()) > 0:
        time.sleep(min(RUNNER_TICK_S, left / 1e9))
        collector.drain()
    # Requests still queued behind a stall when the load stops are waited for (a stall is
    # 0.5 s), so the measured set is exactly the arrivals that were sent.
    report = generator.stop(drain_timeout_s=STALL_MS / 1000 + 10.0)
    collector.finish()
    if report.failure is not None:
        raise RuntimeError("the generator failed") from report.failure
    ok, errors = collector.totals("measure")
    hists = collector.histograms("measure")
    return Measured(
        hist=hists.get(TOTAL, LatencyHistogram()),
        send_lag=hists.get(SEND_LAG),
        issued=report.issued,
        completed=ok,
        errors=errors,
        phase_ns=phase_ns,
    )


def ground_truth(count: int, phase_ns: int) -> LatencyHistogram:
    """simulate_open_loop over the first ``count`` intended arrivals of the constant schedule."""
    period_ns = 1e9 / RATE
    # round(i * period) per arrival, as the constant schedule computes it: no drift.
    arrivals = [phase_ns + round(i * period_ns) for i in range(count)]
    latencies = simulate_open_loop(
        arrivals,
        round(SERVICE_MS * 1e6),
        round(STALL_EVERY_S * 1e9),
        round(STALL_MS * 1e6),
    )
    hist = LatencyHistogram()
    hist.record_array(np.asarray(latencies, dtype=np.int64))
    return hist


def pct_ms(hist: LatencyHistogram, q: float) -> float:
    value = hist.value_at_percentile_ns(q)
    return float("nan") if value is None else value / 1e6


def code_id() -> str:
    return source_hashes(
        "load/generator.py", "reference/synthetic.py", "metrics/log.py", "metrics/windows.py"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="12 s per loop instead of 60 s")
    parser.add_argument("--seconds", type=float, help="duration of each loop (default 60)")
    args = parser.parse_args(argv)
    seconds = args.seconds or (12.0 if args.smoke else 60.0)

    load1, _, _ = os.getloadavg()
    print(
        f"# coordinated_omission: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {load1:.2f}; code: {code_id()}"
    )
    print(
        f"# target: {SERVICE_MS:g} ms fixed service, single server, {STALL_MS:g} ms stall every "
        f"{STALL_EVERY_S:g} s; open loop {RATE:g}/s constant arrivals for {seconds:g} s"
    )

    open_run = measure(OpenLoad(mode="open", rate=RATE, arrival="constant"), seconds)
    truth = ground_truth(open_run.issued, open_run.phase_ns)
    lag = open_run.send_lag
    lag_text = "-" if lag is None or lag.count == 0 else f"{pct_ms(lag, 99.0):.3f} ms"
    print(
        f"open loop: {open_run.completed:,} requests ({open_run.issued:,} sent, "
        f"{open_run.errors} errors), stall phase {open_run.phase_ns / 1e6:.3f} ms after the "
        f"target's construction, send-lag P99 {lag_text}; ground truth over the same "
        f"{truth.count:,} intended arrivals"
    )
    errors: dict[str, float] = {}
    for name, q in PERCENTILES:
        got, want = pct_ms(open_run.hist, q), pct_ms(truth, q)
        errors[name] = (got - want) / want
        print(
            f"  {name:<6} optlab open loop {got:9.3f} ms   ground truth {want:9.3f} ms   "
            f"relative error {errors[name]:+7.2%}"
        )

    closed_run = measure(ClosedLoad(mode="closed", concurrency=1), seconds)
    print(
        f"closed loop, 1 client, same target and duration: {closed_run.completed:,} requests "
        f"({closed_run.errors} errors)"
    )
    for name, q in PERCENTILES:
        got, want = pct_ms(closed_run.hist, q), pct_ms(truth, q)
        print(
            f"  {name:<6} closed loop {got:9.3f} ms   open-loop ground truth {want:9.3f} ms   "
            f"ratio {got / want:.4f}"
        )

    judged = [abs(errors[name]) <= GOAL_ERROR for name in JUDGED]
    detail = ", ".join(f"{name} {errors[name]:+.2%}" for name in JUDGED)
    print("# goal")
    print(
        f"open-loop P99 and P99.9 within {GOAL_ERROR:.0%} of the ground truth: {detail} "
        f"{'PASS' if all(judged) else 'MISS'}"
    )
    closed_p99, truth_p99 = pct_ms(closed_run.hist, 99.0), pct_ms(truth, 99.0)
    print(
        f"closed loop under-reports the P99 {truth_p99 / closed_p99:,.0f}x "
        f"({closed_p99:.3f} ms against {truth_p99:.3f} ms): what the open loop corrects"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
