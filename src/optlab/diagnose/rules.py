"""The catalogue of diagnosis rules: the method's symptom table as code (docs/diagnose.md).

Each rule has an id, the resource it blames, the symptom it reads, parameters with defaults
and the evidence it needs. `Rule.check` returns a `Fired` finding (bottleneck stage, confidence,
the numbers against their thresholds), `Passed` (evaluated, nothing wrong), or `Unevaluable`
(the run lacks the evidence: the rule says which, it never guesses).

How a request's time is read. A stage's *occupancy* is throughput x its mean time: how many
requests are in it on average (Little's law). Stages that are waits (`queue`: waiting for an
engine instance or a batch) are symptoms, not causes: a long queue means the thing behind it is
busy, and the rules look for what that is. A resource whose occupancy is ~1 per unit (one
engine instance busy all the time, one thread at 100% of a core, one lock held all the time)
serialises the service however much load arrives.

Confidence is 0..1: how far past its thresholds the evidence is, scaled by how much the rule can
explain (a rule that invalidates the measurement itself, such as a late load generator or a
noisy neighbour, ranks first when it fires: nothing else in the run can be trusted until it is
fixed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from optlab.diagnose.evidence import WAIT_STAGES, Evidence, percentile
from optlab.store.summary import ProcessEvidence

__all__ = [
    "RULES",
    "Fired",
    "Measure",
    "Outcome",
    "Passed",
    "Resource",
    "Rule",
    "Unevaluable",
    "rule_by_id",
]

Resource = Literal[
    "cpu",
    "gil",
    "gpu",
    "memory",
    "io",
    "lock",
    "queue",
    "generator",
    "network",
    "stall",
    "errors",
    "neighbour",
]


@dataclass(frozen=True)
class Measure:
    """One number a rule read, against the threshold it was judged by (`op`: how)."""

    metric: str
    value: float
    threshold: float | None
    op: Literal[">=", "<="] = ">="  # the direction that counts as a symptom
    unit: str = ""

    @property
    def met(self) -> bool:
        if self.threshold is None:
            return True
        return self.value >= self.threshold if self.op == ">=" else self.value <= self.threshold

    def describe(self) -> str:
        value = _fmt(self.value, self.unit)
        if self.threshold is None:
            return f"{self.metric} {value}"
        mark = self.op if self.met else {">=": "<", "<=": ">"}[self.op]
        return f"{self.metric} {value} {mark} {_fmt(self.threshold, self.unit)}"


def _fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:.0f}%" if abs(value) >= 10 else f"{value:.1f}%"
    if unit == "x":
        return f"{value:.2f}x" if abs(value) < 10 else f"{value:.0f}x"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text} {unit}".rstrip()


@dataclass(frozen=True)
class Fired:
    stage: str | None
    confidence: float
    evidence: tuple[Measure, ...]
    summary: str  # one sentence: what is wrong, in the run's numbers


@dataclass(frozen=True)
class Passed:
    evidence: tuple[Measure, ...] = ()


@dataclass(frozen=True)
class Unevaluable:
    missing: str  # what evidence the run lacks, and how to get it


Outcome = Fired | Passed | Unevaluable
Params = Mapping[str, float]


@dataclass(frozen=True)
class Rule:
    id: str
    resource: Resource
    title: str
    symptom: str  # the row of the method's symptom table this rule reads
    reads: tuple[str, ...]  # the evidence it needs
    params: Mapping[str, float] = field(default_factory=dict)
    # Measurement rules: when they fire the run's other figures are suspect, so they rank first.
    invalidates: bool = False
    # Rules whose finding this one's explains more precisely: dropped when both fire.
    subsumes: tuple[str, ...] = ()
    check_fn: Callable[[Evidence, Params], Outcome] = field(default=lambda e, p: Passed())

    def check(self, evidence: Evidence, overrides: Params | None = None) -> Outcome:
        params = {**self.params, **(overrides or {})}
        return self.check_fn(evidence, params)


def _ramp(value: float, start: float, full: float) -> float:
    """0 at `start`, 1 at `full` (either direction), clamped."""
    if full == start:
        return 1.0 if value >= full else 0.0
    return min(1.0, max(0.0, (value - start) / (full - start)))


def _confidence(*strengths: float, base: float = 0.55, span: float = 0.4) -> float:
    """base + span x the mean strength: a rule that just fires has `base`."""
    mean = sum(strengths) / len(strengths) if strengths else 1.0
    return round(min(1.0, base + span * mean), 3)


def _past(
    m: Measure,
    stage: str | None,
    full: float,
    summary: str,
    *,
    base: float = 0.55,
    span: float = 0.4,
    context: tuple[Measure, ...] = (),
) -> Outcome:
    """A rule one threshold decides: Passed short of it; past it, Fired with a confidence from
    `base` at the threshold to `base + span` at `full`."""
    measures = (m, *context)
    if not m.met or m.threshold is None:
        return Passed(measures)
    strength = _ramp(m.value, m.threshold, full)
    return Fired(stage, _confidence(strength, base=base, span=span), measures, summary)


# -- shared readings ----------------------------------------------------------------------------


def _qps(e: Evidence) -> float | None:
    return e.run.qps


def _busy_engine(e: Evidence) -> tuple[float, int] | None:
    """(fraction of the measured time the engine instances were busy per instance, instances),
    from what the target reported ("infer": busy_ms); None when it reports no such thing."""
    summary = e.summary
    if summary is None or not e.run.duration_s:
        return None
    busy = summary.target_figure("infer", "busy_ms")
    if not isinstance(busy, int | float):
        return None
    instances = summary.target.get("instances") if isinstance(summary.target, dict) else None
    count = instances if isinstance(instances, int) and instances > 0 else 1
    return float(busy) / 1000 / e.run.duration_s / count, count


def _hot_thread(e: Evidence) -> tuple[str, float] | None:
    process = _target_process(e)
    if process is None or not process.threads:
        return None
    top = max(process.threads, key=lambda t: t.cpu_pct)
    return top.name, top.cpu_pct


def _target_process(e: Evidence) -> ProcessEvidence | None:
    recorded = e.recorded
    if recorded is None:
        return None
    return recorded.process if e.in_process else recorded.service


def _serial_stage(e: Evidence) -> tuple[str, float, float] | None:
    """The work stage that costs a request the most: (name, occupancy, share of the total).

    Ranked by each stage's fastest time: under contention (the GIL, a saturated CPU) every
    stage's wall time stretches with waits, even a stage that only sleeps, while the fastest
    request's time stays close to what the stage itself costs. Ties (equal fastest times, or
    none recorded) go to the mean.
    """
    qps = _qps(e)
    if not qps:
        return None
    best: tuple[str, float, float] | None = None
    best_key: tuple[float, float] = (-1.0, -1.0)
    for name, row in e.work_stages().items():
        if name in WAIT_STAGES or row.mean_ms is None:
            continue
        key = (row.min_ms if row.min_ms is not None else row.mean_ms, row.mean_ms)
        if key > best_key:
            best_key = key
            best = (name, qps * row.mean_ms / 1000, e.share(name) or 0.0)
    return best


def _wait_stage(e: Evidence) -> tuple[str, float] | None:
    shares = {name: e.share(name) for name in e.work_stages() if name in WAIT_STAGES}
    known = {n: s for n, s in shares.items() if s is not None}
    if not known:
        return None
    name = max(known, key=lambda n: known[n])
    return name, known[name]


def _in_flight(e: Evidence) -> float | None:
    recorded = e.recorded
    if recorded is not None and recorded.in_flight_mean is not None:
        return recorded.in_flight_mean
    counts = [w.in_flight for w in e.windows if w.in_flight is not None]
    if counts:
        return sum(counts) / len(counts)
    concurrency = e.load.get("concurrency")
    return float(concurrency) if isinstance(concurrency, int | float) else None


def _no_cpu(e: Evidence) -> Unevaluable:
    if not e.in_process and e.target_kind == "http":
        return Unevaluable(
            "no CPU figures for a service optlab did not start (kind http): start it with "
            "kind command so its process tree is sampled"
        )
    return Unevaluable("no CPU samples in the measured phase")


# -- the rules --------------------------------------------------------------------------------


def _generator(e: Evidence, p: Params) -> Outcome:
    if e.load.get("mode") != "open":
        lag = e.harness_p99("start_lag")
        if lag is None:
            return Unevaluable("no start-lag series recorded")
        limit = p["start_lag_p99_ms"]
        m = Measure("start-lag P99", lag, limit, unit="ms")
        return _past(
            m,
            None,
            5 * limit,
            f"clients started requests {lag:.2f} ms late (P99): the load generator, not the "
            "target, set the pace",
            base=0.8,
            span=0.15,
        )
    lag = e.harness_p99("send_lag")
    if lag is None:
        return Unevaluable("no send-lag series recorded")
    limit = float(e.run.protocol.get("max_send_lag_p99_ms") or p["send_lag_p99_ms"])
    m = Measure("send-lag P99", lag, limit, unit="ms")
    return _past(
        m,
        None,
        5 * limit,
        f"the load generator sent {lag:.2f} ms late (P99, limit {limit:g} ms): it could not "
        "keep the schedule, so the latency and the rate are its own, not the target's",
        base=0.85,
        span=0.14,
    )


def _neighbour(e: Evidence, p: Params) -> Outcome:
    recorded = e.recorded
    other = recorded.neighbour_cpu_pct if recorded is not None else None
    if other is None:
        other = e.mean_of("other_cpu_pct")
    steal = recorded.steal_pct if recorded is not None else None
    if steal is None:
        steal = e.mean_of("steal_pct")
    if other is None and steal is None:
        return Unevaluable("no readings of other processes' CPU or of steal time")
    cores = e.cores or 1
    measures: list[Measure] = []
    strengths: list[float] = []
    if other is not None:
        share = other / cores  # percent of the machine
        m = Measure("other processes' CPU (of the machine)", share, p["machine_pct"], unit="%")
        measures.append(m)
        if m.met:
            strengths.append(_ramp(share, p["machine_pct"], 2.5 * p["machine_pct"]))
    if steal is not None:
        m = Measure("steal", steal, p["steal_pct"], unit="%")
        measures.append(m)
        if m.met:
            strengths.append(_ramp(steal, p["steal_pct"], 3 * p["steal_pct"]))
    if not strengths:
        return Passed(tuple(measures))
    return Fired(
        None,
        _confidence(max(strengths), base=0.8, span=0.18),
        tuple(measures),
        "other work on the machine took CPU the run needed: its figures are the machine's "
        "contention as much as the target's",
    )


def _errors(e: Evidence, p: Params) -> Outcome:
    done, failed = e.run.requests, e.run.errors
    if done is None or failed is None:
        return Unevaluable("the run has no request counts")
    total = done + failed
    if total == 0:
        return Unevaluable("no request finished")
    rate = 100 * failed / total
    limit = 100 * float(e.run.protocol.get("max_error_rate") or p["error_rate"])
    m = Measure("error rate", rate, limit, unit="%")
    if failed == 0:
        return Passed((m,))
    kinds = e.summary.errors_by_type if e.summary is not None else {}
    top = max(kinds, key=lambda k: kinds[k]) if kinds else "errors"
    return _past(
        m,
        None,
        10 * limit,
        f"{rate:.1f}% of requests failed (mostly {top}): an overloaded or broken target; "
        "latency of the survivors flatters it",
        base=0.8,
        span=0.18,
    )


def _memory(e: Evidence, p: Params) -> Outcome:
    recorded = e.recorded
    trend = recorded.memory if recorded is not None else None
    if trend is None:
        return Unevaluable("no RSS-against-requests trend recorded (too few samples?)")
    grown = trend.mib_per_1k_requests * (e.run.requests or 0) / 1000
    measures: tuple[Measure, ...] = (
        Measure("RSS slope", trend.mib_per_1k_requests, p["mib_per_1k"], unit="MiB/1k req"),
        Measure("fit R²", trend.r2, p["r2"]),
        Measure("RSS growth over the run", grown, p["growth_mib"], unit="MiB"),
    )
    # A pool warming up (threads created, buffers first touched) also grows RSS steadily for
    # a while, then stops; a leak keeps its pace: the second half must grow at least
    # `late_share` as fast as the first.
    halves = _half_slopes(e.rss_series())
    if halves is not None and halves[0] > 0:
        measures = (*measures, Measure("second half's RSS growth / first's", halves[1] / halves[0],
                                       p["late_share"], unit="x"))  # fmt: skip
    if not all(m.met for m in measures):
        return Passed(measures)
    return Fired(
        None,
        _confidence(
            _ramp(trend.r2, p["r2"], 0.99), _ramp(grown, p["growth_mib"], 8 * p["growth_mib"])
        ),
        measures,
        f"memory grows with every request ({trend.mib_per_1k_requests:.2f} MiB per 1,000, "
        f"R² {trend.r2:.2f}): a leak; a longer run will run out of memory",
    )


def _half_slopes(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares slopes (per second) of the first and second half of `points`; None with
    fewer than 6 points."""
    if len(points) < 6:
        return None
    middle = len(points) // 2

    def slope(part: list[tuple[float, float]]) -> float:
        mean_t = sum(t for t, _ in part) / len(part)
        mean_v = sum(v for _, v in part) / len(part)
        spread = sum((t - mean_t) ** 2 for t, _ in part)
        if spread == 0:
            return 0.0
        return sum((t - mean_t) * (v - mean_v) for t, v in part) / spread

    return slope(points[:middle]), slope(points[middle:])


