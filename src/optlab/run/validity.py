"""The validity verdict (MLPerf LoadGen's VALID/INVALID with reasons) and the warmup rule.

Pure functions over numbers the runner has already computed, so they are tested
directly against hand-made cases.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# MLPerf's early-stopping bound at 0.99 confidence: the fewest queries that support a percentile.
P99_MIN_QUERIES = 662
P999_MIN_QUERIES = 6_636
DURATION_SLACK = 0.99  # a run stopped by its own timer may end a few ms short


@dataclass(frozen=True)
class Verdict:
    valid: bool
    reasons: tuple[str, ...]  # why it is INVALID; empty when valid
    notes: tuple[str, ...]  # what to know without invalidating it


@dataclass(frozen=True)
class LoadFacts:
    """The machine during the measured phase, as means over its resource samples: CPU of
    optlab's process (percent of one core), of the service it started, of the machine (all
    cores, 0..100); CPU stolen by the hypervisor and used by processes outside the run, per
    half; the processes that used the most; other optlab runs on this host meanwhile."""

    optlab_cpu_pct: float | None = None
    service_cpu_pct: float | None = None
    system_cpu_pct: float | None = None
    steal_pct: tuple[float | None, float | None] = (None, None)
    other_cpu_pct: tuple[float | None, float | None] = (None, None)
    neighbours: tuple[dict[str, Any], ...] = ()
    concurrent_runs: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunFacts:
    requested_s: float
    measured_s: float
    completed: int
    errors: int
    max_error_rate: float
    send_lag_p99_ms: float | None
    max_send_lag_p99_ms: float
    start_lag_p99_ms: float | None
    total_p50_ms: float | None
    first_half_qps: float | None
    second_half_qps: float | None
    stability_tolerance: float
    throttled: bool
    interrupted: bool
    open_loop: bool
    # Held-out top-1 points lost against the fp32 reference model, for targets that report it.
    accuracy_drop_pts: float | None = None
    max_accuracy_drop_pts: float | None = None
    # Closed loop: clients still inside a call after the drain, of how many.
    stuck_clients: int = 0
    clients: int | None = None
    # Who set the pace (open loop): the rate asked for, what completed (errors included),
    # and the requests in flight at the start, at the end and at most, against the limit.
    intended_qps: float | None = None
    completed_qps: float | None = None
    in_flight_start: int | None = None
    in_flight_end: int | None = None
    in_flight_max: int | None = None
    in_flight_limit: int | None = None
    # The target runs inside optlab's process (builtin, python): only then can its threads
    # and the load generator's contend for the GIL.
    in_process: bool = True
    load: LoadFacts = field(default_factory=lambda: LoadFacts())
    # The measurement was ended before its time because the target was plainly saturated
    # (`plainly_saturated`): why.
    stopped_early: str | None = None


def verdict(facts: RunFacts) -> Verdict:
    """VALID unless a rule below finds a reason; notes say what to know either way. The
    reasons and notes come in this order: coverage, pace, stability, integrity, the machine."""
    reasons: list[str] = []
    notes: list[str] = []
    _coverage(facts, reasons, notes)
    _pace(facts, reasons, notes)
    _stability(facts, reasons, notes)
    _integrity(facts, reasons)
    if not facts.open_loop:
        notes.append("closed loop: latency is measured from the actual send (no CO correction)")
    notes += _neighbour_notes(facts.load)
    return Verdict(not reasons, tuple(reasons), tuple(notes))


def _coverage(facts: RunFacts, reasons: list[str], notes: list[str]) -> None:
    """Measured long enough, with enough answers, and few enough errors."""
    if facts.interrupted:
        reasons.append(f"interrupted after {facts.measured_s:.1f} s of {facts.requested_s:g} s")
    elif facts.stopped_early is not None:
        reasons.append(
            f"stopped after {facts.measured_s:.1f} s of {facts.requested_s:g} s: "
            f"{facts.stopped_early}"
        )
    elif facts.measured_s < facts.requested_s * DURATION_SLACK:
        reasons.append(f"measured {facts.measured_s:.1f} s, shorter than {facts.requested_s:g} s")
    if facts.completed < P99_MIN_QUERIES:
        reasons.append(
            f"{facts.completed} successful queries: P99 needs at least {P99_MIN_QUERIES} "
            "(MLPerf's bound at 0.99 confidence); measure longer or at a higher rate"
        )
    elif facts.completed < P999_MIN_QUERIES:
        notes.append(
            f"P99.9 is not supported by {facts.completed} queries (needs {P999_MIN_QUERIES})"
        )
    total = facts.completed + facts.errors
    if total and facts.errors / total > facts.max_error_rate:
        reasons.append(
            f"error rate {facts.errors / total:.2%} is over the limit {facts.max_error_rate:.2%}"
        )


def _pace(facts: RunFacts, reasons: list[str], notes: list[str]) -> None:
    """Who set the pace: the target (saturated), the load generator, or the harness's threads."""
    if saturated(facts):
        reasons.append(_saturation(facts))
    elif facts.send_lag_p99_ms is not None and facts.send_lag_p99_ms > facts.max_send_lag_p99_ms:
        reasons.append(_generator_bound(facts))
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


