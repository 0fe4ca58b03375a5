"""What the validity rules judge: the facts of one run, the machine meanwhile, and the verdict.

Plain numbers the runner has already computed, so the rules (`optlab.run.validity`,
`optlab.run.pace`) are tested directly against hand-made cases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from optlab.store.reasons import Reason, ReasonCode, reasons_of

__all__ = ["HostFacts", "LoadFacts", "RunFacts", "Verdict", "mean_of"]


@dataclass(frozen=True)
class Verdict:
    valid: bool
    reasons: tuple[str, ...]  # why it is INVALID; empty when valid
    notes: tuple[str, ...]  # what to know without invalidating it
    codes: tuple[ReasonCode, ...] = ()  # each reason's code, in the same order

    @classmethod
    def of(cls, reasons: Sequence[Reason], notes: Sequence[str]) -> Verdict:
        return cls(
            not reasons,
            tuple(r.text for r in reasons),
            tuple(notes),
            tuple(r.code for r in reasons),
        )

    @property
    def coded(self) -> tuple[Reason, ...]:
        """The reasons with their codes."""
        return reasons_of(self.reasons, self.codes)

    def reason(self, *codes: ReasonCode) -> Reason | None:
        """The first reason with one of these codes; None when there is none."""
        return next((r for r in self.coded if r.code in codes), None)


@dataclass(frozen=True)
class LoadFacts:
    """The machine during the measured phase, as means over its resource samples: CPU of
    optlab's process (percent of one core), of the service it started, of the machine (all
    cores, 0..100); CPU stolen by the hypervisor and used by processes outside the run, per
    half; the processes that used the most, and those whose use changed the most between the
    halves; other optlab runs on this host meanwhile."""

    optlab_cpu_pct: float | None = None
    service_cpu_pct: float | None = None
    system_cpu_pct: float | None = None
    steal_pct: tuple[float | None, float | None] = (None, None)
    other_cpu_pct: tuple[float | None, float | None] = (None, None)
    neighbours: tuple[dict[str, Any], ...] = ()
    # name, pid, first_pct, second_pct (ResourceSampler.neighbour_halves); () when unknown.
    neighbour_halves: tuple[dict[str, Any], ...] = ()
    concurrent_runs: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostFacts:
    """One node of a load sent from several hosts (docs/hosts.md), over the measured phase:
    its share of the schedule, what it sent, its own send lag (and that P99's lower 99%
    bound), and whether it was lost."""

    node: str
    host: str
    share: float
    completed: int
    errors: int
    send_lag_p99_ms: float | None
    send_lag_p99_low_ms: float | None
    lost: str | None = None
    lost_at_s: float | None = None
    node_cpu_pct: float | None = None  # its CPUs while it sent (all cores, 0..100)
    steal_pct: float | None = None
    neighbours: tuple[dict[str, Any], ...] = ()  # its busiest other processes meanwhile


@dataclass(frozen=True)
class RunFacts:
    requested_s: float
    measured_s: float
    completed: int
    errors: int
    max_error_rate: float
    send_lag_p99_ms: float | None
    # Below this the send lag is never a reason (it is judged against the latency above it).
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
    # The measured phase's QPS second by second: the halves are judged against its noise.
    window_qps: tuple[float, ...] = ()
    # protocol.stability_pct was given: the halves may differ by that much, noise or not.
    stability_fixed: bool = False
    # The latency the send lag is judged against: the run's P99, and the SLO's bound (the
    # config's, or a sweep's) when there is one; the lower confidence bound of the send-lag
    # P99, from the number of sends.
    total_p99_ms: float | None = None
    slo_ms: float | None = None
    send_lag_p99_low_ms: float | None = None
    # Closed loop, who set the pace: the mean and longest latency of the successes, and the
    # timeout that bounds how long a failed request held its client.
    total_mean_ms: float | None = None
    total_max_ms: float | None = None
    timeout_ms: float | None = None
    # Load sent from several hosts: each node, judged alone as well as in the merge.
    hosts: tuple[HostFacts, ...] = ()


def mean_of(halves: tuple[float | None, float | None]) -> float | None:
    values = [v for v in halves if v is not None]
    return sum(values) / len(values) if values else None