def _io(e: Evidence, p: Params) -> Outcome:
    iowait = e.mean_of("iowait_pct")
    if iowait is None:
        return Unevaluable("no I/O-wait readings on this host")
    m = Measure("I/O wait (of the machine)", iowait, p["iowait_pct"], unit="%")
    top = _serial_stage(e)
    return _past(
        m,
        top[0] if top else None,
        4 * p["iowait_pct"],
        f"the CPUs sat waiting for I/O {iowait:.0f}% of the time"
        + (f", in the {top[0]} stage" if top else "")
        + ": data loading or writes, not compute",
    )


def _cpu(e: Evidence, p: Params) -> Outcome:
    cpu, cores = e.target_cpu_pct(), e.cores
    machine = e.machine_cpu_pct()
    if cpu is None or cores is None:
        return _no_cpu(e)
    top = _serial_stage(e)
    if top is None:
        return Unevaluable("no stage timings: the target reports no stages")
    stage, occupancy, share = top
    used = cpu / 100 / cores * 100  # percent of the machine
    hot = _hot_thread(e)
    measures = [Measure("target CPU (of the machine)", used, p["machine_pct"], unit="%")]
    strengths = [_ramp(used, p["machine_pct"], 98)]
    saturated = measures[0].met
    if not saturated and hot is not None:
        # One thread at a full core: a serial stage is CPU-bound however many cores idle.
        thread = Measure(f"busiest thread ({hot[0]}) CPU", hot[1], p["thread_pct"], unit="%")
        measures = [thread]
        strengths = [_ramp(hot[1], p["thread_pct"], 99)]
        saturated = thread.met
    engine = _busy_engine(e)
    if not saturated and engine is not None and _batching_on(e):
        # An engine that batches already and is still busy all the time: its pass is the
        # limit. (Without batching, a busy engine is the queueing rule's: batch first.)
        busy = Measure("engine busy (per instance)", 100 * engine[0], p["thread_pct"], unit="%")
        measures, strengths, saturated = [busy], [_ramp(busy.value, p["thread_pct"], 99)], busy.met
    if machine is not None:
        measures.append(Measure("machine CPU", machine, None, unit="%"))
    measures.append(Measure(f"{stage} share of latency", 100 * share, None, unit="%"))
    if not saturated:
        return Passed(tuple(measures))
    return Fired(
        stage,
        _confidence(*strengths, base=0.6, span=0.35),
        tuple(measures),
        f"the CPU is saturated ({cpu:.0f}% of one core, {cores} cores) and {stage} is the "
        f"busiest stage ({occupancy:.2f} requests in it on average)",
    )


