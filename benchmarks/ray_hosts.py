"""Load from several hosts on Ray (docs/hosts.md) against truth and against one host.

A local Ray cluster on this machine (`ray start` processes, as the ray lane's:
tests/support/raycluster.py), the synthetic M/M/4 target (exponential service, mean 1 ms:
capacity 4,000/s) served over HTTP (`python -m optlab.reference.synthetic`), the load driven
through optlab's own generators (`RayLoadGenerator`, `ProcessLoadGenerator`) into a
`Collector`, as a run does:

1. **Three nodes, one schedule**: 300/s constant and 2,000/s Poisson from three nodes (two
   with monotonic clocks shifted +3.7 s and -12.1 s in Linux time namespaces, where this
   machine has them). Printed: the merged histogram against the sum of the nodes' (count for
   count) and against each worker's own count of what it handed over; the achieved rate against
   the offered (Poisson noise: 3 sigma); each node's first-send lag and send-lag P99 (goal: <=
   2 ms); the offsets found against the shifts, within their bounds; time zero on the wall
   clock across nodes; the merged P99 against the same schedule driven from one host (three
   local worker processes, `processes: 3`: on one machine, the same three generators beside
   the target), runs alternated, each P99 with its 95% distribution-free interval (order
   statistics of the binomial); goal: the merged median P99 inside one host's band (its
   runs' intervals, lowest to highest).
2. **Overhead**: one Ray worker (its actor and the plain worker process the actor starts,
   `optlab.load.host_worker`) against one plain local worker process
   (`ProcessLoadGenerator(processes=1)`), each at the same rate, both sending at once against
   one target (M/M/16 here: the two together leave it at a quarter of its capacity), over
   rounds: the same seconds of the same machine, the same coordinator and Ray daemons beside
   each. Send-lag P99 and the worker's CPU per request (psutil, its processes' user + system:
   for Ray, the actor's too). Goal: within 10%. With `--alternated`, also one run after the
   other, as two runs would be; on one 2-core machine that figure adds Ray's presence here
   (its driver in this process, its daemons busy with a job) to the Ray runs alone -- on a
   real cluster the coordinator is another host.

    PYTHONPATH=src python benchmarks/ray_hosts.py [--seconds 20] [--rounds 3] [--overhead-rate 2000]
        [--only nodes|overhead] [--alternated] [--smoke]

Like the other benchmarks it measures and prints; it exits 0 whether the goals are met or not.
Needs Ray (`pip install 'optlab[ray]'`).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.support.proc import free_port, service  # noqa: E402
from tests.support.raycluster import OFFSETS_S, LocalCluster, time_namespaces  # noqa: E402

from optlab.config.modes import OpenLoad  # noqa: E402
from optlab.config.modes.base import Hosts  # noqa: E402
from optlab.load.hosts import RayLoadGenerator, connect  # noqa: E402
from optlab.load.processes import ProcessLoadGenerator  # noqa: E402
from optlab.metrics.histogram import LatencyHistogram  # noqa: E402
from optlab.metrics.log import Collector  # noqa: E402
from optlab.targets.http import HttpRecipe, classify  # noqa: E402

SEED = 11


def recipe(port: int) -> HttpRecipe:
    """The synthetic target's client, as an http target's file would build it (for an open
    loop: its connection pool is sized by the load's in-flight limit, 512)."""
    from optlab.config.loading import load_experiment
    from optlab.config.models import ResolvedConfig
    from optlab.targets.registry import load_target
    from optlab.targets.resolve import resolve_baseline

    folder = Path(tempfile.mkdtemp())
    path = folder / "mmc.yaml"
    path.write_text(
        "name: mmc\n"
        f"target: {{kind: http, url: 'http://127.0.0.1:{port}/', method: POST, code_version: b}}\n"
        "knobs: {}\nworkload:\n  load: {mode: open, rate: 1000}\n"
        "  inputs: {template: {id: '{i}'}, count: 5}\n"
    )
    config = ResolvedConfig.model_validate(resolve_baseline(load_experiment(path)))
    client = load_target(config, [folder]).client
    assert isinstance(client, HttpRecipe)
    return client


WARMUP_S = 2.0  # as a run's warm-up: the first seconds of fresh worker processes are not kept


def settle(limit_s: float = 20.0) -> None:
    """Wait until this machine is mostly idle: after a run, each Ray node starts a fresh idle
    worker process (a Python start, ~1 s of CPU) where the run's actors were, and on ONE
    machine that would be the next run's neighbour (on real hosts it is not)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and psutil.cpu_percent(interval=0.5) > 40:
        pass


def drive(generator: Any, seconds: float, pids: Any = None) -> dict[str, Any]:
    """`generator` for WARMUP_S, then `seconds` measured, into a collector; its figures over
    the measured seconds, and its workers' CPU over them."""
    settle()
    collector = Collector()
    collector.set_phase("warmup", 0)
    generator.start(collector)
    warmed = generator.t0_ns + int(WARMUP_S * 1e9)
    collector.set_phase("measure", warmed)
    while time.perf_counter_ns() < warmed:
        time.sleep(0.1)
        collector.drain()
    worker_pids = pids(generator) if pids is not None else [psutil.Process().pid]
    procs = [psutil.Process(p) for p in worker_pids]
    cpu0 = [sum(p.cpu_times()[:2]) for p in procs]
    issued0 = generator.issued
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.5)
        collector.drain()
    cpu1 = [sum(p.cpu_times()[:2]) for p in procs]
    stopped_ns = time.perf_counter_ns()
    report = generator.stop(5)
    collector.drain()
    collector.finish()
    histograms = collector.histograms("measure")
    return {
        "generator": generator,
        "collector": collector,
        "total": histograms["total"],
        "send_lag": histograms["send_lag"],
        "issued": report.issued,
        "span_s": (stopped_ns - generator.t0_ns) / 1e9,  # the schedule's time, zero to stop
        "measured_issued": report.issued - issued0,
        "cpu_s": sum(cpu1) - sum(cpu0),
    }


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


