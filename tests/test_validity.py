"""The validity verdict, the warmup stability rule, and protocol resolution: pure functions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from optlab.config.models import Protocol
from optlab.config.protocol import effective_protocol
from optlab.errors import ConfigError
from optlab.run.validity import (
    LoadFacts,
    RunFacts,
    halves,
    is_stable,
    machine_facts,
    plainly_saturated,
    verdict,
)

GOOD = RunFacts(
    requested_s=600,
    measured_s=600.2,
    completed=120_000,
    errors=10,
    max_error_rate=0.001,
    send_lag_p99_ms=0.3,
    max_send_lag_p99_ms=2.0,
    start_lag_p99_ms=0.1,
    total_p50_ms=4.0,
    first_half_qps=200.0,
    second_half_qps=199.0,
    stability_tolerance=0.10,
    throttled=False,
    interrupted=False,
    open_loop=True,
)


def test_a_good_run_is_valid() -> None:
    judged = verdict(GOOD)
    assert judged.valid and judged.reasons == () and judged.notes == ()


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"measured_s": 300.0}, "shorter than 600 s"),
        ({"interrupted": True, "measured_s": 12.0}, "interrupted after 12.0 s"),
        ({"completed": 661}, "P99 needs at least 662"),
        ({"errors": 200}, "error rate 0.17% is over the limit 0.10%"),
        ({"send_lag_p99_ms": 7.5, "in_process": False}, "the load generator was the bottleneck"),
        ({"send_lag_p99_ms": 7.5}, "the target runs inside optlab's process, and its calls held"),
        ({"second_half_qps": 150.0}, "unstable: QPS 200.0 in the first half vs 150.0"),
        ({"throttled": True}, "thermal throttling"),
    ],
)
def test_each_reason_invalidates(change: dict[str, object], expected: str) -> None:
    judged = verdict(replace(GOOD, **change))  # type: ignore[arg-type]
    assert not judged.valid
    assert any(expected in reason for reason in judged.reasons), judged.reasons


def test_p999_and_harness_notes_do_not_invalidate() -> None:
    judged = verdict(replace(GOOD, completed=5_000, errors=0, start_lag_p99_ms=3.0))
    assert judged.valid
    assert any("P99.9 is not supported by 5000 queries" in n for n in judged.notes)
    assert any("start-lag P99 3.00 ms" in n for n in judged.notes)
    closed = verdict(replace(GOOD, open_loop=False, send_lag_p99_ms=None))
    assert closed.valid and any("closed loop" in n for n in closed.notes)
    short = verdict(replace(GOOD, first_half_qps=None, second_half_qps=None))
    assert short.valid and any("stability not judged" in n for n in short.notes)


def test_exactly_at_the_error_limit_is_valid() -> None:
    assert verdict(replace(GOOD, completed=999, errors=1, max_error_rate=0.001)).valid


def test_stability_rule() -> None:
    assert is_stable([100, 104, 97], [2.0, 2.1, 1.95], 3, 0.10)
    assert not is_stable([100, 130, 97], [2.0, 2.1, 1.95], 3, 0.10)  # QPS drifts
    assert not is_stable([100, 100, 100], [2.0, 2.6, 2.0], 3, 0.10)  # P50 drifts
    assert not is_stable([100, 100], [2.0, 2.0], 3, 0.10)  # not enough windows yet
    assert not is_stable([100, 100, 100], [2.0, None, 2.0], 3, 0.10)
    assert is_stable([50, 300, 100, 104, 97], [9, 9, 2.0, 2.1, 1.95], 3, 0.10)  # only the last 3


def test_halves() -> None:
    assert halves([10, 10, 20, 20]) == (10, 20)
    assert halves([10, 10, 99, 20, 20]) == (10, 20)  # the middle of an odd count is left out
    assert halves([5, 5, 5]) == (None, None)  # too short to call a trend


def test_protocol_resolution() -> None:
    full = effective_protocol(Protocol())
    assert (full.warmup, full.warmup_s, full.warmup_max_s, full.duration_s) == (
        "stable",
        30.0,
        300.0,
        600.0,
    )
    assert not full.provisional
    assert effective_protocol(Protocol(), duration_s=900).provisional is False
    assert effective_protocol(Protocol(), duration_s=120).provisional
    assert effective_protocol(Protocol(), warmup_s=5).provisional  # fixed warmup under 30 s
    quick = effective_protocol(Protocol(), quick=True)
    assert quick.name == "quick" and quick.provisional and quick.warmup == "fixed"
    assert effective_protocol(Protocol(name="quick"), duration_s=2).duration_s == 2
    with pytest.raises(ConfigError, match="outside"):
        effective_protocol(Protocol(), duration_s=1200)
    assert full.as_dict() != quick.as_dict()


# -- who set the pace, and what else used the machine (issue 12) --------------------------------

OPEN = replace(
    GOOD,
    intended_qps=200.0,
    completed_qps=199.0,
    in_flight_start=3,
    in_flight_end=4,
    in_flight_max=9,
    in_flight_limit=512,
)


def test_a_backlog_that_grows_is_the_target_saturated_not_the_generator() -> None:
    overloaded = replace(
        OPEN, completed_qps=120.0, in_flight_end=512, in_flight_max=512, send_lag_p99_ms=900.0
    )
    judged = verdict(overloaded)
    (reason,) = [r for r in judged.reasons if "saturated" in r]
    assert "offered 200.0/s, completed 120.0/s, backlog 512 in flight at the end" in reason
    assert not any("fell behind" in r for r in judged.reasons)
    # Short of the rate with the backlog growing, the in-flight limit not reached yet.
    growing = replace(OPEN, completed_qps=150.0, in_flight_end=60, in_flight_max=60)
    assert any("saturated" in r for r in verdict(growing).reasons)
    # Keeping up within 5%: not saturated, whatever the backlog did.
    assert verdict(replace(OPEN, in_flight_end=60, in_flight_max=60)).valid
    # A closed loop cannot saturate this way: its clients wait for their answers.
    assert not any("saturated" in r for r in verdict(replace(overloaded, open_loop=False)).reasons)


def test_a_generator_that_fell_behind_says_why_with_the_evidence() -> None:
    lagging = replace(OPEN, send_lag_p99_ms=3.1)
    busy_self = verdict(replace(lagging, load=LoadFacts(optlab_cpu_pct=97.0)))
    (reason,) = busy_self.reasons
    assert "while the target kept up (at most 9 of 512 in flight)" in reason
    assert "optlab's own process used 97% of a core" in reason
    busy_box = verdict(
        replace(
            lagging,
            in_process=False,
            load=LoadFacts(
                optlab_cpu_pct=40.0,
                service_cpu_pct=150.0,
                system_cpu_pct=98.0,
                other_cpu_pct=(5.0, 7.0),
            ),
        )
    )
    (reason,) = busy_box.reasons
    assert "the machine's CPUs were busy (98% of all cores busy, the service 150% of a core" in (
        reason
    )
    assert "raise max_in_flight" not in reason


def test_the_gil_is_named_only_for_an_in_process_target_and_with_the_evidence() -> None:
    lagged = replace(GOOD, start_lag_p99_ms=3.0, load=LoadFacts(optlab_cpu_pct=95.0))
    assert any("GIL contention" in n for n in verdict(lagged).notes)
    service = verdict(replace(lagged, in_process=False))
    assert not any("start-lag" in n for n in service.notes)  # another process: no GIL shared
    idle = verdict(replace(lagged, load=LoadFacts(optlab_cpu_pct=20.0)))
    assert not any("GIL" in n for n in idle.notes) and any("start-lag" in n for n in idle.notes)


def test_an_unstable_run_says_when_the_machine_was_taken_away() -> None:
    stolen = replace(GOOD, second_half_qps=150.0, load=LoadFacts(steal_pct=(1.0, 14.0)))
    (reason,) = verdict(stolen).reasons
    assert (
        "the hypervisor took away 14% of the CPU in the second half (steal; 1% in the other)"
        in (reason)
    )
    assert "--paired or --repeats" in reason and "protocol.stability_pct" in reason
    neighbour = {"name": "stress-ng", "pid": 4242, "cpu_pct": 180.0}
    crowded = replace(
        GOOD,
        second_half_qps=150.0,
        load=LoadFacts(other_cpu_pct=(3.0, 175.0), neighbours=(neighbour,)),
    )
    (reason,) = verdict(crowded).reasons
    assert "other processes used 175% of a core in the second half (3% in the other)" in reason
    assert "stress-ng (pid 4242, 180.0% of a core)" in reason
    # The tolerance is the protocol's: 25% apart passes at stability_pct 30.
    assert verdict(replace(GOOD, second_half_qps=150.0, stability_tolerance=0.30)).valid


def test_concurrent_optlab_runs_on_this_host_are_said() -> None:
    judged = verdict(replace(GOOD, load=LoadFacts(concurrent_runs=("run 7 fp16",))))
    assert judged.valid
    assert any(
        "another optlab measurement ran on this host at the same time (run 7 fp16)" in n
        for n in judged.notes
    )


def test_machine_facts_average_each_half() -> None:
    class Reading:
        def __init__(self, steal: float, other: float) -> None:
            self.steal_pct, self.other_cpu_pct = steal, other
            self.cpu_process_pct, self.service_cpu_pct, self.cpu_system_pct = 50.0, None, 60.0

    facts = machine_facts([Reading(0, 10), Reading(2, 20), Reading(10, 100), Reading(20, 200)])
    assert facts.steal_pct == (1.0, 15.0) and facts.other_cpu_pct == (15.0, 150.0)
    assert facts.optlab_cpu_pct == 50.0 and facts.service_cpu_pct is None
    assert machine_facts([]) == LoadFacts()


def test_stability_pct_is_a_protocol_field_that_sets_the_tolerance() -> None:
    assert effective_protocol(Protocol(stability_pct=25), quick=True).stability_tolerance == 0.25
    assert effective_protocol(Protocol()).stability_tolerance == 0.10
    # Unset, it is left out of the stored config: baselines stored before keep their hash.
    assert "stability_pct" not in Protocol().model_dump(mode="json")
    with pytest.raises(ValueError, match="stability_pct"):
        Protocol(stability_pct=0)


# -- a sweep level stopped early -------------------------------------------------------


def test_a_backlog_rising_every_second_is_plainly_saturated() -> None:
    # 200/s offered: rising every second by 20 (0.1 s of arrivals) is not yet plain ...
    assert plainly_saturated([0, 20, 40, 60, 80], 200.0, 512) is None
    # ... by 120 over 3 s (0.6 s of arrivals) it is.
    found = plainly_saturated([5, 40, 80, 125], 200.0, 512)
    assert found is not None and "5 -> 125 in 3 s" in found
    # A backlog that fell once in the last 3 s is a busy queue, not a saturated one.
    assert plainly_saturated([5, 60, 50, 125], 200.0, 512) is None
    # Pegged at the in-flight limit: the generator cannot send more.
    pegged = plainly_saturated([512, 512, 512, 512], 200.0, 512)
    assert pegged is not None and "the limit" in pegged
    assert plainly_saturated([1, 2, 3], 200.0, 512) is None  # too short to say


def test_a_level_stopped_early_is_invalid_with_the_reason() -> None:
    facts = replace(
        GOOD,
        measured_s=3.2,
        requested_s=20,
        stopped_early="saturated: the backlog in flight rose every second",
    )
    judged = verdict(facts)
    assert not judged.valid
    assert any(r.startswith("stopped after 3.2 s of 20 s: saturated") for r in judged.reasons)
    assert not any("shorter than" in r for r in judged.reasons)


def test_open_loop_halves_apart_by_arrival_noise_alone_are_not_unstable() -> None:
    # 7 s halves at ~50/s: 163 vs 182 requests, 10.4% apart, but within 3 sd of the counts
    # (sqrt(345) = 18.6): Poisson arrivals, not the target, made the gap.
    short = replace(GOOD, measured_s=14.0, first_half_qps=46.6, second_half_qps=52.0)
    assert not any(r.startswith("unstable") for r in verdict(short).reasons)
    # The same 10% gap over 600 s halves (15,000 vs 15,600 requests) is the target's.
    long = replace(GOOD, measured_s=600.0, first_half_qps=50.0, second_half_qps=56.0)
    assert any(r.startswith("unstable") for r in verdict(long).reasons)
    # A closed loop has no arrival noise to allow for.
    closed = replace(short, open_loop=False)
    assert any(r.startswith("unstable") for r in verdict(closed).reasons)