def _gil(e: Evidence, p: Params) -> Outcome:
    cpu, cores = e.target_cpu_pct(), e.cores
    if cpu is None or cores is None:
        return _no_cpu(e)
    if not e.in_process and (e.recorded is None or e.recorded.profile is None):
        return Unevaluable(
            "the target runs in another process: profile it (`optlab run --profile`) to see "
            "whether its threads wait for the GIL"
        )
    if cores < 2:
        return Passed((Measure("cores", cores, 2),))
    in_flight = _in_flight(e) or 0.0
    cores_used = cpu / 100
    measures = [
        Measure("target CPU (cores)", cores_used, p["low_cores"], unit="cores"),
        Measure("target CPU (cores)", cores_used, p["high_cores"], op="<=", unit="cores"),
        Measure("machine cores", cores, 2),
        Measure("requests in flight", in_flight, 2),
    ]
    # py-spy's GIL share is context, not a gate: its samplers run side by side and their
    # counts drift apart on a busy machine (metrics/profile.py); it only adds confidence.
    profile = e.recorded.profile if e.recorded is not None else None
    held = profile.gil_pct if profile is not None else None
    if held is not None:
        measures.append(Measure("py-spy: samples holding the GIL", held, None, unit="%"))
    engine = _busy_engine(e)
    if engine is not None:
        # A single busy engine instance explains one core of CPU without any GIL (queueing).
        measures.append(Measure("engine busy (per instance)", 100 * engine[0], 80, "<=", "%"))
    hot = _hot_thread(e)
    if hot is not None:
        measures.append(Measure(f"busiest thread ({hot[0]}) CPU", hot[1], 85, "<=", "%"))
    if not all(m.met for m in measures):
        return Passed(tuple(measures))
    top = _serial_stage(e)
    stage = top[0] if top else None
    if top is not None:
        measures.append(Measure(f"{top[0]}: requests in it (busiest work stage)", top[1], None))
    closeness = 1 - min(1.0, abs(cores_used - 1.0) / 0.25)
    strengths = [closeness] if held is None else [closeness, _ramp(held, 50, 90)]
    return Fired(
        stage,
        _confidence(*strengths, base=0.6, span=0.3),
        tuple(measures),
        f"{cores_used:.2f} of {cores} cores busy with {in_flight:.0f} requests in flight: "
        "Python work"
        + (f" in {stage}" if stage else "")
        + " runs one thread at a time (the GIL), the other cores idle",
    )