class Tally:
    """Part one's figures over its rounds, and its verdicts."""

    def __init__(self) -> None:
        self.exact = self.rate_ok = self.offsets_ok = 0
        self.lags: list[float] = []
        self.firsts: list[float] = []
        self.spreads: list[float] = []

    def report(
        self,
        label: str,
        rounds: int,
        offsets: bool,
        ray_p99s: list[tuple[float, float, float]],
        one_p99s: list[tuple[float, float, float]],
    ) -> None:
        print(
            f"{label}: merged = sum of the nodes' histograms, and each node's own count = "
            f"what arrived, in {self.exact}/{rounds} runs: {verdict(self.exact == rounds)}"
        )
        print(
            f"{label}: achieved within 3 sigma of the offered rate in {self.rate_ok}/{rounds} "
            f"runs: {verdict(self.rate_ok == rounds)}"
        )
        worst, first = max(self.lags), max(self.firsts)
        print(
            f"{label}: per-node send-lag P99 <= 2 ms in "
            f"{sum(lag <= 2 for lag in self.lags)}/{len(self.lags)} node-runs (highest "
            f"{worst:.3f} ms; first sends at most {first:.3f} ms late): {verdict(worst <= 2)}"
        )
        if offsets:
            print(
                f"{label}: offsets within their bounds in {self.offsets_ok}/{rounds} runs, "
                f"time zero's spread on the wall clock at most {max(self.spreads):.3f} ms: "
                f"{verdict(self.offsets_ok == rounds)}"
            )
        merged = statistics.median(p for p, _, _ in ray_p99s)
        single = statistics.median(p for p, _, _ in one_p99s)
        low, high = min(lo for _, lo, _ in one_p99s), max(hi for _, _, hi in one_p99s)
        print(f"{label}: merged P99 median {merged:.2f} ms against one host's {single:.2f} ms "
              f"({merged / single - 1:+.1%}); one host's band over {rounds} runs "
              f"[{low:.2f}, {high:.2f}] ms: {verdict(low <= merged <= high)}")  # fmt: skip


def p99_interval(h: LatencyHistogram) -> tuple[float, float, float]:
    """P99 and its 95% distribution-free interval (binomial order statistics), in ms."""
    n = h.count
    half = 1.96 * math.sqrt(n * 0.99 * 0.01)
    lo_rank, hi_rank = max(1.0, n * 0.99 - half), min(float(n), n * 0.99 + half)
    at = [h.value_at_percentile_ns(100 * r / n) or 0 for r in (lo_rank, n * 0.99, hi_rank)]
    return at[1] / 1e6, at[0] / 1e6, at[2] / 1e6


def ms(ns: int | None) -> float:
    return (ns or 0) / 1e6


