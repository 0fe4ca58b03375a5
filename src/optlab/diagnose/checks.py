"""The checks of the rule catalogue (`optlab.diagnose.rules`) on the target: memory, I/O, CPU,
the GIL, locks, queueing, batching, tail stalls and the network (the measurement's own checks
are in `optlab.diagnose.pace_checks`). Each reads the evidence and its parameters and returns
an `Outcome`."""

from __future__ import annotations

from typing import Literal

from optlab.diagnose import readings
from optlab.diagnose.evidence import WAIT_STAGES, Evidence, percentile
from optlab.diagnose.findings import (
    Fired,
    Measure,
    Outcome,
    Params,
    Passed,
    Unevaluable,
    confidence,
    past,
    ramp,
)


def check_memory(e: Evidence, p: Params) -> Outcome:
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
    halves = readings.half_slopes(e.rss_series())
    if halves is not None and halves[0] > 0:
        measures = (*measures, Measure("second half's RSS growth / first's", halves[1] / halves[0],
                                       p["late_share"], unit="x"))  # fmt: skip
    if not all(m.met for m in measures):
        return Passed(measures)
    return Fired(
        None,
        confidence(
            ramp(trend.r2, p["r2"], 0.99), ramp(grown, p["growth_mib"], 8 * p["growth_mib"])
        ),
        measures,
        f"memory grows with every request ({trend.mib_per_1k_requests:.2f} MiB per 1,000, "
        f"R² {trend.r2:.2f}): a leak; a longer run will run out of memory",
    )


def check_io(e: Evidence, p: Params) -> Outcome:
    iowait = e.mean_of("iowait_pct")
    if iowait is None:
        return Unevaluable("no I/O-wait readings on this host")
    m = Measure("I/O wait (of the machine)", iowait, p["iowait_pct"], unit="%")
    top = readings.serial_stage(e)
    return past(
        m,
        top[0] if top else None,
        4 * p["iowait_pct"],
        f"the CPUs sat waiting for I/O {iowait:.0f}% of the time"
        + (f", in the {top[0]} stage" if top else "")
        + ": data loading or writes, not compute",
    )


def check_cpu(e: Evidence, p: Params) -> Outcome:
    cpu, cores = e.target_cpu_pct(), e.cores
    machine = e.machine_cpu_pct()
    if cpu is None or cores is None:
        return readings.no_cpu(e)
    top = readings.serial_stage(e)
    # A service that reports no stages: its process tree's CPU still decides whether the
    # target as a whole is CPU-bound.
    if top is None and (e.in_process or e.work_stages()):
        return Unevaluable("no stage timings: the target reports no stages")
    used = cpu / 100 / cores * 100  # percent of the machine
    hot = readings.hot_thread(e)
    measures = [Measure("target CPU (of the machine)", used, p["machine_pct"], unit="%")]
    strengths = [ramp(used, p["machine_pct"], 98)]
    saturated = measures[0].met
    if not saturated and machine is not None and machine >= p["machine_pct"] and used >= 50:
        # The machine is full and the target holds most of it (the load generator the rest):
        # it has no more CPU to take.
        full = Measure("machine CPU", machine, p["machine_pct"], unit="%")
        measures = [Measure("target CPU (of the machine)", used, 50, unit="%"), full]
        strengths, saturated = [ramp(machine, p["machine_pct"], 98)], True
    share = readings.work_share(e, top[0]) if top is not None else None
    if saturated and e.in_process and top is not None and share is not None:
        # The process is busy, but is the stage? One that sleeps or waits leaves the CPU to
        # the harness (the generator rule reads that).
        work = Measure(f"{top[0]}: CPU per request / its fastest time", share, p["work_share"])
        measures.append(work)
        if not work.met:
            return Passed(tuple(measures))
    if not saturated and hot is not None and top is not None:
        # One thread at a full core: a serial stage is CPU-bound however many cores idle,
        # unless requests queue for that one thread (a pool of one: the serialised rule's).
        thread = Measure(f"busiest thread ({hot[0]}) CPU", hot[1], p["thread_pct"], unit="%")
        measures = [thread]
        strengths = [ramp(hot[1], p["thread_pct"], 99)]
        saturated = thread.met and not _single_worker_queue(e, top[0])
    engine = readings.busy_engine(e)
    if not saturated and engine is not None and readings.batching_on(e):
        # An engine that batches already and is still busy all the time: its pass is the
        # limit. (Without batching, a busy engine is the queueing rule's: batch first.)
        busy = Measure("engine busy (per instance)", 100 * engine[0], p["thread_pct"], unit="%")
        measures, strengths, saturated = [busy], [ramp(busy.value, p["thread_pct"], 99)], busy.met
    if machine is not None and not any(m.metric == "machine CPU" for m in measures):
        measures.append(Measure("machine CPU", machine, None, unit="%"))
    if top is not None:
        measures.append(Measure(f"{top[0]} share of latency", 100 * top[2], None, unit="%"))
    if not saturated:
        return Passed(tuple(measures))
    stage = top[0] if top is not None else None
    where = (
        f"{stage} is the busiest stage ({top[1]:.2f} requests in it on average)"
        if top is not None
        else "the service reports no stages to say which part of it"
    )
    return Fired(
        stage,
        confidence(*strengths, base=0.6, span=0.35),
        tuple(measures),
        f"the CPU is saturated ({cpu:.0f}% of one core, {cores} cores) and {where}",
    )