def _lock(e: Evidence, p: Params) -> Outcome:
    qps, cpu, cores = _qps(e), e.target_cpu_pct(), e.cores
    if not qps:
        return Unevaluable("no throughput")
    best: tuple[str, float] | None = None
    for name, row in e.work_stages().items():
        if name in WAIT_STAGES or row.min_ms is None or row.mean_ms is None:
            continue
        # A stage whose bare service time (its fastest request) times the throughput is ~1
        # while its mean is far above its minimum: requests queue INSIDE it, one at a time.
        parallel = qps * row.min_ms / 1000
        inflation = row.mean_ms / max(row.min_ms, 1e-6)
        if inflation >= p["inflation"] and (best is None or parallel > best[1]):
            best = (name, parallel)
    in_flight = _in_flight(e) or 0.0
    if best is None:
        return Passed((Measure("requests in flight", in_flight, p["in_flight"]),))
    stage, parallel = best
    row = e.stages[stage]
    measures = [
        Measure(f"{stage}: throughput x fastest time", parallel, p["parallel_high"], "<=", "x"),
        Measure(f"{stage}: throughput x fastest time", parallel, p["parallel_low"], ">=", "x"),
        Measure(f"{stage}: mean / fastest", (row.mean_ms or 0) / (row.min_ms or 1), None, unit="x"),
        Measure("requests in flight", in_flight, p["in_flight"]),
    ]
    if cpu is not None and cores:
        measures.append(Measure("target CPU (cores)", cpu / 100, p["idle_cores"], "<=", "cores"))
    if not all(m.met for m in measures):
        return Passed(tuple(measures))
    return Fired(
        stage,
        _confidence(1 - min(1.0, abs(parallel - 1.0) / 0.5), base=0.62, span=0.3),
        tuple(measures),
        f"{stage} serves one request at a time ({qps:.0f}/s x {row.min_ms:.2f} ms fastest = "
        f"{parallel:.2f}) while {in_flight:.0f} are in flight and the CPU idles: a lock or a "
        "single worker serialises it",
    )


