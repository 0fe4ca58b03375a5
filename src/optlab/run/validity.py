"""The validity verdict (MLPerf LoadGen's VALID/INVALID with reasons) and the warmup rule.

Pure functions over numbers the runner has already computed, so they are tested
directly against hand-made cases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from optlab.run.facts import LoadFacts, RunFacts, Verdict, mean_of
from optlab.run.pace import (
    BACKLOG_GROWTH_MIN,
    GIL_BUSY_PCT,
    generator_bound,
    host_reasons,
    saturated,
    saturation,
    send_lag_judged,
    starved,
)
from optlab.run.stability import COLLAPSE, collapsed, halves_test
from optlab.store.reasons import Reason

__all__ = [
    "P99_MIN_QUERIES",
    "LoadFacts",
    "RunFacts",
    "Verdict",
    "halves",
    "is_stable",
    "machine_facts",
    "plainly_saturated",
    "verdict",
]

# MLPerf's early-stopping bound at 0.99 confidence: the fewest queries that support a percentile.
P99_MIN_QUERIES = 662
P999_MIN_QUERIES = 6_636
DURATION_SLACK = 0.99  # a run stopped by its own timer may end a few ms short


def verdict(facts: RunFacts) -> Verdict:
    """VALID unless a rule below finds a reason; notes say what to know either way. The
    reasons and notes come in this order: coverage, pace, stability, integrity, the machine."""
    reasons: list[Reason] = []
    notes: list[str] = []
    _coverage(facts, reasons, notes)
    _pace(facts, reasons, notes)
    _stability(facts, reasons, notes)
    _integrity(facts, reasons)
    if not facts.open_loop:
        notes.append("closed loop: latency is measured from the actual send (no CO correction)")
    notes += _neighbour_notes(facts.load)
    return Verdict.of(reasons, notes)


def _coverage(facts: RunFacts, reasons: list[Reason], notes: list[str]) -> None:
    """Measured long enough, with enough answers, and few enough errors."""
    measured, requested = facts.measured_s, facts.requested_s
    if facts.interrupted:
        text = f"interrupted after {measured:.1f} s of {requested:g} s"
        reasons.append(Reason(code="interrupted", text=text))
    elif facts.stopped_early is not None:
        reasons.append(
            Reason(
                code="stopped-early",
                text=f"stopped after {measured:.1f} s of {requested:g} s: {facts.stopped_early}",
            )
        )
    elif measured < requested * DURATION_SLACK:
        reasons.append(
            Reason(code="short", text=f"measured {measured:.1f} s, shorter than {requested:g} s")
        )
    if facts.completed < P99_MIN_QUERIES:
        reasons.append(
            Reason(
                code="few-queries",
                text=f"{facts.completed} successful queries: P99 needs at least "
                f"{P99_MIN_QUERIES} (MLPerf's bound at 0.99 confidence); measure longer or at "
                "a higher rate",
            )
        )
    elif facts.completed < P999_MIN_QUERIES:
        notes.append(
            f"P99.9 is not supported by {facts.completed} queries (needs {P999_MIN_QUERIES})"
        )
    total = facts.completed + facts.errors
    if total and facts.errors / total > facts.max_error_rate:
        reasons.append(
            Reason(
                code="errors",
                text=f"error rate {facts.errors / total:.2%} is over the limit "
                f"{facts.max_error_rate:.2%}",
            )
        )


def _pace(facts: RunFacts, reasons: list[Reason], notes: list[str]) -> None:
    """Who set the pace: the target (saturated), the load generator, or the harness's threads."""
    lag = send_lag_judged(facts)
    if saturated(facts):
        reasons.append(saturation(facts))
    elif lag is not None and lag.bound:
        reasons.append(generator_bound(facts, lag))
    elif lag is not None:
        notes.append(
            f"send-lag P99 {lag.lag_ms:.2f} ms ({lag.describe()}): inside the latency, which is "
            "measured from the intended send time; too small against it to set the pace"
        )
    for host in facts.hosts:
        reasons += host_reasons(facts, host)
    held_up = starved(facts)
    if isinstance(held_up, Reason):
        reasons.append(held_up)
    elif held_up is not None:
        notes.append(held_up)
    if (
        facts.in_process
        and facts.start_lag_p99_ms is not None
        and facts.total_p50_ms
        and facts.start_lag_p99_ms > max(1.0, 0.1 * facts.total_p50_ms)
    ):
        # Only an in-process target shares optlab's GIL; a service in another process cannot.
        busy = facts.load.optlab_cpu_pct
        notes.append(
            f"start-lag P99 {facts.start_lag_p99_ms:.2f} ms: the harness's threads waited to "
            "enter the target"
            + (
                f" while optlab's process used {busy:.0f}% of a core (GIL contention with a "
                "CPU-bound target)"
                if busy is not None and busy >= GIL_BUSY_PCT
                else ""
            )
            + "; that time is the harness's, not the target's"
        )