@contextmanager
def cluster(nodes: int, folder: Path, offsets: bool) -> Iterator[LocalCluster]:
    local = LocalCluster(folder)
    try:
        local.head()
        for i in range(nodes - 1):
            local.add(offset_s=OFFSETS_S[i % len(OFFSETS_S)] if offsets else 0.0)
        yield local
    finally:
        local.stop()


def part_one(port: int, seconds: float, rounds: int) -> None:
    why_not = time_namespaces()
    offsets = why_not is None
    print(f"== three nodes, one schedule ({seconds:g} s a run; offsets injected: "
          f"{'yes, +0 / +3.7 / -12.1 s' if offsets else 'no: ' + str(why_not)})")  # fmt: skip
    client = recipe(port)
    with cluster(3, Path(tempfile.mkdtemp()), offsets) as local:
        hosts = Hosts(ray=local.address, nodes=3)
        for label, arrival, rate in (("300/s constant", "constant", 300.0),
                                     ("2,000/s Poisson", "poisson", 2000.0)):  # fmt: skip
            ray_p99s, one_p99s = [], []
            tally_of = Tally()
            for r in range(rounds):
                load = OpenLoad(mode="open", rate=rate, arrival=arrival, hosts=hosts)
                local_load = OpenLoad(mode="open", rate=rate, arrival=arrival)
                runs: dict[str, dict[str, Any]] = {}
                # The two take turns, the order swapped every other round (drift shared).
                for kind in ("ray", "one") if r % 2 == 0 else ("one", "ray"):
                    if kind == "ray":
                        gen = RayLoadGenerator(
                            client, load, connect(hosts), classify=classify, timeout_s=10,
                            seed=SEED + r,
                        )  # fmt: skip
                        runs[kind] = drive(gen, seconds)
                    else:
                        # One host: three local worker processes (`processes: 3`), so that
                        # on this one machine both put three generators beside the target.
                        runs[kind] = drive(
                            ProcessLoadGenerator(
                                client, local_load, processes=3, classify=classify,
                                timeout_s=10, seed=SEED + r,
                            ),
                            seconds,
                        )  # fmt: skip
                got, one = runs["ray"], runs["one"]
                ray_p99s.append(p99_interval(got["total"]))
                one_p99s.append(p99_interval(one["total"]))
                tallies = got["collector"].source_tallies("measure")
                summed = LatencyHistogram()
                own_equal = True
                for report in gen.reports():
                    summed.merge(tallies[report.node].total)
                    own = LatencyHistogram()
                    for encoded in report.shipped:
                        own.merge(LatencyHistogram.decode(encoded))
                    arrived = tallies[report.node].total.copy()  # both phases: all it sent
                    warm = got["collector"].source_tallies("warmup").get(report.node)
                    if warm is not None:
                        arrived.merge(warm.total)
                    own_equal &= bool(np.array_equal(own.counts, arrived.counts))
                exact = bool(np.array_equal(summed.counts, got["total"].counts))
                expected = rate * got["span_s"]
                sigmas = (got["issued"] - expected) / math.sqrt(expected)
                tally_of.exact += exact and own_equal
                tally_of.rate_ok += abs(sigmas) <= 3
                print(f"{label}, round {r + 1}: merged {got['total'].count:,} = sum of nodes "
                      f"{summed.count:,}: count for count {'YES' if exact else 'NO'}; each "
                      f"node's own count of what it sent = what arrived: "
                      f"{'YES' if own_equal else 'NO'}")  # fmt: skip
                print(
                    f"  issued {got['issued']:,} in {got['span_s']:.2f} s against "
                    f"{expected:,.0f} offered: {sigmas:+.2f} sigma (Poisson noise: within 3)"
                )
                walls = [w for rep in gen.reports() for w in rep.t0_wall_ns]
                for rep in gen.reports():
                    tally = tallies[rep.node]
                    lag99 = ms(tally.send_lag.value_at_percentile_ns(99.0))
                    tally_of.lags.append(lag99)
                    tally_of.firsts.append(rep.first_send_lag_ms or 0.0)
                    print(
                        f"  {rep.node}: offset {rep.offset_ms:+.3f} ms "
                        f"+-{rep.offset_bound_ms:.3f} (rtt {rep.round_trip_ms:.3f}; drift over "
                        f"the run {rep.drift_ms or 0:+.3f} +-{rep.drift_bound_ms or 0:.3f}), "
                        "first-send "
                        f"lag {rep.first_send_lag_ms or 0:.3f} ms, send-lag P99 {lag99:.3f} ms, "
                        f"{tally.ok:,} requests, its CPUs {rep.node_cpu_pct or 0:.0f}%"
                    )
                if offsets:
                    # Each node against the shift nearest its estimate (they are seconds apart).
                    truth = [0.0, *(o * 1000 for o in OFFSETS_S)]
                    worst = max(
                        abs(rep.offset_ms - min(truth, key=lambda t: abs(t - rep.offset_ms)))
                        - rep.offset_bound_ms
                        for rep in gen.reports()
                    )
                    tally_of.offsets_ok += worst <= 0
                    found = ", ".join(f"{rep.offset_ms:+.3f}" for rep in gen.reports())
                    print(
                        f"  offsets found {found} ms against the shifts "
                        f"{', '.join(f'{t:+.0f}' for t in truth)}: error minus bound at most "
                        f"{worst:+.3f} ms (<= 0: every one within its bound)"
                    )
                spread_ms = (max(walls) - min(walls)) / 1e6
                tally_of.spreads.append(spread_ms)
                print(f"  time zero on the wall clock across nodes: spread {spread_ms:.3f} ms")
            for name, p99s in (("3 nodes", ray_p99s), ("one host", one_p99s)):
                print(f"{label}: {name} P99 " + ", ".join(
                    f"{p:.2f} [{lo:.2f}, {hi:.2f}]" for p, lo, hi in p99s) + " ms")  # fmt: skip
            tally_of.report(label, rounds, offsets, ray_p99s, one_p99s)