def _queueing(e: Evidence, p: Params) -> Outcome:
    wait = _wait_stage(e)
    if wait is None:
        return Passed()
    stage, share = wait
    engine = _busy_engine(e)
    measures = [Measure(f"{stage} share of latency", 100 * share, p["wait_share_pct"], unit="%")]
    if engine is None:
        top = _serial_stage(e)
        if top is None:
            return Unevaluable("no stage timings behind the wait")
        measures.append(Measure(f"{top[0]} occupancy", top[1], p["busy"], unit="requests"))
    else:
        busy, instances = engine
        measures.append(
            Measure(f"engine busy (each of {instances})", 100 * busy, 100 * p["busy"], unit="%")
        )
    if not all(m.met for m in measures):
        return Passed(tuple(measures))
    return Fired(
        stage,
        _confidence(_ramp(share, p["wait_share_pct"] / 100, 0.95), base=0.62, span=0.3),
        tuple(measures),
        f"requests spend {100 * share:.0f}% of their time waiting in {stage} for an engine "
        "that is busy nearly all the time: more engine capacity per request (batching or "
        "instances) is the lever",
    )


def _batching(e: Evidence, p: Params) -> Outcome:
    recorded = e.recorded
    batching = recorded.batching if recorded is not None else None
    if batching is None:
        return Passed() if not _batching_on(e) else Unevaluable("no batching figures recorded")
    if batching.fill_ratio is None or batching.wait_ms_mean is None:
        return Unevaluable("the batcher reported no fill ratio or batch wait")
    total = e.total.mean_ms if e.total is not None else None
    wait_share = 100 * batching.wait_ms_mean / total if total else 0.0
    measures = (
        Measure("batch fill (mean / max)", batching.fill_ratio, p["fill"], "<="),
        Measure("wait for a batch (share of latency)", wait_share, p["wait_share_pct"], unit="%"),
    )
    if not all(m.met for m in measures):
        return Passed(measures)
    wait = _wait_stage(e)
    return Fired(
        wait[0] if wait else None,
        _confidence(
            _ramp(p["fill"] - batching.fill_ratio, 0, p["fill"]),
            _ramp(wait_share, p["wait_share_pct"], 80),
        ),
        measures,
        f"batches leave {100 * batching.fill_ratio:.0f}% full after waiting "
        f"{batching.wait_ms_mean:.1f} ms: requests wait for company that does not come",
    )