def _stability(facts: RunFacts, reasons: list[Reason], notes: list[str]) -> None:
    """The first and second half of the measured phase agree on QPS: they differ by less than
    the tolerance, or by no more than their own seconds' noise explains (unless
    protocol.stability_pct fixes the tolerance)."""
    first, second = facts.first_half_qps, facts.second_half_qps
    if first is None or second is None:
        notes.append("too short to compare the first and second half: stability not judged")
        return
    if not (first and second):
        return
    drift = abs(second - first) / max(first, second)
    if drift <= facts.stability_tolerance or not _beyond_arrival_noise(facts, first, second):
        return
    apart = f"QPS {first:.1f} in the first half vs {second:.1f} in the second ({drift:.0%} apart"
    test = None if facts.stability_fixed else halves_test(facts.window_qps)
    if facts.stability_fixed or not facts.window_qps:
        why = f", limit {facts.stability_tolerance:.0%}"
        if facts.stability_fixed:
            why += " (protocol.stability_pct)"
    elif test is None:
        notes.append(
            f"{apart}): too few seconds to tell a drift from the seconds' own noise; "
            "stability not judged" + _taken_away(facts.load)
        )
        return
    elif not test.significant and collapsed(first, second):
        # Two batches a half cannot reject even a 99% fall; a fall past COLLAPSE is one.
        why = (
            f", the slower half under {1 - COLLAPSE:.0%} of the faster: a collapse, not noise,"
            f" though {test.describe()}"
        )
    elif not test.significant:
        # Not beyond the noise is not "steady": on a short run the test misses most drifts.
        short = 2 * test.batches * test.batch_s < POWERED_S
        notes.append(
            f"{apart}, {test.describe()}): within the noise, not called a drift"
            + (
                f" (a run under {POWERED_S:g} s can miss one: measure longer to tell)"
                if short
                else ""
            )
            + _taken_away(facts.load)
        )
        return
    else:
        why = f", {test.describe()}"
    reasons.append(
        Reason(
            code="unstable",
            text=f"unstable: {apart}{why})"
            + _taken_away(facts.load)
            + "; measure with --paired or --repeats, or longer, or set "
            "protocol.stability_pct in a new baseline to allow a fixed drift",
        )
    )


def _beyond_arrival_noise(facts: RunFacts, first: float, second: float) -> bool:
    """Open loop: the halves' completions differ by more than random arrivals make them.

    Poisson arrivals at 50/s give ~175 requests in each half of a 7 s level: the counts'
    own spread (sd ~ sqrt(n)) is 7.5% of their difference, so a 10% gap is common and says
    nothing about the target. A drift counts when it is also beyond 3 sd of the counts."""
    if not facts.open_loop:
        return True
    half_s = facts.measured_s / 2
    n1, n2 = first * half_s, second * half_s
    return abs(n1 - n2) > ARRIVAL_NOISE_SIGMAS * math.sqrt(max(n1 + n2, 1.0))