def _overhead_generator(kind: str, client: HttpRecipe, hosts: Hosts, rate: float, seed: int) -> Any:
    """A Ray worker (`ray`) or a local worker process (`local`), sending `rate`/s Poisson."""
    if kind == "ray":
        load = OpenLoad(mode="open", rate=rate, hosts=hosts)
        return RayLoadGenerator(
            client, load, connect(hosts), classify=classify, timeout_s=10, seed=seed
        )
    load = OpenLoad(mode="open", rate=rate)
    return ProcessLoadGenerator(
        client, load, processes=1, classify=classify, timeout_s=10, seed=seed
    )


def _pids(kind: str, generator: Any) -> list[int]:
    """The worker's processes, whose CPU is counted: the Ray actor and the worker process it
    started; the local worker process."""
    return [p for _, p in generator.worker_pids] if kind == "ray" else list(generator.pids)


def _figures(got: dict[str, Any]) -> tuple[float, float]:
    """(send-lag P99 ms, worker CPU us per request) over the measured seconds."""
    lag = ms(got["send_lag"].value_at_percentile_ns(99.0))
    return lag, got["cpu_s"] * 1e6 / max(1, got["measured_issued"])


def drive_together(generators: dict[str, Any], seconds: float) -> dict[str, dict[str, Any]]:
    """Every generator at once, for WARMUP_S and then `seconds` measured, each into its own
    collector: the same seconds of the same machine for each."""
    settle()
    collectors = {kind: Collector() for kind in generators}
    for kind, generator in generators.items():
        collectors[kind].set_phase("warmup", 0)
        generator.start(collectors[kind])
    warmed = max(g.t0_ns for g in generators.values()) + int(WARMUP_S * 1e9)
    for collector in collectors.values():
        collector.set_phase("measure", warmed)
    while time.perf_counter_ns() < warmed:
        time.sleep(0.1)
        for collector in collectors.values():
            collector.drain()
    procs = {k: [psutil.Process(p) for p in _pids(k, g)] for k, g in generators.items()}
    cpu0 = {k: sum(sum(p.cpu_times()[:2]) for p in ps) for k, ps in procs.items()}
    issued0 = {k: g.issued for k, g in generators.items()}
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.5)
        for collector in collectors.values():
            collector.drain()
    cpu1 = {k: sum(sum(p.cpu_times()[:2]) for p in ps) for k, ps in procs.items()}
    out = {}
    for kind, generator in generators.items():
        report = generator.stop(5)
        collectors[kind].drain()
        collectors[kind].finish()
        out[kind] = {
            "send_lag": collectors[kind].histograms("measure")["send_lag"],
            "issued": report.issued,
            "measured_issued": report.issued - issued0[kind],
            "cpu_s": cpu1[kind] - cpu0[kind],
        }
    return out