def _batching_on(e: Evidence) -> bool:
    batching = e.knobs.get("batching")
    return isinstance(batching, dict) and batching.get("mode") not in (None, "off")


def _stalls(e: Evidence, p: Params) -> Outcome:
    total = e.total
    if total is None or total.p50_ms is None or total.p99_ms is None or total.min_ms is None:
        return Unevaluable("no end-to-end latency")
    ratio = total.p99_ms / max(total.p50_ms, 1e-6)
    # Queueing also stretches the tail, but it lifts the median too; a stall leaves most
    # requests as fast as the fastest and a few far slower.
    unqueued = total.p50_ms / max(total.min_ms, 1e-6)
    measures = [
        Measure("P99 / P50", ratio, p["tail_ratio"], unit="x"),
        Measure("P50 / fastest", unqueued, p["p50_over_min"], "<=", "x"),
    ]
    gc = e.recorded.gc if e.recorded is not None else None
    if gc is not None:
        measures.append(Measure("GC pauses (share of time)", gc.share_pct, None, unit="%"))
        measures.append(Measure("longest GC pause", gc.pause_max_ms, None, unit="ms"))
    if not (measures[0].met and measures[1].met):
        return Passed(tuple(measures))
    spikes = e.window_p99s()
    if len(spikes) >= 3:
        typical = percentile(spikes, 50) or 0.0
        worst = max(spikes) / max(typical, 1e-6)
        measures.append(Measure("worst 1 s window P99 / typical", worst, None, unit="x"))
    return Fired(
        None,
        _confidence(_ramp(ratio, p["tail_ratio"], 6 * p["tail_ratio"]), base=0.58, span=0.32),
        tuple(measures),
        f"most requests are fast (P50 {total.p50_ms:.2f} ms) but the slowest stall "
        f"(P99 {total.p99_ms:.1f} ms, {ratio:.0f}x): pauses (GC, a background task, "
        "contention), not steady work",
    )