def _integrity(facts: RunFacts, reasons: list[Reason]) -> None:
    """The load measured was the one configured, on a machine that ran at full speed, by a
    model that kept its accuracy."""
    if facts.stuck_clients and facts.clients:
        # A client that never came back sent nothing for the rest of the run: the load was
        # lower than the configured concurrency, and the run measured something else.
        reasons.append(
            Reason(
                code="stuck-clients",
                text=f"{facts.stuck_clients} of {facts.clients} clients were stuck in a call "
                "when the measurement ended (still in flight after the drain): the concurrency "
                "measured was not the configured one; see the timeouts, and fix the target or "
                "its timeout",
            )
        )
    if facts.throttled:
        reasons.append(
            Reason(
                code="throttled",
                text="thermal throttling was seen on a GPU during the measurement",
            )
        )
    drop, limit = facts.accuracy_drop_pts, facts.max_accuracy_drop_pts
    if drop is not None and limit is not None and drop > limit:
        # MLPerf's rule: a result that loses accuracy beyond the allowance does not count,
        # however fast it was.
        reasons.append(
            Reason(
                code="accuracy",
                text=f"accuracy: held-out top-1 is {drop:.2f} points below the fp32 reference "
                f"model's (limit {limit:g} points, slo.max_accuracy_drop_pts)",
            )
        )


ARRIVAL_NOISE_SIGMAS = 3.0
# From this many measured seconds the halves test catches a 30% step in >= 95% of runs; at
# 20-30 s, in about a third (benchmarks/stability_false_alarms.py).
POWERED_S = 40.0
NEIGHBOUR_NOTE_PCT = 25.0  # another process this busy (% of one core) is worth a note
STEAL_NOTE_PCT = 5.0


def _taken_away(load: LoadFacts) -> str:
    """What the machine did meanwhile, when it explains a drift between the halves."""
    parts = []
    first, second = load.steal_pct
    if first is not None and second is not None and max(first, second) >= STEAL_NOTE_PCT:
        worse = "second" if second >= first else "first"
        parts.append(
            f"the hypervisor took away {max(first, second):.0f}% of the CPU in the {worse} half "
            f"(steal; {min(first, second):.0f}% in the other)"
        )
    first, second = load.other_cpu_pct
    if first is not None and second is not None and abs(second - first) >= NEIGHBOUR_NOTE_PCT:
        worse = "second" if second >= first else "first"
        names = _newcomers(load, worse) or ", ".join(_neighbour(n) for n in load.neighbours)
        parts.append(
            f"other processes used {max(first, second):.0f}% of a core in the {worse} half "
            f"({min(first, second):.0f}% in the other)" + (f": {names}" if names else "")
        )
    return "; " + "; ".join(parts) if parts else ""


def _newcomers(load: LoadFacts, worse: str) -> str:
    """The processes whose CPU rose in the `worse` half, most first: the neighbour that came
    (or left) halfway, rather than one that was as busy all along; "" when unknown."""
    other = "first" if worse == "second" else "second"
    rose = [n for n in load.neighbour_halves if n[f"{worse}_pct"] > n[f"{other}_pct"]]
    return ", ".join(
        f"{n.get('name')} (pid {n.get('pid')}, {n[f'{worse}_pct']}% of a core in the {worse} "
        f"half, {n[f'{other}_pct']}% in the other)"
        for n in rose
    )


def _neighbour(entry: dict[str, Any]) -> str:
    return f"{entry.get('name')} (pid {entry.get('pid')}, {entry.get('cpu_pct')}% of a core)"


def _neighbour_notes(load: LoadFacts) -> list[str]:
    notes = []
    busy = [n for n in load.neighbours if float(n.get("cpu_pct") or 0) >= NEIGHBOUR_NOTE_PCT]
    if busy:
        notes.append(
            "other processes used the CPU while this run was measured: "
            + ", ".join(_neighbour(n) for n in busy)
        )
    steal = mean_of(load.steal_pct)
    if steal is not None and steal >= STEAL_NOTE_PCT:
        notes.append(f"the hypervisor took away {steal:.0f}% of the CPU (steal) meanwhile")
    if load.concurrent_runs:
        notes.append(
            "another optlab measurement ran on this host at the same time ("
            + ", ".join(load.concurrent_runs)
            + "): their loads competed for the same CPUs; measure one at a time"
        )
    return notes