def _ratios(label: str, lag_ratio: list[float], cpu_ratio: list[float], goal: bool) -> None:
    lag, cpu = statistics.median(lag_ratio), statistics.median(cpu_ratio)
    ok = lag <= 1.10 and cpu <= 1.10
    print(
        f"overhead, {label}, Ray / local (median of {len(lag_ratio)} rounds): send-lag P99 "
        f"{lag:.3f} (rounds {min(lag_ratio):.2f}-{max(lag_ratio):.2f}), CPU per request "
        f"{cpu:.3f} (rounds {min(cpu_ratio):.2f}-{max(cpu_ratio):.2f})"
        + (f" (goal: each <= 1.10): {verdict(ok)}" if goal else " (Ray's presence here)")
    )


def part_two(port: int, seconds: float, rounds: int, rate: float, alternated: bool) -> None:
    """The worker under Ray against a plain local worker process, both sending at once (the
    same seconds, the same machine, the same coordinator and Ray daemons beside them): the
    goal's figure. With `alternated`, also one after the other, as two runs would be: on one
    2-core machine that adds the cost of Ray's presence here (its driver in this process,
    its daemons busy with a job) to the Ray run alone -- on a real cluster the coordinator
    is another host."""
    print(f"== overhead: one Ray worker against one local worker process, {rate:,.0f}/s "
          f"Poisson each, {seconds:g} s a run, {rounds} rounds, both at once")  # fmt: skip
    client = recipe(port)
    with cluster(1, Path(tempfile.mkdtemp()), False) as local:
        hosts = Hosts(ray=local.address, nodes=1)
        lag_ratio, cpu_ratio = [], []
        for r in range(rounds):
            generators = {
                kind: _overhead_generator(kind, client, hosts, rate, SEED + r)
                for kind in ("ray", "local")
            }
            got = drive_together(generators, seconds)
            figures = {kind: _figures(g) for kind, g in got.items()}
            for kind, (lag, per) in figures.items():
                print(f"  round {r + 1} {kind:5}: send-lag P99 {lag:.3f} ms, worker CPU "
                      f"{per:.1f} us/request ({got[kind]['issued']:,} requests)")  # fmt: skip
            lag_ratio.append(figures["ray"][0] / figures["local"][0])
            cpu_ratio.append(figures["ray"][1] / figures["local"][1])
        _ratios("both at once", lag_ratio, cpu_ratio, goal=True)
        if not alternated:
            return
        print("== the same, one after the other (alternated)")
        lag_ratio, cpu_ratio = [], []
        for r in range(rounds):
            figures = {}
            for kind in ("ray", "local") if r % 2 == 0 else ("local", "ray"):
                generator = _overhead_generator(kind, client, hosts, rate, SEED + r)
                got1 = drive(generator, seconds, lambda g, k=kind: _pids(k, g))
                figures[kind] = _figures(got1)
                lag, per = figures[kind]
                print(f"  round {r + 1} {kind:5}: send-lag P99 {lag:.3f} ms, worker CPU "
                      f"{per:.1f} us/request ({got1['issued']:,} requests)")  # fmt: skip
            lag_ratio.append(figures["ray"][0] / figures["local"][0])
            cpu_ratio.append(figures["ray"][1] / figures["local"][1])
        _ratios("alternated", lag_ratio, cpu_ratio, goal=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--overhead-rate", type=float, default=2000.0)
    parser.add_argument("--only", choices=("nodes", "overhead"))
    parser.add_argument(
        "--alternated", action="store_true", help="the overhead also one run after the other"
    )
    parser.add_argument("--smoke", action="store_true", help="seconds-long runs, one round")
    args = parser.parse_args()
    if args.smoke:
        args.seconds, args.rounds = 3.0, 1
    port = free_port()
    argv = [sys.executable, "-m", "optlab.reference.synthetic", "--port", str(port),
            "--servers", "4", "--distribution", "exponential", "--service-ms", "1"]  # fmt: skip
    if args.only in (None, "nodes"):
        with service(argv, port):
            part_one(port, args.seconds, args.rounds)
    if args.only in (None, "overhead"):
        # Two workers at once against one target: M/M/16 (capacity 16,000/s), so that their
        # 2 x 2,000/s leaves it at a quarter of its capacity, as one alone leaves M/M/4 at half.
        argv[argv.index("--servers") + 1] = "16"
        with service(argv, port):
            part_two(port, args.seconds, args.rounds, args.overhead_rate, args.alternated)


if __name__ == "__main__":
    main()