def _network(e: Evidence, p: Params) -> Outcome:
    recorded = e.recorded
    network = recorded.network if recorded is not None else None
    if network is None:
        if e.target_kind in ("http", "command"):
            return Unevaluable(
                "the server sends no Server-Timing total, so network and HTTP cost cannot "
                "be told from the server's own time"
            )
        return Passed()
    m = Measure(
        "network + HTTP (share of latency)", 100 * network.overhead_share, p["share_pct"], unit="%"
    )
    return _past(
        m,
        None,
        80,
        f"{network.overhead_p50_ms:.2f} ms of a {network.client_p50_ms:.2f} ms request (P50) "
        "is spent outside the server: connection, serialisation, the network",
        context=(Measure("server's own P50", network.server_p50_ms, None, unit="ms"),),
    )


def _gpu_reading(e: Evidence) -> list[float] | Unevaluable:
    utils = e.gpu_utils()
    if utils is None:
        if e.knobs.get("device") == "cuda":
            return Unevaluable("no GPU evidence: NVML gave no readings during the run")
        return Unevaluable("no GPU evidence: the run had no GPU telemetry")
    return utils


def _gpu_compute(e: Evidence, p: Params) -> Outcome:
    utils = _gpu_reading(e)
    if isinstance(utils, Unevaluable):
        return utils
    p95 = percentile(utils, 50) or 0.0
    m = Measure("GPU utilisation (median sample)", p95, p["util_pct"], unit="%")
    top = _serial_stage(e)
    return _past(
        m,
        top[0] if top else None,
        99,
        f"the GPU is busy {p95:.0f}% of the time: the model's own compute is the limit",
        base=0.65,
        span=0.3,
    )


def _gpu_starved(e: Evidence, p: Params) -> Outcome:
    utils = _gpu_reading(e)
    if isinstance(utils, Unevaluable):
        return utils
    p95 = percentile(utils, 95) or 0.0
    cpu, cores = e.target_cpu_pct(), e.cores
    measures = [Measure("GPU utilisation P95", p95, p["util_p95_pct"], "<=", "%")]
    host_bound = False
    if cpu is not None and cores:
        used = cpu / cores
        measures.append(Measure("target CPU (of the machine)", used, p["cpu_pct"], unit="%"))
        host_bound = used >= p["cpu_pct"] or 0.75 <= cpu / 100 <= 1.25
    top = _serial_stage(e)
    if not (measures[0].met and host_bound and top is not None):
        return Passed(tuple(measures))
    return Fired(
        top[0],
        _confidence(_ramp(p["util_p95_pct"] - p95, 0, p["util_p95_pct"]), base=0.65),
        tuple(measures),
        f"the GPU idles (P95 {p95:.0f}%) while the host is busy in {top[0]}: the CPU side "
        "starves the model",
    )


def _gpu_throttled(e: Evidence, p: Params) -> Outcome:
    seen = total = 0
    for sample in e.samples:
        if sample.gpus is None:
            continue
        total += 1
        if any(g.throttle_reasons for g in sample.gpus):
            seen += 1
    if total == 0:
        reading = _gpu_reading(e)
        return reading if isinstance(reading, Unevaluable) else Passed()
    share = 100 * seen / total
    m = Measure("samples with GPU clocks lowered", share, p["share_pct"], unit="%")
    return _past(
        m,
        None,
        100,
        "the GPU ran below its clocks (power, thermal or sync boost limits) for "
        f"{share:.0f}% of the run",
    )


