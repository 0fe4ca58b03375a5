"""The checks of the rule catalogue (`optlab.diagnose.rules`) on the measurement itself and
who set its pace: the load generator, a saturated target, the garbage collector, a noisy
neighbour, errors. They read the run's verdict where it judged the same thing, so a diagnosis
agrees with it (docs/diagnose.md "Agreement with the verdict")."""

from __future__ import annotations

from optlab.diagnose import readings
from optlab.diagnose.evidence import Evidence
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
from optlab.run.pace import SATURATION_SHORTFALL
from optlab.store.reasons import GENERATOR

__all__ = ["check_errors", "check_gc", "check_generator", "check_neighbour", "check_saturated"]


def check_generator(e: Evidence, p: Params) -> Outcome:
    if readings.saturation(e) is not None:
        # The target could not keep up: late sends are its backlog's doing, not the
        # generator's (the verdict says so too); the saturation rule names it.
        return Passed((Measure("target saturated (the verdict's reason)", 1, None),))
    if not e.open_loop:
        return _clients(e)
    blamed = readings.verdict_says(e, *GENERATOR)
    lag = e.harness_p99("send_lag")
    if lag is None:
        return Unevaluable("no send-lag series recorded")
    pauses = _gc_pauses(e)
    if pauses is not None and pauses >= 0.5 * lag:
        # In optlab's process the collector stops the generator's threads with the target's:
        # the late sends are its pauses (the gc-churn rule's finding), not a slow generator.
        return Passed((Measure("send-lag P99", lag, None, unit="ms"),
                       Measure("longest GC pause", pauses, None, unit="ms")))  # fmt: skip
    limit = float(e.run.protocol.get("max_send_lag_p99_ms") or p["send_lag_p99_ms"])
    m = Measure("send-lag P99", lag, limit, unit="ms")
    summary = (
        f"the load generator sent {lag:.2f} ms late (P99, limit {limit:g} ms): it could not "
        "keep the schedule, so the latency and the rate are its own, not the target's"
    )
    if e.run.valid is not None:
        # The verdict judged this run's pace (relative to what was measured): the rule agrees
        # with it rather than second-guessing it with a fixed limit.
        if blamed is None:
            return Passed((m, Measure("the verdict blames the generator", 0, None)))
        return Fired(None, confidence(ramp(lag, limit, 5 * limit), base=0.85, span=0.14),
                     (m,), blamed if lag <= limit else summary)  # fmt: skip
    return _relative(e, p, m, summary, base=0.85, span=0.14)


def _gc_pauses(e: Evidence) -> float | None:
    """The longest GC pause of a run whose collector took a real share of its time (in
    optlab's process, so with an in-process target); None otherwise."""
    gc = e.recorded.gc if e.recorded is not None else None
    if not e.in_process or gc is None or gc.share_pct < GC_SHARE_PCT:
        return None
    return gc.pause_max_ms


GC_SHARE_PCT = 5.0  # the gc-churn rule's default


def _clients(e: Evidence) -> Outcome:
    """A closed loop: its clients were held up between calls when the verdict says so (its
    `clients-held-up` reason: Little's law, fewer clients inside a call than configured). The
    start lag is no measure of it: a closed loop records it as 0 (docs/diagnose.md)."""
    if e.run.valid is None:
        return Unevaluable("no verdict to read (a closed loop is judged by the verdict's reason)")
    held = e.run.reason("clients-held-up")
    m = Measure("clients held up between calls (the verdict's reason)", 1 if held else 0, None)
    if held is None:
        return Passed((m,))
    # The verdict decided, on its own bound (run/pace.py): the rule's base confidence.
    return Fired(None, confidence(0.0, base=0.8, span=0.15), (m,), held.text)


def _relative(
    e: Evidence, p: Params, m: Measure, summary: str, *, base: float, span: float
) -> Outcome:
    """Late past the absolute limit AND by a share of the target's own latency: a few ms of
    lag inside a 250 ms request is the target's backlog, not the generator."""
    p50 = e.total.p50_ms if e.total is not None else None
    measures: tuple[Measure, ...] = (m,)
    if p50:
        share = 100 * m.value / p50
        measures = (m, Measure("lag P99 / latency P50", share, 100 * p["latency_share"], unit="%"))
    if not all(x.met for x in measures) or m.threshold is None:
        return Passed(measures)
    strength = ramp(m.value, m.threshold, 5 * m.threshold)
    return Fired(None, confidence(strength, base=base, span=span), measures, summary)


