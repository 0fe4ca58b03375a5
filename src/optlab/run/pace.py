"""Who set the pace of a run: the target (saturated, open loop), or the load generator (it
fell behind its schedule, or its closed-loop clients were held up between calls).

In the open loop the latency is measured from the INTENDED send time, so the generator's lag is
inside it: a few ms of lag against a 100 ms SLO or a 20 ms P99 changes no conclusion and is a
note. It sets the pace only when it is most of the latency judged, or a good share of it while
the generator also held requests back past the time between sends (docs/run-json.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from optlab.run.facts import HostFacts, RunFacts, mean_of
from optlab.store.reasons import Reason

__all__ = [
    "BACKLOG_GROWTH_MIN",
    "CPU_BOUND_PCT",
    "GIL_BUSY_PCT",
    "LITTLE_TOLERANCE",
    "SATURATION_SHORTFALL",
    "SATURATION_SIGMAS",
    "SendLag",
    "clients_in_system",
    "fell_short",
    "generator_bound",
    "held_back",
    "host_reasons",
    "littles_law",
    "saturated",
    "saturated_by",
    "saturation",
    "send_lag_judged",
    "send_lag_quantile",
    "starved",
]

# Open loop, the one saturation rule (the verdict's, the sweep's, diagnose's): completions
# more than 5% below the rate asked for, and by more than the arrivals' own noise (3 sigma of
# a Poisson count), while the backlog grew by at least 8 (or reached the in-flight limit).
SATURATION_SHORTFALL = 0.05
SATURATION_SIGMAS = 3.0
BACKLOG_GROWTH_MIN = 8
GIL_BUSY_PCT = 80.0  # optlab's process this busy (% of one core): its threads contend
CPU_BOUND_PCT = 90.0  # a process this busy (% of one core), or the machine (all cores)


def fell_short(offered_qps: float, completed_qps: float | None, measured_s: float) -> bool:
    """Completions short of the offered rate by more than 5%, and by more than Poisson
    arrivals' own noise (3 sigma of the count): a short run at a low rate is not called short
    for a few requests the schedule happened not to send. Nothing completed: short."""
    if completed_qps is None:
        return True
    expected = offered_qps * measured_s
    missing = expected - completed_qps * measured_s
    return completed_qps < (1 - SATURATION_SHORTFALL) * offered_qps and (
        missing > SATURATION_SIGMAS * math.sqrt(max(expected, 1.0))
    )


def saturated_by(
    offered_qps: float,
    completed_qps: float | None,
    measured_s: float,
    *,
    backlog_grew: bool | None,
    limit_reached: bool | None,
) -> bool:
    """The target could not sustain the offered rate: completions fell short of it while
    requests piled up in flight (or reached the in-flight limit). Where neither is known (a
    level read from its figures alone), falling short says it."""
    if not fell_short(offered_qps, completed_qps, measured_s):
        return False
    if backlog_grew is None and limit_reached is None:
        return True
    return bool(backlog_grew) or bool(limit_reached)


def saturated(facts: RunFacts) -> bool:
    """The verdict's question: `saturated_by` on the run's facts (an in-flight count the run
    did not record neither grew nor reached the limit)."""
    if not facts.open_loop or not facts.intended_qps or facts.completed_qps is None:
        return False
    start, end, peak = facts.in_flight_start, facts.in_flight_end, facts.in_flight_max
    growing = start is not None and end is not None and end - start >= BACKLOG_GROWTH_MIN
    full = peak is not None and facts.in_flight_limit is not None and peak >= facts.in_flight_limit
    return saturated_by(
        facts.intended_qps,
        facts.completed_qps,
        facts.measured_s,
        backlog_grew=growing,
        limit_reached=full,
    )


def saturation(facts: RunFacts) -> Reason:
    limit = f" (limit {facts.in_flight_limit})" if facts.in_flight_limit else ""
    return Reason(
        code="saturated",
        text=f"the target is saturated: offered {facts.intended_qps:.1f}/s, completed "
        f"{facts.completed_qps:.1f}/s, backlog {facts.in_flight_end} in flight at the end"
        f"{limit}; the target cannot sustain this rate (not the load generator's doing): "
        "lower workload.load.rate to measure latency under a load it sustains",
    )


# The send lag is inside the latency (measured from the intended send time): it sets the pace
# when it is most of the latency judged, or a good share of it while the generator also held
# requests back past the time between sends (the schedule was not kept).
LAG_DOMINANT_SHARE = 0.5
LAG_LATENCY_SHARE = 0.25
LAG_GAP_SHARE = 0.5
# The send-lag P99 is judged by its lower 99% confidence bound: with few sends the P99 rests
# on a handful of them (one GC pause), and a run is not voided on that alone.
LAG_BOUND_Z = 2.326
LAG_BOUND_SHOWN = 0.9  # the bound is named when it is this far under the P99


@dataclass(frozen=True)
class SendLag:
    """The open loop's send lag against what it is judged by."""

    lag_ms: float  # send-lag P99
    low_ms: float  # its lower confidence bound
    scale_ms: float | None  # the latency judged: max(the run's P99, the SLO's bound)
    slo: bool  # the scale is the SLO's bound
    gap_ms: float | None  # the mean time between sends (1 / rate)
    bound: bool  # the load generator set the pace

    def describe(self) -> str:
        parts = []
        if self.scale_ms:
            what = "the SLO's" if self.slo else "the P99 measured,"
            parts.append(f"{self.lag_ms / self.scale_ms:.0%} of {what} {self.scale_ms:.1f} ms")
        if self.gap_ms:
            times = self.lag_ms / self.gap_ms
            parts.append(f"{times:.2g}x the mean {self.gap_ms:.2f} ms between sends")
        if self.low_ms < self.lag_ms * LAG_BOUND_SHOWN:
            parts.append(f"judged by its lower 99% bound, {self.low_ms:.2f} ms")
        return ", ".join(parts) if parts else "no latency to judge it by"


