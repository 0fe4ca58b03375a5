"""The validity verdict (MLPerf LoadGen's VALID/INVALID with reasons) and the warmup rule.

Pure functions over numbers the runner has already computed, so they are tested
directly against hand-made cases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

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


def verdict(facts: RunFacts) -> Verdict:
    reasons: list[str] = []
    notes: list[str] = []
    if facts.interrupted:
        reasons.append(f"interrupted after {facts.measured_s:.1f} s of {facts.requested_s:g} s")
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
    if facts.send_lag_p99_ms is not None and facts.send_lag_p99_ms > facts.max_send_lag_p99_ms:
        reasons.append(
            f"the load generator fell behind its schedule (send-lag P99 "
            f"{facts.send_lag_p99_ms:.2f} ms > {facts.max_send_lag_p99_ms:g} ms): the load "
            "generator, not the target, was the bottleneck; lower the rate or raise max_in_flight"
        )
    if (
        facts.start_lag_p99_ms is not None
        and facts.total_p50_ms
        and facts.start_lag_p99_ms > max(1.0, 0.1 * facts.total_p50_ms)
    ):
        notes.append(
            f"start-lag P99 {facts.start_lag_p99_ms:.2f} ms: the harness's threads waited to "
            "enter the target (GIL contention with a CPU-bound target); that time is the "
            "harness's, not the target's"
        )
    first, second = facts.first_half_qps, facts.second_half_qps
    if first is None or second is None:
        notes.append("too short to compare the first and second half: stability not judged")
    elif first and second:
        drift = abs(second - first) / max(first, second)
        if drift > facts.stability_tolerance:
            reasons.append(
                f"unstable: QPS {first:.1f} in the first half vs {second:.1f} in the second "
                f"({drift:.0%} apart, limit {facts.stability_tolerance:.0%})"
            )
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
    if not facts.open_loop:
        notes.append("closed loop: latency is measured from the actual send (no CO correction)")
    return Verdict(not reasons, tuple(reasons), tuple(notes))


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
