"""Calibrate optlab.metrics.stats on real measurements of the synthetic target.

Each run is a real measurement, in process: the synthetic target (lognormal service time,
median 2 ms, sigma 0.3) behind optlab's ThreadLoadGenerator (4 closed-loop clients) and Collector,
as the runner drives them (warmup, then a measured phase, the collector drained every 0.25 s).
Short runs use short windows (0.1 s by default) so that a 1.5 s run has 15 windows to batch;
the statistics do not care how long a window is, only how many there are and how they wander.

* A/A: the same config measured twice (only the target's random seed differs); the step must
  come out "within noise" (no headline metric among QPS, P50, P99 significant). Goal >= 95%.
* Regression: the service time 10% slower (median 2.2 ms); P50 must come out worse beyond
  noise. Goal >= 90%.

A regression trial reuses the first run of an A/A trial as its parent. Trials alternate A/A and
regression so that a slow drift of the shared machine hits both alike.
It is a measurement, not a test: PASS/MISS is printed and the exit status is 0 either way.

Run: ``PYTHONPATH=src python benchmarks/calibration.py [--aa 100] [--regression 50]
[--duration 1.5] [--window 0.1] [--smoke]``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from optlab.config.models import ClosedLoad
from optlab.load.generator import ThreadLoadGenerator
from optlab.metrics.log import Collector
from optlab.metrics.stats import VERDICT_CONFIDENCE, Comparison, compare, step_verdict
from optlab.reference.synthetic import SyntheticKnobs, SyntheticTarget

CONFIDENCE = VERDICT_CONFIDENCE
MIN_EFFECT_PCT = 1.0
SERVICE_MS = 2.0
SLOWER = 1.10
TICK_S = 0.25


@dataclass(frozen=True)
class Measured:
    """Per-window series and run-level figures of one run's measured phase."""

    qps: list[float]
    p50: list[float]
    p99: list[float]
    qps_run: float
    p50_run: float
    p99_run: float


def measure(
    service_ms: float,
    *,
    seed: int,
    duration_s: float = 1.5,
    warmup_s: float = 0.3,
    window_s: float = 0.1,
    concurrency: int = 4,
) -> Measured:
    """One real run of the synthetic target, driven as optlab.run.measurement drives a target."""
    target = SyntheticTarget(
        SyntheticKnobs(distribution="lognormal", service_ms=service_ms, sigma=0.3, seed=seed)
    )
    collector = Collector(window_s)
    generator = ThreadLoadGenerator(
        target, list(range(64)), ClosedLoad(mode="closed", concurrency=concurrency), timeout_s=10
    )
    collector.set_phase("warmup", time.perf_counter_ns())
    generator.start(collector)
    _run_for(collector, warmup_s)
    collector.set_phase("measure", time.perf_counter_ns())
    started = time.monotonic()
    _run_for(collector, duration_s)
    measured = time.monotonic() - started
    collector.set_phase("drain", time.perf_counter_ns())
    generator.stop(5.0)
    collector.finish()
    windows = collector.windows("measure")
    ok, _ = collector.totals("measure")
    total = collector.histograms("measure")["total"].summary_ms()
    return Measured(
        [w.qps for w in windows],
        [w.p50_ms for w in windows if w.p50_ms is not None],
        [w.p99_ms for w in windows if w.p99_ms is not None],
        ok / measured,
        float(total["p50"] or 0.0),
        float(total["p99"] or 0.0),
    )


def _run_for(collector: Collector, seconds: float) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(TICK_S, left))
        collector.drain()


def judge(
    parent: Measured,
    child: Measured,
    *,
    confidence: float = CONFIDENCE,
    min_effect_pct: float = MIN_EFFECT_PCT,
) -> tuple[str, list[Comparison]]:
    """The step's verdict over the headline metrics (QPS, P50, P99), as the table judges it."""
    comparisons = [
        compare(
            name,
            [getattr(parent, name)],
            [getattr(child, name)],
            parent_estimates=[getattr(parent, f"{name}_run")],
            child_estimates=[getattr(child, f"{name}_run")],
            higher_is_better=name == "qps",
            confidence=confidence,
            min_effect_pct=min_effect_pct,
        )
        for name in ("qps", "p50", "p99")
    ]
    verdict, _ = step_verdict(comparisons)
    return verdict, comparisons


@dataclass
class Trial:
    kind: str  # "aa" or "regression"
    parent: Measured
    child: Measured


@dataclass
class Rates:
    aa_trials: int = 0
    aa_within: int = 0
    reg_trials: int = 0
    reg_detected: int = 0
    aa_false: dict[str, int] | None = None
    max_aa_delta: dict[str, float] | None = None
    trials: list[Trial] | None = None