def send_lag_quantile(sends: int) -> float:
    """The percentile (0..100) whose value is a lower 99% confidence bound of the P99, from
    `sends` samples (the binomial's normal approximation)."""
    if sends <= 0:
        return 99.0
    return max(0.0, 99.0 - 100 * LAG_BOUND_Z * math.sqrt(0.99 * 0.01 / sends))


def send_lag_judged(facts: RunFacts) -> SendLag | None:
    """The open loop's send lag and whether it set the pace; None when it is under the floor
    (`max_send_lag_p99_ms`) or not an open loop."""
    lag = facts.send_lag_p99_ms
    if not facts.open_loop or lag is None or lag <= facts.max_send_lag_p99_ms:
        return None
    low = lag if facts.send_lag_p99_low_ms is None else min(lag, facts.send_lag_p99_low_ms)
    slo = facts.slo_ms is not None and facts.slo_ms > (facts.total_p99_ms or 0)
    scale = facts.slo_ms if slo else facts.total_p99_ms
    rate = facts.intended_qps or facts.completed_qps
    gap = 1000 / rate if rate else None
    if low <= facts.max_send_lag_p99_ms:
        bound = False
    elif not scale:
        bound = True  # nothing to weigh it against
    else:
        share = low / scale
        held = gap is not None and low > LAG_GAP_SHARE * gap
        bound = share > LAG_DOMINANT_SHARE or (share > LAG_LATENCY_SHARE and held)
    return SendLag(lag, low, scale, slo, gap, bound)


def generator_bound(facts: RunFacts, lag: SendLag) -> Reason:
    text = (
        f"the load generator fell behind its schedule (send-lag P99 {lag.lag_ms:.2f} ms: "
        f"{lag.describe()})"
    )
    if facts.in_flight_max is not None and facts.in_flight_limit:
        text += (
            f" while the target kept up (at most {facts.in_flight_max} of "
            f"{facts.in_flight_limit} in flight)"
        )
    cause = _generator_cause(
        facts,
        "lower the rate, or spread the load over workload.load.processes (network targets)",
        "with a closed loop (`optlab sweep --mode closed`)",
        "the load generator was the bottleneck; lower the rate or raise max_in_flight",
    )
    return Reason(code="generator-behind", text=text + cause)


# Mean in flight against achieved rate x mean latency: short by more than this (and by more
# than the samples' own noise), the latency was not measured where the requests were.
LITTLE_TOLERANCE = 0.05
# One-sided false-alarm rate of the Little's-law test on an honest level: 3 sigma's.
LITTLE_ALPHA = 0.00135


