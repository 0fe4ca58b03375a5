"""The token streamer's model simulated (optlab.reference.llm_queueing) on schedules whose
times can be worked by hand, and its capacity against the model's own saturation."""

from __future__ import annotations

import pytest

from optlab.reference.llm_queueing import (
    SimRequest,
    poisson_arrivals,
    saturation_rate,
    simulate,
    token_capacity,
)
from optlab.reference.streamer import StreamerKnobs

MS = 1_000_000


def test_one_sequence_takes_a_step_per_token_and_its_prefill_first() -> None:
    knobs = StreamerKnobs(slots=1, decode_base_ms=10.0, prefill_ms_per_token=0.5)
    (stream,) = simulate(knobs, [SimRequest(1.0, 8, 4)]).streams
    # The admitting step: 10 + 0.5 x 8 = 14 ms; then 10 ms a token.
    assert [t - 1000 * MS for t, _ in stream.events] == [14 * MS, 24 * MS, 34 * MS, 44 * MS]
    assert stream.ttft_ns() == 14 * MS and stream.e2e_ns() == 44 * MS


def test_a_full_engine_queues_the_next_arrival_and_events_carry_their_tokens() -> None:
    knobs = StreamerKnobs(slots=1, decode_base_ms=5.0, tokens_per_event=2)
    first, second = simulate(knobs, [SimRequest(0.0, 1, 3), SimRequest(0.001, 1, 2)]).streams
    assert [(t // MS, n) for t, n in first.events] == [(10, 2), (15, 1)]
    # The second waits for the slot: admitted at 15 ms, its two tokens in one event at 25 ms.
    assert [(t // MS, n) for t, n in second.events] == [(25, 2)]
    assert second.ttft_ns() == 25 * MS - 1 * MS


def test_a_running_sequence_slows_every_step_and_stalls_come_on_schedule() -> None:
    knobs = StreamerKnobs(
        slots=2, decode_base_ms=10.0, decode_per_seq_ms=5.0, stall_every_s=0.07, stall_ms=30.0
    )
    a, b = simulate(knobs, [SimRequest(0.0, 1, 6), SimRequest(0.0, 1, 6)]).streams
    gaps = [(t2 - t1) // MS for (t1, _), (t2, _) in zip(a.events, a.events[1:], strict=False)]
    # 20 ms steps (two running) starting at 0, 20, ... 80: the one starting at or after 70 ms
    # holds the 30 ms stall; the next is due at 140, the step starting at 130 runs clean.
    assert a.events[0][0] == 20 * MS and gaps == [20, 20, 20, 50, 20] and a.events == b.events


def test_the_capacity_under_token_slos_is_below_saturation_and_meets_them() -> None:
    knobs = StreamerKnobs(slots=8, decode_base_ms=20.0, decode_per_seq_ms=1.0)
    top = saturation_rate(knobs, 16, 32)
    assert top == pytest.approx(8 / (32 * 0.028))
    capacity = token_capacity(
        knobs, ttft_p99_ms=200.0, tpot_p99_ms=None, input_tokens=16, max_tokens=32,
        requests=2000,
    )  # fmt: skip
    assert capacity is not None and 0.3 * top < capacity < top
    at = simulate(knobs, poisson_arrivals(capacity, 2000, 0, 16, 32)).percentiles(99.0)
    beyond = simulate(knobs, poisson_arrivals(capacity * 1.05, 2000, 0, 16, 32)).percentiles(99.0)
    assert at["ttft"] is not None and at["ttft"] <= 200.0 < (beyond["ttft"] or 0.0)
    # A bound no step can meet: no capacity at all.
    none = token_capacity(knobs, ttft_p99_ms=5.0, tpot_p99_ms=None, input_tokens=16,
                          max_tokens=32, requests=200)  # fmt: skip
    assert none is None