def check_saturated(e: Evidence, p: Params) -> Outcome:
    said = readings.saturation(e)
    if said is None:
        if not e.open_loop:
            return Passed()
        return Passed((Measure("target saturated", 0, None),))
    why, code = said
    rate, qps = e.offered_qps, readings.throughput(e)
    measures: list[Measure] = []
    if rate and qps is not None:
        # The line the one saturation rule (`run.pace.saturated_by`) draws, shown beside it.
        measures.append(Measure("completed / offered rate", 100 * qps / rate,
                                100 * (1 - SATURATION_SHORTFALL), "<=", "%"))  # fmt: skip
    wait = readings.wait_stage(e)
    top = readings.serial_stage(e)
    stage = wait[0] if wait is not None else (top[0] if top is not None else None)
    return Fired(
        stage,
        confidence(1.0, base=0.9, span=0.05),
        tuple(measures),
        # The verdict's saturation reason is a sentence of its own ("the target is saturated:
        # ..."); an early stop's and the windows' reading are clauses.
        "the target could not sustain the offered rate, so requests queued for it (the "
        f"verdict: {why[:1].lower() + why[1:]})"
        if code == "saturated"
        else f"the target could not sustain the offered rate: {why}; requests queued for it",
    )


def check_gc(e: Evidence, p: Params) -> Outcome:
    if not e.in_process:
        return Passed()  # the GC recorded is optlab's own, not the service's
    gc = e.recorded.gc if e.recorded is not None else None
    if gc is None:
        return Unevaluable("no garbage-collector pauses recorded")
    total = e.total
    p99 = total.p99_ms if total is not None else None
    measures = [
        Measure("GC pauses (share of wall time)", gc.share_pct, p["share_pct"], unit="%"),
        Measure("longest GC pause", gc.pause_max_ms, p["pause_max_ms"], unit="ms"),
        Measure("collections", gc.collections, None),
    ]
    long_pause = measures[1].met and (p99 is None or gc.pause_max_ms >= 0.5 * p99)
    if not (measures[0].met or long_pause):
        return Passed(tuple(measures))
    lag = e.harness_p99("send_lag") if e.open_loop else None
    late = (
        f"; the load generator's late sends (send-lag P99 {lag:.0f} ms) are these pauses"
        if lag is not None and lag >= 2 and gc.pause_max_ms >= 0.5 * lag
        else ""
    )
    return Fired(
        None,
        confidence(ramp(gc.share_pct, p["share_pct"], 4 * p["share_pct"]), base=0.7, span=0.28),
        tuple(measures),
        f"the garbage collector ran {gc.collections} times and stopped every thread for "
        f"{gc.share_pct:.1f}% of the time (pauses up to {gc.pause_max_ms:.0f} ms): objects "
        "allocated per request (by the target, or by the harness at this rate) live long "
        f"enough to be collected{late}",
    )


def check_neighbour(e: Evidence, p: Params) -> Outcome:
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
            strengths.append(ramp(share, p["machine_pct"], 2.5 * p["machine_pct"]))
    if steal is not None:
        m = Measure("steal", steal, p["steal_pct"], unit="%")
        measures.append(m)
        if m.met:
            strengths.append(ramp(steal, p["steal_pct"], 3 * p["steal_pct"]))
    if not strengths:
        return Passed(tuple(measures))
    return Fired(
        None,
        confidence(max(strengths), base=0.8, span=0.18),
        tuple(measures),
        "other work on the machine took CPU the run needed: its figures are the machine's "
        "contention as much as the target's",
    )


def check_errors(e: Evidence, p: Params) -> Outcome:
    stuck = readings.verdict_says(e, "stuck-clients")
    if stuck is not None:
        # Requests that never came back are failures the error count does not hold.
        return Fired(None, 0.9, (), stuck)
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
    return past(
        m,
        None,
        10 * limit,
        f"{rate:.1f}% of requests failed (mostly {top}): an overloaded or broken target; "
        "latency of the survivors flatters it",
        base=0.8,
        span=0.18,
    )