def rates_of(
    trials: list[Trial],
    *,
    confidence: float = CONFIDENCE,
    min_effect_pct: float = MIN_EFFECT_PCT,
    verbose: bool = False,
) -> Rates:
    """Judge measured trials: A/A within-noise count and regressions detected on P50."""
    rates = Rates(aa_false={"qps": 0, "p50": 0, "p99": 0}, max_aa_delta={}, trials=trials)
    for index, trial in enumerate(trials):
        verdict, comps = judge(
            trial.parent, trial.child, confidence=confidence, min_effect_pct=min_effect_pct
        )
        if trial.kind == "aa":
            rates.aa_trials += 1
            rates.aa_within += verdict == "within noise"
            for c in comps:
                assert rates.aa_false is not None and rates.max_aa_delta is not None
                rates.aa_false[c.metric] += c.significant
                rates.max_aa_delta[c.metric] = max(
                    rates.max_aa_delta.get(c.metric, 0.0), abs(c.delta_pct)
                )
        else:
            p50 = comps[1]
            rates.reg_trials += 1
            rates.reg_detected += p50.significant and p50.better is False
        if verbose:
            print(f"  {trial.kind:<10} {index:3d}: {verdict:<13}" + _deltas(comps), flush=True)
    return rates


def run_trials(
    aa: int, regression: int, *, duration_s: float = 1.5, window_s: float = 0.1, seed: int = 0
) -> list[Trial]:
    """Measure the trials: A/A pairs and (parent, 10% slower) pairs, interleaved."""
    trials = []
    for trial in range(max(aa, regression)):
        base = seed + 1000 * trial
        a = measure(SERVICE_MS, seed=base, duration_s=duration_s, window_s=window_s)
        if trial < aa:
            b = measure(SERVICE_MS, seed=base + 1, duration_s=duration_s, window_s=window_s)
            trials.append(Trial("aa", a, b))
        if trial < regression:
            slow = measure(
                SERVICE_MS * SLOWER, seed=base + 2, duration_s=duration_s, window_s=window_s
            )
            trials.append(Trial("regression", a, slow))
    return trials


def _deltas(comps: list[Comparison]) -> str:
    return "  ".join(
        f"{c.metric} {c.delta_pct:+6.2f}% [{c.low_pct:+6.2f}, {c.high_pct:+6.2f}]"
        f"{'*' if c.significant else ' '}"
        for c in comps
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aa", type=int, default=100, help="A/A trials")
    parser.add_argument("--regression", type=int, default=50, help="regression trials")
    parser.add_argument("--duration", type=float, default=1.5, help="measured seconds per run")
    parser.add_argument("--window", type=float, default=0.1, help="window length, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="2 + 2 trials of 0.6 s")
    parser.add_argument("--verbose", action="store_true", help="one line per trial")
    parser.add_argument("--confidence", type=float, default=CONFIDENCE)
    parser.add_argument("--min-effect", type=float, default=MIN_EFFECT_PCT, metavar="PCT")
    parser.add_argument("--save", metavar="JSON", help="write the measured trials here")
    parser.add_argument("--load", metavar="JSON", help="judge trials saved by --save")
    args = parser.parse_args()
    if args.smoke:
        args.aa, args.regression, args.duration = 2, 2, 0.6
    started = time.monotonic()
    if args.load:
        raw = json.loads(Path(args.load).read_text())
        trials = [Trial(t["kind"], Measured(**t["parent"]), Measured(**t["child"])) for t in raw]
    else:
        trials = run_trials(
            args.aa,
            args.regression,
            duration_s=args.duration,
            window_s=args.window,
            seed=args.seed,
        )
    if args.save:
        Path(args.save).write_text(json.dumps([asdict(t) for t in trials]))
    rates = rates_of(
        trials, confidence=args.confidence, min_effect_pct=args.min_effect, verbose=args.verbose
    )
    aa_rate = rates.aa_within / max(rates.aa_trials, 1)
    reg_rate = rates.reg_detected / max(rates.reg_trials, 1)
    print(
        f"settings: synthetic lognormal median {SERVICE_MS:g} ms sigma 0.3, 4 closed-loop "
        f"clients, warmup 0.3 s, measure {args.duration:g} s in {args.window:g} s windows; "
        f"confidence {args.confidence:g}, min effect {args.min_effect:g}%; "
        f"{time.monotonic() - started:.0f} s in all"
    )
    print(
        "A/A false alarms per metric: "
        + ", ".join(f"{k} {v}" for k, v in (rates.aa_false or {}).items())
        + "; largest A/A |delta|: "
        + ", ".join(f"{k} {v:.2f}%" for k, v in (rates.max_aa_delta or {}).items())
    )
    print(
        f"A/A within noise {rates.aa_within}/{rates.aa_trials} = {aa_rate:.1%} (goal >= 95%): "
        + ("PASS" if aa_rate >= 0.95 else "MISS")
    )
    print(
        f"10% slower service detected (P50 worse beyond noise) {rates.reg_detected}/"
        f"{rates.reg_trials} = {reg_rate:.1%} (goal >= 90%): "
        + ("PASS" if reg_rate >= 0.90 else "MISS")
    )


if __name__ == "__main__":
    main()