def littles_law(
    in_flight: Sequence[float], qps: float | None, mean_ms: float | None
) -> tuple[float, float, float] | None:
    """(relative gap, its standard error, the one-sided critical ratio) between the mean of
    the in-flight samples and achieved rate x mean latency (Little's law, L = lambda W); None
    without samples.

    In the open loop latency is counted from the INTENDED send time, and in flight from the
    actual send: when the generator holds requests back (no worker free, the GIL), L falls
    short of lambda W. The samples are each second's last in-flight count: a handful of small
    integers, often all 0 at a low rate, so their own spread says little about their noise.
    Under Little's law each is a draw of the number in the system, whose variance is at least
    about its mean (Poisson: exactly so for a queue with a server per request, more for one
    that queues), and one second apart they are close to independent while a request takes
    well under a second. So the standard error is the larger of the samples' own and that
    Poisson floor, and the gap is judged against Student's t for the samples' count: an honest
    level fires at about LITTLE_ALPHA, not at the 3-7% a 3-sigma rule on the bare sample
    spread gave on simulated M/M/c levels.
    """
    import numpy as np

    samples = np.asarray(in_flight, dtype=float)
    n = len(samples)
    if n < 3 or not qps or mean_ms is None or mean_ms <= 0:
        return None
    expected = qps * mean_ms / 1000
    if expected <= 0:
        return None
    gap = (float(samples.mean()) - expected) / expected
    variance = max(float(samples.var(ddof=1)), expected)
    se = math.sqrt(variance / n) / expected
    from scipy import stats  # type: ignore[import-untyped]  # no stubs; only when judged

    return gap, se, float(stats.t.ppf(1 - LITTLE_ALPHA, n - 1))


def held_back(gap: tuple[float, float, float] | None) -> bool:
    """Little's law short beyond its tolerance and its noise: requests were held back."""
    if gap is None:
        return False
    relative, se, critical = gap
    return relative < -LITTLE_TOLERANCE and -relative > critical * se


def host_reasons(facts: RunFacts, host: HostFacts) -> list[Reason]:
    """What voids a run for one node of a load sent from several hosts: the node was lost, or
    it fell behind its own share of the schedule (its send lag judged as a run's is, against
    the run's latency and the gap between ITS sends), whatever the merge says."""
    reasons = []
    where = f"{host.node} ({host.host})"
    if host.lost is not None:
        at = f" {host.lost_at_s:.1f} s into the load" if host.lost_at_s is not None else ""
        reasons.append(
            Reason(
                code="node-lost",
                text=f"{where} was lost{at} ({host.lost}); the run keeps what it sent before",
            )
        )
    measured = max(facts.measured_s, 1e-9)
    alone = dataclasses.replace(
        facts,
        send_lag_p99_ms=host.send_lag_p99_ms,
        send_lag_p99_low_ms=host.send_lag_p99_low_ms,
        intended_qps=facts.intended_qps * host.share if facts.intended_qps else None,
        completed_qps=(host.completed + host.errors) / measured,
    )
    lag = send_lag_judged(alone)
    share_qps = alone.intended_qps
    cause = _node_cause(host)
    if (
        host.lost is None
        and share_qps is not None
        and not saturated(facts)
        and fell_short(share_qps, alone.completed_qps, facts.measured_s)
    ):
        # Its share of the schedule was not sent, while the target kept up with the rest.
        reasons.append(
            Reason(
                code="node-behind",
                text=f"{where} sent {(host.completed + host.errors) / measured:.1f} requests/s "
                f"of the {share_qps:.1f}/s its share of the schedule asked for, while the "
                f"target kept up: it fell behind its schedule{cause}; give its workers more "
                "CPU (hosts.cpus_per_worker, a quieter node) or more nodes",
            )
        )
    elif lag is not None and lag.bound:
        reasons.append(
            Reason(
                code="node-behind",
                text=f"{where} fell behind its schedule (send-lag P99 {lag.lag_ms:.1f} ms: "
                f"{lag.describe()}){cause}: the load it sent was not the load asked for; give "
                "its workers more CPU (hosts.cpus_per_worker, a quieter node) or more nodes",
            )
        )
    return reasons


def _node_cause(host: HostFacts) -> str:
    """What the node's own CPUs said while it sent, for a reason that blames it."""
    if host.node_cpu_pct is None:
        return ""
    text = f" while its CPUs were {host.node_cpu_pct:.0f}% busy"
    if host.steal_pct is not None and host.steal_pct >= 1:
        text += f" ({host.steal_pct:.0f}% stolen by the hypervisor)"
    if host.neighbours:
        top = host.neighbours[0]
        text += (
            f", the busiest other process {top['name']} (pid {top['pid']}) at {top['cpu_pct']:.0f}%"
        )
    return text