def is_stable(
    qps: Sequence[float], p50_ms: Sequence[float | None], windows: int, tolerance: float
) -> bool:
    """The last `windows` aggregated windows agree within ±tolerance on QPS and P50."""
    if len(qps) < windows or len(p50_ms) < windows:
        return False
    for series in (list(qps[-windows:]), list(p50_ms[-windows:])):
        if any(v is None or v <= 0 for v in series):
            return False
        values = [float(v) for v in series if v is not None]
        mean = sum(values) / len(values)
        if any(abs(v - mean) > tolerance * mean for v in values):
            return False
    return True


MIN_WINDOWS_FOR_HALVES = 4  # two seconds a half; fewer is noise, not a trend


def halves(qps_per_second: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean QPS of the first and second half of the measured seconds (None when too short)."""
    n = len(qps_per_second)
    if n < MIN_WINDOWS_FOR_HALVES:
        return None, None
    first, second = qps_per_second[: n // 2], qps_per_second[n - n // 2 :]
    return sum(first) / len(first), sum(second) / len(second)


def machine_facts(
    measured: Sequence[Any],
    neighbours: Sequence[dict[str, Any]] = (),
    concurrent_runs: Sequence[str] = (),
    neighbour_halves: Sequence[dict[str, Any]] = (),
) -> LoadFacts:
    """LoadFacts from the measured phase's resource readings (oldest first)."""

    def mean(rows: Sequence[Any], name: str) -> float | None:
        values = [v for v in (getattr(r, name) for r in rows) if v is not None]
        return sum(values) / len(values) if values else None

    half = len(measured) // 2
    first, second = measured[:half], measured[half:]
    return LoadFacts(
        optlab_cpu_pct=mean(measured, "cpu_process_pct"),
        service_cpu_pct=mean(measured, "service_cpu_pct"),
        system_cpu_pct=mean(measured, "cpu_system_pct"),
        steal_pct=(mean(first, "steal_pct"), mean(second, "steal_pct")) if half else (None, None),
        other_cpu_pct=(
            (mean(first, "other_cpu_pct"), mean(second, "other_cpu_pct")) if half else (None, None)
        ),
        neighbours=tuple(neighbours),
        neighbour_halves=tuple(neighbour_halves),
        concurrent_runs=tuple(concurrent_runs),
    )


# A sweep's level stops early when the backlog keeps growing: measuring the rest of it would
# only confirm that the target cannot sustain the rate.
SATURATION_WATCH_S = 3  # seconds of in-flight counts, one per second, that must all rise
SATURATION_RISE_S = 0.5  # ... by at least this many seconds' worth of arrivals in all


def plainly_saturated(in_flight: Sequence[int], rate: float, limit: int | None) -> str | None:
    """Why an open-loop level is plainly saturated, from its in-flight count once a second
    (oldest first); None when it is not (yet).

    Plainly: over the last `SATURATION_WATCH_S` seconds the count rose every second, by at
    least half a second of arrivals and `BACKLOG_GROWTH_MIN` requests in all (completions
    run below about 85% of the rate); or it stayed at the in-flight limit, where the
    generator cannot send more and requests wait to leave.
    """
    if len(in_flight) < SATURATION_WATCH_S + 1 or rate <= 0:
        return None
    recent = list(in_flight[-(SATURATION_WATCH_S + 1) :])
    if limit is not None and all(count >= limit for count in recent):
        return (
            f"saturated: {limit} requests in flight (the limit) for {SATURATION_WATCH_S} s; "
            "the target cannot sustain this rate"
        )
    rising = all(later > earlier for earlier, later in zip(recent, recent[1:], strict=False))
    rise = recent[-1] - recent[0]
    if rising and rise >= max(BACKLOG_GROWTH_MIN, SATURATION_RISE_S * rate):
        return (
            f"saturated: the backlog in flight rose every second, {recent[0]} -> {recent[-1]} "
            f"in {SATURATION_WATCH_S} s at {rate:,.1f}/s; the target cannot sustain this rate"
        )
    return None