RULES: tuple[Rule, ...] = (
    Rule(
        "load-generator",
        "generator",
        "load generator bound",
        "send lag: the generator could not keep the schedule",
        ("send_lag", "start_lag"),
        {"send_lag_p99_ms": 2.0, "start_lag_p99_ms": 5.0},
        invalidates=True,
        check_fn=_generator,
    ),
    Rule(
        "noisy-neighbour",
        "neighbour",
        "noisy neighbour",
        "other processes (or the hypervisor) took the CPU",
        ("neighbour_cpu_pct", "steal_pct"),
        {"machine_pct": 20.0, "steal_pct": 10.0},
        invalidates=True,
        check_fn=_neighbour,
    ),
    Rule(
        "errors",
        "errors",
        "errors or overload",
        "requests failed",
        ("requests", "errors"),
        {"error_rate": 0.01},
        invalidates=True,
        check_fn=_errors,
    ),
    Rule(
        "memory-leak",
        "memory",
        "memory leak",
        "memory that only grows is a leak",
        ("memory",),
        {"mib_per_1k": 0.5, "r2": 0.8, "growth_mib": 16.0, "late_share": 0.5},
        check_fn=_memory,
    ),
    Rule(
        "io-wait",
        "io",
        "I/O wait",
        "I/O wait is data loading",
        ("iowait_pct", "stages"),
        {"iowait_pct": 5.0},
        check_fn=_io,
    ),
    Rule(
        "gpu-compute-bound",
        "gpu",
        "GPU compute-bound",
        "GPU busy and latency high: the model itself (FP16, INT8, TensorRT)",
        ("gpus", "stages"),
        {"util_pct": 85.0},
        check_fn=_gpu_compute,
    ),
    Rule(
        "gpu-starved",
        "cpu",
        "GPU starved by the CPU",
        "GPU utilisation low while the CPU is saturated: preprocessing starves the model",
        ("gpus", "cpu_process_pct", "stages"),
        {"util_p95_pct": 70.0, "cpu_pct": 85.0},
        subsumes=("cpu-bound", "gil-bound"),
        check_fn=_gpu_starved,
    ),
    Rule(
        "gpu-throttled",
        "gpu",
        "GPU clocks lowered",
        "the GPU ran below its clocks",
        ("gpus",),
        {"share_pct": 20.0},
        check_fn=_gpu_throttled,
    ),
    Rule(
        "cpu-bound",
        "cpu",
        "CPU-bound stage",
        "CPU saturated in one stage",
        ("cpu_process_pct", "threads", "stages"),
        {"machine_pct": 85.0, "thread_pct": 85.0},
        subsumes=("tail-stalls",),
        check_fn=_cpu,
    ),
    Rule(
        "gil-bound",
        "gil",
        "GIL-bound",
        "one core's worth of CPU on a multi-core machine with work waiting",
        ("cpu_process_pct", "threads", "in_flight", "profile"),
        {"low_cores": 0.65, "high_cores": 1.3},
        subsumes=("tail-stalls",),
        check_fn=_gil,
    ),
    Rule(
        "serialised",
        "lock",
        "serialised on a lock",
        "throughput ~ 1 / service time with idle CPU",
        ("stages", "in_flight", "cpu_process_pct"),
        {
            "parallel_low": 0.6,
            "parallel_high": 1.4,
            "inflation": 2.0,
            "in_flight": 2.0,
            "idle_cores": 0.6,
        },
        check_fn=_lock,
    ),
    Rule(
        "queueing",
        "queue",
        "queueing for the engine",
        "a long queue means concurrency or batching",
        ("stages", "target.infer"),
        {"wait_share_pct": 50.0, "busy": 0.8},
        check_fn=_queueing,
    ),
    Rule(
        "under-batching",
        "queue",
        "under-batching",
        "batches leave mostly empty after a long wait",
        ("batching",),
        {"fill": 0.5, "wait_share_pct": 30.0},
        check_fn=_batching,
    ),
    Rule(
        "tail-stalls",
        "stall",
        "tail stalls",
        "P99 far above P50: stalls, GC or contention",
        ("stages", "windows", "gc"),
        {"tail_ratio": 4.0, "p50_over_min": 1.6},
        check_fn=_stalls,
    ),
    Rule(
        "network",
        "network",
        "network and HTTP cost",
        "the client's time far above the server's own",
        ("network",),
        {"share_pct": 40.0},
        check_fn=_network,
    ),
)


def rule_by_id(rule_id: str) -> Rule | None:
    return next((r for r in RULES if r.id == rule_id), None)