def _single_worker_queue(e: Evidence, stage: str) -> bool:
    """Requests queue inside `stage` for one busy thread (the serialised rule's finding)."""
    row, fastest = e.stages.get(stage), e.fastest_ms(stage)
    if row is None or row.mean_ms is None or fastest is None:
        return False
    return readings.single_worker(e) is not None and row.mean_ms >= 2 * fastest


FULL_MACHINE_PCT = 85.0
WAIT_OWNS = 0.3  # a wait stage this share of the latency: what it waits for is queueing's


def check_gil(e: Evidence, p: Params) -> Outcome:
    cpu, cores = e.target_cpu_pct(), e.cores
    if cpu is None or cores is None:
        return readings.no_cpu(e)
    # A service without a profile still shows the symptom (one core's worth of CPU with work
    # waiting); only which of the GIL or a single thread causes it needs py-spy.
    unprofiled = not e.in_process and (e.recorded is None or e.recorded.profile is None)
    if cores < 2:
        return Passed((Measure("cores", cores, 2),))
    in_flight = readings.in_flight(e) or 0.0
    cores_used = cpu / 100
    measures = [
        Measure("target CPU (cores)", cores_used, p["low_cores"], unit="cores"),
        Measure("target CPU (cores)", cores_used, p["high_cores"], op="<=", unit="cores"),
        Measure("machine cores", cores, 2),
        Measure("requests in flight", in_flight, 2),
    ]
    machine = e.machine_cpu_pct()
    if not e.in_process and machine is not None:
        # A service's other cores must idle: on a full machine (the load generator on the
        # rest) one core is all it could get, which is cpu-bound's finding.
        measures.append(Measure("machine CPU", machine, FULL_MACHINE_PCT, "<=", "%"))
    # py-spy's GIL share is context, not a gate: its samplers run side by side and their
    # counts drift apart on a busy machine (metrics/profile.py); it only adds confidence.
    profile = e.recorded.profile if e.recorded is not None else None
    held = profile.gil_pct if profile is not None else None
    if held is not None:
        measures.append(Measure("py-spy: samples holding the GIL", held, None, unit="%"))
    engine = readings.busy_engine(e)
    if engine is not None:
        # A single busy engine instance explains one core of CPU without any GIL (queueing).
        measures.append(Measure("engine busy (per instance)", 100 * engine[0], 80, "<=", "%"))
    hot = readings.hot_thread(e)
    if hot is not None:
        measures.append(Measure(f"busiest thread ({hot[0]}) CPU", hot[1], 85, "<=", "%"))
    top = readings.serial_stage(e)
    share = readings.work_share(e, top[0]) if top is not None else None
    if top is not None and share is not None:
        # The busiest stage must be the CPU work: a stage that sleeps leaves the core to
        # the harness, whose threads then look GIL-bound.
        measures.append(
            Measure(f"{top[0]}: CPU per request / its fastest time", share, p["work_share"])
        )
    if not all(m.met for m in measures):
        return Passed(tuple(measures))
    stage = top[0] if top else None
    if top is not None:
        measures.append(Measure(f"{top[0]}: requests in it (busiest work stage)", top[1], None))
    closeness = 1 - min(1.0, abs(cores_used - 1.0) / 0.25)
    strengths = [closeness] if held is None else [closeness, ramp(held, 50, 90)]
    where = f" in {stage}" if stage else ""
    if unprofiled:
        return Fired(
            stage,
            confidence(*strengths, base=0.55, span=0.2),
            tuple(measures),
            f"{cores_used:.2f} of {cores} cores busy with {in_flight:.0f} requests in flight: "
            f"the service's work{where} runs one thread at a time, the other cores idle (the "
            "GIL, or a single worker thread: `optlab run --profile` shows which)",
        )
    return Fired(
        stage,
        confidence(*strengths, base=0.6, span=0.3),
        tuple(measures),
        f"{cores_used:.2f} of {cores} cores busy with {in_flight:.0f} requests in flight: "
        f"Python work{where} runs one thread at a time (the GIL), the other cores idle",
    )


