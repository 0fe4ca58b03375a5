"""The validity verdict, the warmup stability rule, and protocol resolution: pure functions."""

from __future__ import annotations

from dataclasses import replace

import pytest

from optlab.config.models import Protocol
from optlab.errors import ConfigError
from optlab.protocol import effective_protocol
from optlab.validity import RunFacts, halves, is_stable, verdict

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
        ({"send_lag_p99_ms": 7.5}, "the load generator, not the target, was the bottleneck"),
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