# Closed loop: the clients are held up between calls when, on average, this share of them is
# outside the target (Little's law: achieved rate x mean latency is the mean number inside).
STARVED_SHARE = 0.25
# ... and at least one whole client is missing: one client that waits between calls still
# shows the target its requests one at a time, as configured.
STARVED_CLIENTS = 1.0
# The clients' own work per request (recording it, taking the next) costs ~3-5 us in the
# threaded loop (benchmarks/harness_overhead.py). Time outside the calls well beyond that
# was taken from the clients (the GIL, busy CPUs); within it, the target is simply faster
# than the harness: its latency stands, its QPS is the harness's ceiling (a note).
HARNESS_GAP_US = 50.0


def clients_in_system(facts: RunFacts) -> tuple[float, float] | None:
    """Closed loop: the mean number of clients inside a call over the measured phase, and an
    upper bound on it; None when it cannot be told.

    Little's law over every success (rate x mean latency), where the latency runs from the
    actual send to the return. The bound also counts each failed request as holding its
    client for the whole timeout, and every client as busy for the longest latency at each
    end of the phase (a request cut by its start or end), so a run is judged starved only
    when even that falls short.
    """
    mean, n = facts.total_mean_ms, facts.clients
    if facts.open_loop or not n or mean is None or facts.measured_s <= 0:
        return None
    if facts.errors and facts.timeout_ms is None:
        return None
    span_ms = facts.measured_s * 1000
    busy_ms = facts.completed * mean
    slack_ms = facts.errors * (facts.timeout_ms or 0.0) + n * (facts.total_max_ms or mean)
    return busy_ms / span_ms, (busy_ms + slack_ms) / span_ms


def starved(facts: RunFacts) -> Reason | str | None:
    """Closed loop: what to say when the clients were outside the target much of the time (a
    reason, `clients-held-up`, or a note when the harness's own work explains it); None when
    they kept it busy."""
    found = clients_in_system(facts)
    if found is None or facts.clients is None:
        return None
    inside, most = found
    n = facts.clients
    if most >= (1 - STARVED_SHARE) * n or n - most < STARVED_CLIENTS:
        return None
    answered_qps = (facts.completed + facts.errors) / facts.measured_s
    gap_us = (n - inside) / answered_qps * 1e6 if answered_qps > 0 else math.inf
    clients = f"{n} client{'s' if n != 1 else ''}"
    little = (
        f"of {clients} only {inside:.1f} were inside a call on average (at most {most:.1f}; "
        f"Little's law: {facts.completed / facts.measured_s:,.1f}/s x mean latency "
        f"{facts.total_mean_ms:.3g} ms)"
    )
    if gap_us < HARNESS_GAP_US:
        return (
            f"{little}: the target answers faster than the clients' own work per request "
            f"({gap_us:.1f} us between calls), so the QPS is the load generator's ceiling, "
            "not the target's; its latency stands"
        )
    cause = _generator_cause(
        facts,
        "use fewer clients, or spread them over workload.load.processes (network targets)",
        "with fewer clients",
        "the clients were held up between calls; use fewer clients, or measure the target "
        "over HTTP",
    )
    return Reason(
        code="clients-held-up",
        text=f"the load generator fell behind: {little}, {gap_us / 1000:.3g} ms between calls "
        "per request: the target was measured under a lower concurrency than configured, "
        "paced by the clients" + cause,
    )


def _generator_cause(facts: RunFacts, busy_fix: str, in_process_fix: str, otherwise: str) -> str:
    """Why the load generator could not keep up, from what used the machine meanwhile."""
    load = facts.load
    if load.optlab_cpu_pct is not None and load.optlab_cpu_pct >= CPU_BOUND_PCT:
        return f": optlab's own process used {load.optlab_cpu_pct:.0f}% of a core; {busy_fix}"
    if load.system_cpu_pct is not None and load.system_cpu_pct >= CPU_BOUND_PCT:
        parts = [f"{load.system_cpu_pct:.0f}% of all cores busy"]
        if load.service_cpu_pct is not None:
            parts.append(f"the service {load.service_cpu_pct:.0f}% of a core")
        other = mean_of(load.other_cpu_pct)
        if other is not None:
            parts.append(f"other processes {other:.0f}% of a core")
        return (
            f": the machine's CPUs were busy ({', '.join(parts)}), so the generator could not "
            "run on time; give the load generator a core of its own (another machine, or "
            "fewer busy processes)"
        )
    if facts.in_process:
        # In-process, the generator's threads wait on the same GIL and cores as the target's
        # calls: a call that holds the GIL in C code delays every send behind it.
        return (
            ": the target runs inside optlab's process, and its calls held the GIL or the "
            "cores the generator needed; measure it over HTTP (a command or http target, e.g. "
            f"`optlab serve`), or {in_process_fix}"
        )
    return ": " + otherwise