def _stability(facts: RunFacts, reasons: list[str], notes: list[str]) -> None:
    """The first and second half of the measured phase agree on QPS."""
    first, second = facts.first_half_qps, facts.second_half_qps
    if first is None or second is None:
        notes.append("too short to compare the first and second half: stability not judged")
    elif first and second:
        drift = abs(second - first) / max(first, second)
        if drift > facts.stability_tolerance and _beyond_arrival_noise(facts, first, second):
            reasons.append(
                f"unstable: QPS {first:.1f} in the first half vs {second:.1f} in the second "
                f"({drift:.0%} apart, limit {facts.stability_tolerance:.0%})"
                + _taken_away(facts.load)
                + "; measure with --paired or --repeats, or longer, or set "
                "protocol.stability_pct in a new baseline for a noisy machine"
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


def _integrity(facts: RunFacts, reasons: list[str]) -> None:
    """The load measured was the one configured, on a machine that ran at full speed, by a
    model that kept its accuracy."""
    if facts.stuck_clients and facts.clients:
        # A client that never came back sent nothing for the rest of the run: the load was
        # lower than the configured concurrency, and the run measured something else.
        reasons.append(
            f"{facts.stuck_clients} of {facts.clients} clients were stuck in a call when the "
            "measurement ended (still in flight after the drain): the concurrency measured "
            "was not the configured one; see the timeouts, and fix the target or its timeout"
        )
    if facts.throttled:
        reasons.append("thermal throttling was seen on a GPU during the measurement")
    drop, limit = facts.accuracy_drop_pts, facts.max_accuracy_drop_pts
    if drop is not None and limit is not None and drop > limit:
        # MLPerf's rule: a result that loses accuracy beyond the allowance does not count,
        # however fast it was.
        reasons.append(
            f"accuracy: held-out top-1 is {drop:.2f} points below the fp32 reference model's "
            f"(limit {limit:g} points, slo.max_accuracy_drop_pts)"
        )


# Open loop: completions this far below the rate asked for, with the backlog growing (or the
# in-flight limit reached), and the target could not keep up.
SATURATION_SHORTFALL = 0.05
BACKLOG_GROWTH_MIN = 8
ARRIVAL_NOISE_SIGMAS = 3.0
GIL_BUSY_PCT = 80.0  # optlab's process this busy (% of one core): its threads contend
CPU_BOUND_PCT = 90.0  # a process this busy (% of one core), or the machine (all cores)
NEIGHBOUR_NOTE_PCT = 25.0  # another process this busy (% of one core) is worth a note
STEAL_NOTE_PCT = 5.0


def saturated(facts: RunFacts) -> bool:
    """The target could not sustain the offered rate: completions fall short of it while
    requests pile up in flight (or reach the in-flight limit)."""
    if not facts.open_loop or not facts.intended_qps or facts.completed_qps is None:
        return False
    if facts.completed_qps >= (1 - SATURATION_SHORTFALL) * facts.intended_qps:
        return False
    start, end, peak = facts.in_flight_start, facts.in_flight_end, facts.in_flight_max
    growing = start is not None and end is not None and end - start >= BACKLOG_GROWTH_MIN
    full = (
        peak is not None and facts.in_flight_limit is not None and (peak >= facts.in_flight_limit)
    )
    return growing or full


def _saturation(facts: RunFacts) -> str:
    limit = f" (limit {facts.in_flight_limit})" if facts.in_flight_limit else ""
    return (
        f"the target is saturated: offered {facts.intended_qps:.1f}/s, completed "
        f"{facts.completed_qps:.1f}/s, backlog {facts.in_flight_end} in flight at the end"
        f"{limit}; the target cannot sustain this rate (not the load generator's doing): "
        "lower workload.load.rate to measure latency under a load it sustains"
    )


def _generator_bound(facts: RunFacts) -> str:
    lag = facts.send_lag_p99_ms or 0.0
    text = (
        f"the load generator fell behind its schedule (send-lag P99 {lag:.2f} ms > "
        f"{facts.max_send_lag_p99_ms:g} ms)"
    )
    if facts.in_flight_max is not None and facts.in_flight_limit:
        text += (
            f" while the target kept up (at most {facts.in_flight_max} of "
            f"{facts.in_flight_limit} in flight)"
        )
    load = facts.load
    if load.optlab_cpu_pct is not None and load.optlab_cpu_pct >= CPU_BOUND_PCT:
        return text + (
            f": optlab's own process used {load.optlab_cpu_pct:.0f}% of a core; lower the "
            "rate, or spread the load over workload.load.processes (network targets)"
        )
    if load.system_cpu_pct is not None and load.system_cpu_pct >= CPU_BOUND_PCT:
        parts = [f"{load.system_cpu_pct:.0f}% of all cores busy"]
        if load.service_cpu_pct is not None:
            parts.append(f"the service {load.service_cpu_pct:.0f}% of a core")
        other = _mean_of(load.other_cpu_pct)
        if other is not None:
            parts.append(f"other processes {other:.0f}% of a core")
        return text + (
            f": the machine's CPUs were busy ({', '.join(parts)}), so the generator could not "
            "run on time; give the load generator a core of its own (another machine, or "
            "fewer busy processes)"
        )
    if facts.in_process:
        # In-process, the generator's threads wait on the same GIL and cores as the target's
        # calls: a call that holds the GIL in C code delays every send behind it.
        return text + (
            ": the target runs inside optlab's process, and its calls held the GIL or the "
            "cores the generator needed to send on time; measure it over HTTP (a command or "
            "http target, e.g. `optlab serve`), or with a closed loop (`optlab sweep --mode "
            "closed`)"
        )
    return text + ": the load generator was the bottleneck; lower the rate or raise max_in_flight"


def _mean_of(halves: tuple[float | None, float | None]) -> float | None:
    values = [v for v in halves if v is not None]
    return sum(values) / len(values) if values else None


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
        names = ", ".join(_neighbour(n) for n in load.neighbours)
        parts.append(
            f"other processes used {max(first, second):.0f}% of a core in the {worse} half "
            f"({min(first, second):.0f}% in the other)" + (f": {names}" if names else "")
        )
    return "; " + "; ".join(parts) if parts else ""


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
    steal = _mean_of(load.steal_pct)
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