def check_lock(e: Evidence, p: Params) -> Outcome:
    qps, cpu, cores = readings.throughput(e), e.target_cpu_pct(), e.cores
    if not qps:
        return Unevaluable("no throughput")
    candidates = [n for n in e.work_stages() if n not in WAIT_STAGES]
    if not candidates and "total" in e.stages and not e.in_process:
        candidates = ["total"]  # a service without stages: the whole service is the stage
    if not candidates:
        return Unevaluable("no stage timings: the target reports no stages")
    best: tuple[str, float] | None = None
    for name in candidates:
        row, fastest = e.stages[name], e.fastest_ms(name)
        if fastest is None or row.mean_ms is None:
            continue
        # A stage whose bare service time (its fastest request in the run) times the
        # throughput is ~1 while its mean is far above it: requests queue INSIDE it, one at a
        # time.
        parallel = qps * fastest / 1000
        inflation = row.mean_ms / max(fastest, 1e-6)
        if inflation >= p["inflation"] and (best is None or parallel > best[1]):
            best = (name, parallel)
    in_flight = readings.in_flight(e) or 0.0
    wait = readings.wait_stage(e)
    worker = readings.single_worker(e, p["worker_share"])
    if worker is not None and (wait is None or wait[1] < WAIT_OWNS):
        # The stage that waits for the worker holds the most time (a batcher's queue is the
        # queueing rule's).
        name = max(candidates, key=lambda n: e.stages[n].mean_ms or 0.0)
        best = (name, qps * (e.fastest_ms(name) or 0.0) / 1000)
    else:
        worker = None
    if best is None:
        return Passed((Measure("requests in flight", in_flight, p["in_flight"]),))
    name, parallel = best
    stage = None if name == "total" else name
    label = stage or "the service"
    fastest_ms = e.fastest_ms(name) or 1.0
    inflation = (e.stages[name].mean_ms or 0) / fastest_ms
    if worker is not None:
        # One thread does the work every request waits for (a pool of one). Its fastest
        # request may itself have waited (a FIFO hand-off on a busy machine), so the thread,
        # not throughput x fastest, is the evidence.
        measures = [
            Measure(f"{label}: mean / fastest", inflation, p["inflation"], unit="x"),
            Measure("requests in flight", in_flight, p["in_flight"]),
            Measure(f"busiest thread ({worker[0]}): share of the target's CPU",
                    100 * worker[2], 100 * p["worker_share"], unit="%"),
        ]  # fmt: skip
        if not all(m.met for m in measures):
            return Passed(tuple(measures))
        return Fired(
            stage,
            confidence(ramp(worker[2], p["worker_share"], 0.95), base=0.7, span=0.25),
            tuple(measures),
            f"{label} waits for one thread ({worker[0]}, {worker[1]:.0f}% of a core, "
            f"{100 * worker[2]:.0f}% of the target's CPU) while {in_flight:.0f} requests are "
            "in flight and cores idle: a single worker (a pool of one) serialises it",
        )
    measures = [
        Measure(f"{label}: throughput x fastest time", parallel, p["parallel_high"], "<=", "x"),
        Measure(f"{label}: throughput x fastest time", parallel, p["parallel_low"], ">=", "x"),
        Measure(f"{label}: mean / fastest", inflation, None, unit="x"),
        Measure("requests in flight", in_flight, p["in_flight"]),
    ]
    inside = readings.queued_inside(e, name)
    if inside is not None:
        # Requests wait for one another inside the stage, not merely vary in length.
        what, value, limit, _ = inside
        op: Literal[">=", "<="] = ">=" if "bulk" in what else "<="
        measures.append(Measure(f"{label}: {what}", value, limit, op, "x"))
    if cpu is not None and cores:
        measures.append(Measure("target CPU (cores)", cpu / 100, p["idle_cores"], "<=", "cores"))
    if not all(m.met for m in measures):
        return Passed(tuple(measures))
    return Fired(
        stage,
        confidence(1 - min(1.0, abs(parallel - 1.0) / 0.5), base=0.62, span=0.3),
        tuple(measures),
        f"{label} serves one request at a time ({qps:.0f}/s x {fastest_ms:.2f} ms fastest = "
        f"{parallel:.2f}) while {in_flight:.0f} are in flight and the CPU idles: a lock or a "
        "single worker serialises it",
    )


def check_queueing(e: Evidence, p: Params) -> Outcome:
    wait = readings.wait_stage(e)
    if wait is None:
        return Passed()
    stage, share = wait
    engine = readings.busy_engine(e)
    measures = [Measure(f"{stage} share of latency", 100 * share, p["wait_share_pct"], unit="%")]
    if engine is None:
        top = readings.serial_stage(e)
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
        confidence(ramp(share, p["wait_share_pct"] / 100, 0.95), base=0.62, span=0.3),
        tuple(measures),
        f"requests spend {100 * share:.0f}% of their time waiting in {stage} for an engine "
        "that is busy nearly all the time: more engine capacity per request (batching or "
        "instances) is the lever",
    )


def check_batching(e: Evidence, p: Params) -> Outcome:
    recorded = e.recorded
    batching = recorded.batching if recorded is not None else None
    if batching is None:
        return (
            Passed() if not readings.batching_on(e) else Unevaluable("no batching figures recorded")
        )
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
    wait = readings.wait_stage(e)
    return Fired(
        wait[0] if wait else None,
        confidence(
            ramp(p["fill"] - batching.fill_ratio, 0, p["fill"]),
            ramp(wait_share, p["wait_share_pct"], 80),
        ),
        measures,
        f"batches leave {100 * batching.fill_ratio:.0f}% full after waiting "
        f"{batching.wait_ms_mean:.1f} ms: requests wait for company that does not come",
    )


def check_stalls(e: Evidence, p: Params) -> Outcome:
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
        confidence(ramp(ratio, p["tail_ratio"], 6 * p["tail_ratio"]), base=0.58, span=0.32),
        tuple(measures),
        f"most requests are fast (P50 {total.p50_ms:.2f} ms) but the slowest stall "
        f"(P99 {total.p99_ms:.1f} ms, {ratio:.0f}x): pauses (GC, a background task, "
        "contention), not steady work",
    )


def check_network(e: Evidence, p: Params) -> Outcome:
    recorded = e.recorded
    network = recorded.network if recorded is not None else None
    if network is None:
        if e.over_network:
            return Unevaluable(
                "the server sends no Server-Timing total, so network and HTTP cost cannot "
                "be told from the server's own time"
            )
        return Passed()
    m = Measure(
        "network + HTTP (share of latency)", 100 * network.overhead_share, p["share_pct"], unit="%"
    )
    return past(
        m,
        None,
        80,
        f"{network.overhead_p50_ms:.2f} ms of a {network.client_p50_ms:.2f} ms request (P50) "
        "is spent outside the server: connection, serialisation, the network",
        context=(Measure("server's own P50", network.server_p50_ms, None, unit="ms"),),
    )
