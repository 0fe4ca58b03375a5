"""Schedules and the load generator, measured against the synthetic target's known truth.

Tolerances are wide on purpose: these run on small, shared, noisy machines. What they pin down
is the behaviour that matters: open-loop latency includes stalls (no coordinated omission),
closed-loop latency does not, errors and timeouts are counted, stop() drains and reports.
"""

from __future__ import annotations

import itertools
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from optlab.config.models import ReplayLoad
from optlab.load.base import StopReport
from optlab.load.generator import ThreadLoadGenerator
from optlab.load.timerfd import Alarm
from optlab.metrics.log import Collector
from optlab.metrics.stages import CURRENT, RequestTiming
from optlab.reference.synthetic import build
from tests.support import generating
from tests.support.capabilities import lacks
from tests.support.generating import (
    Load,
    closed,
    load_threads,
    measure,
    open_,
    summary,
)
from tests.support.waits import wait_until

# -- closed loop ----------------------------------------------------------------------------

deputy_wake = generating.deputy_wake  # a fixture: pytest finds it in this module


def test_closed_loop_measures_the_service_time() -> None:
    report, collector, _ = measure(build({"service_ms": 2.0}), closed(2), 1.0)
    ok, errors = collector.totals("measure")
    assert errors == 0
    assert ok == report.completed == report.issued > 0
    # The target sleeps 2 ms a call: never less (how near: tests/timing/test_load_timing.py).
    assert summary(collector)["p50"] >= summary(collector, "service")["p50"] >= 1.6
    # Closed loop: each request leaves when the last returned, so lag is 0 (the histogram's floor).
    assert summary(collector, "send_lag")["max"] < 0.01
    assert report.abandoned == 0
    assert not report.fell_behind


def test_closed_loop_cycles_through_the_requests_and_sets_the_request_timing() -> None:
    seen: list[Any] = []
    timings: list[RequestTiming | None] = []

    def target(request: Any) -> None:
        seen.append(request)
        timings.append(CURRENT.get())

    measure(target, closed(1), 0.05, requests=["a", "b", "c"])
    assert seen[:6] == ["a", "b", "c", "a", "b", "c"]
    assert all(isinstance(t, RequestTiming) for t in timings)
    assert len({id(t) for t in timings[:100]}) == min(100, len(timings))  # fresh per request


# -- open loop ------------------------------------------------------------------------------


def test_open_loop_sees_a_stall_that_closed_loop_hides() -> None:
    """Coordinated omission: the same stalling server, measured both ways."""
    knobs = {"service_ms": 1.0, "single_server": True, "stall_every_s": 1.0, "stall_ms": 300.0}
    target = build(knobs)
    _, collector, _ = measure(target, open_(100.0), 3.0)
    measured = summary(collector)
    # Requests due during each 300 ms stall wait it out: the P99 shows the stall. (How near
    # the P99 comes to a simulated FIFO server's is tests/timing/test_load_timing.py's.)
    assert measured["p99"] >= 150.0, measured
    assert summary(collector, "queue")["max"] > 100.0  # requests waited behind the stall

    _, closed_collector, _ = measure(build(knobs), closed(1), 2.5)
    # The closed loop sent one request per stall: its P99 cannot see the stall (half of it
    # tells the two apart with room for a busy machine's hiccups).
    assert summary(closed_collector)["p99"] < 150.0, summary(closed_collector)


def test_open_loop_with_too_few_workers_falls_behind_and_says_so() -> None:
    report, collector, _ = measure(build({"service_ms": 20.0}), open_(200.0, max_in_flight=1), 1.0)
    # One worker, 20 ms per request: 50/s at most, so requests leave ever later.
    assert report.fell_behind
    assert report.issued < 80
    assert summary(collector, "send_lag")["max"] > 100.0
    assert summary(collector)["max"] > 100.0  # and their latency shows it


def test_open_loop_sends_from_one_thread_while_calls_return_quickly(deputy_wake: str) -> None:
    senders: set[int] = set()
    report, _, generator = measure(lambda r: senders.add(threading.get_ident()), open_(2000.0), 1.0)
    assert report.issued > 0 and report.completed == report.issued
    # Each hand-off brings one more sending thread at most. (That the role passes rarely,
    # not once per request, is a matter of timing: tests/timing/test_load_timing.py.)
    assert len(senders) <= generator.handoffs + 1


def test_open_loop_hands_each_slow_call_on_to_another_thread(deputy_wake: str) -> None:
    lock = threading.Lock()
    inside = [0, 0]  # now, most

    def target(request: Any) -> None:
        with lock:
            inside[0] += 1
            inside[1] = max(inside)
        time.sleep(0.02)
        with lock:
            inside[0] -= 1

    report, collector, generator = measure(target, open_(200.0), 1.0)
    # 20 ms calls every 5 ms: ~4 at once, each sent by the thread that took the role over
    # from the one still inside the target, and only by it (one leader at a time).
    assert inside[1] >= 3
    assert generator.handoffs <= report.issued + 1  # one leader at a time
    assert summary(collector)["p50"] >= 19.0  # each call sleeps 20 ms (how much more: timing)


def test_the_alarm_rings_at_its_deadline_or_when_fired() -> None:
    alarm = Alarm.open()
    if alarm is None:
        lacks("no timerfd here")
    try:
        deadline = time.perf_counter_ns() + 20_000_000
        alarm.arm(deadline)
        alarm.wait()
        assert time.perf_counter_ns() >= deadline
        alarm.arm(time.perf_counter_ns() + 60 * 10**9)
        alarm.arm(time.perf_counter_ns() - 1)  # moved into the past: rings at once
        alarm.wait()
        alarm.disarm()
        sleeper = threading.Thread(target=alarm.wait, daemon=True)
        sleeper.start()
        sleeper.join(0.05)
        assert sleeper.is_alive()  # disarmed: it sleeps on
        alarm.fire()
        sleeper.join(5.0)
        assert not sleeper.is_alive()
    finally:
        alarm.close()


def test_replay_picks_requests_by_id_and_loops(tmp_path: Path) -> None:
    (tmp_path / "trace.jsonl").write_text(
        '{"t": 0, "id": 2}\n{"t": 0.01, "id": 4}\n{"t": 0.02}\n', encoding="utf-8"
    )
    seen: list[Any] = []
    load = ReplayLoad(mode="replay", trace="trace.jsonl", time_scale=1.0)
    generator = ThreadLoadGenerator(seen.append, "abc", load, timeout_s=10.0, trace_dir=tmp_path)
    generator.start(Collector())
    wait_until(lambda: len(seen) >= 6, "six requests replayed")  # the 3-entry trace looped
    report = generator.stop(drain_timeout_s=60)
    # ids are indices modulo len(requests); entries without one go round robin.
    assert seen[:6] == ["c", "b", "a", "c", "b", "b"]
    assert report.issued >= 6


# -- errors, timeouts, stopping -------------------------------------------------------------


@pytest.mark.parametrize("load", [closed(2), open_(2000.0)])
def test_target_exceptions_are_counted_by_type(load: Load) -> None:
    report, collector, _ = measure(build({"service_ms": 0.0, "error_rate": 0.5}), load, 0.5)
    ok, errors = collector.totals("measure")
    counts = collector.error_counts("measure")
    assert set(counts) == {"RuntimeError"}
    count, example = counts["RuntimeError"]
    assert count == errors
    assert example == "synthetic error (error_rate)"
    assert ok + errors == report.completed
    assert errors / (ok + errors) == pytest.approx(0.5, abs=0.1)


def test_a_call_that_returns_after_the_timeout_is_an_error() -> None:
    collector = Collector()
    collector.set_phase("measure", time.perf_counter_ns())
    generator = ThreadLoadGenerator(build({"service_ms": 50.0}), [0], closed(2), timeout_s=0.01)
    generator.start(collector)
    wait_until(lambda: generator.issued - generator.in_flight >= 4, "four calls returned")
    generator.stop(drain_timeout_s=60)
    collector.finish()
    ok, errors = collector.totals("measure")
    assert ok == 0
    assert errors >= 4
    count, example = collector.error_counts("measure")["timeout"]
    assert count == errors
    assert example is not None and "over the 10 ms timeout" in example


def test_stop_drains_requests_in_flight() -> None:
    collector = Collector()
    collector.set_phase("measure", time.perf_counter_ns())
    generator = ThreadLoadGenerator(build({"service_ms": 200.0}), [0], open_(50.0), timeout_s=10.0)
    generator.start(collector)
    # 50/s of 200 ms calls: three are in flight 40 ms in, however late the threads start.
    wait_until(lambda: generator.in_flight >= 3, "three requests in flight")
    report = generator.stop(drain_timeout_s=2.0)
    assert report.abandoned == 0
    assert report.completed == report.issued >= 3
    assert generator.in_flight == 0
    assert generator.stop() is report  # idempotent


def test_stop_reports_requests_stuck_past_the_drain_timeout() -> None:
    release = threading.Event()
    collector = Collector()
    collector.set_phase("measure", time.perf_counter_ns())
    before = load_threads()
    # Stuck for 10 minutes unless released: a stop() that waited for them would take that long.
    generator = ThreadLoadGenerator(lambda r: release.wait(600), [0], closed(3), timeout_s=600)
    generator.start(collector)
    workers = load_threads() - before
    try:
        wait_until(lambda: generator.in_flight == 3, "the three clients' calls in flight")
        started = time.monotonic()
        report = generator.stop(drain_timeout_s=0.2)
        # It waited the drain timeout, then gave up on the calls (stuck for 600 s); the upper
        # bound only has to tell the two apart, so a busy machine cannot fail it.
        elapsed = time.monotonic() - started
        assert 0.2 <= elapsed < 60, f"stop() took {elapsed:.1f} s"
        assert report == StopReport(issued=3, completed=0, abandoned=3, fell_behind=False)
    finally:
        release.set()
    # The released calls have returned and their threads are done with them.
    wait_until(lambda: not any(t.is_alive() for t in workers), "the released clients exited")
    collector.finish()
    assert collector.totals("measure") == (0, 0)  # abandoned requests are not recorded late


def test_stop_wakes_an_idle_open_loop_at_once() -> None:
    # One request every 10 minutes: the loop sends one, then waits; stop() must not wait with
    # it, nor out a 600 s drain (60 s only bounds a hang).
    generator = ThreadLoadGenerator(lambda r: r, [0], open_(1 / 600), timeout_s=1.0)
    generator.start(Collector())
    wait_until(lambda: generator.issued == 1 and generator.in_flight == 0, "the first send")
    started = time.monotonic()
    report = generator.stop(drain_timeout_s=600)
    elapsed = time.monotonic() - started
    assert elapsed < 60, f"stop() took {elapsed:.1f} s"
    assert report.abandoned == 0


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
@pytest.mark.parametrize("load", [closed(2), open_(1000.0)])
def test_a_keyboard_interrupt_in_the_target_stops_the_generator(load: Load) -> None:
    calls = itertools.count()

    def target(request: Any) -> None:
        if next(calls) == 20:
            raise KeyboardInterrupt

    generator = ThreadLoadGenerator(target, [0], load, timeout_s=1.0)
    generator.start(Collector())
    wait_until(lambda: generator.failure is not None, "the interrupt reached the generator", 60)
    assert isinstance(generator.failure, KeyboardInterrupt)
    report = generator.stop(drain_timeout_s=1.0)
    assert isinstance(report.failure, KeyboardInterrupt)
    assert report.issued < 1000  # it stopped issuing


def test_the_generator_refuses_a_second_start() -> None:
    generator = ThreadLoadGenerator(lambda r: r, [0], closed(1), timeout_s=1.0)
    generator.start(Collector())
    with pytest.raises(RuntimeError):
        generator.start(Collector())
    generator.stop()


def test_a_failed_start_leaves_no_thread_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    started = itertools.count()
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name.startswith("optlab-load-") and next(started) == 3:
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    generator = ThreadLoadGenerator(lambda r: r, [0], open_(100.0, max_in_flight=10), timeout_s=1.0)
    earlier = set(threading.enumerate())  # an earlier test's hung target may hold its threads
    with pytest.raises(RuntimeError, match="can't start new thread"):
        generator.start(Collector())
    began = time.monotonic()
    report = generator.stop(drain_timeout_s=600)
    elapsed = time.monotonic() - began
    assert elapsed < 60, f"stop() took {elapsed:.1f} s"  # no thread left to wait 600 s for
    assert report.issued == 0
    ours = [t for t in threading.enumerate() if t not in earlier and t.name.startswith("optlab-")]
    assert not ours, ours


@pytest.mark.parametrize("load", [closed(3), open_(200.0)], ids=["closed", "open"])
def test_a_call_that_never_returns_is_a_timeout_while_it_hangs(load: Load) -> None:
    # One request in 40 hangs until the test releases it: it must be counted as a timeout
    # during the run, once, not vanish (before: a VALID run with 0 errors).
    release = threading.Event()
    seen = itertools.count()

    def call(request: int) -> None:
        if next(seen) == 7:  # the 8th call only
            release.wait(30)
        else:
            time.sleep(0.002)

    try:
        report, collector, _ = measure(
            call, load, 1.0, timeout_s=0.2, requests=range(40), drain_s=0.3
        )
        ok, errors = collector.totals("measure")
        count, example = collector.error_counts("measure")["timeout"]
        assert count == errors == 1
        assert ok > 100
        assert example is not None and "the call is still running" in example
        assert "over the 200 ms timeout" in example
        assert report.abandoned == 1
    finally:
        release.set()


def test_a_run_whose_every_call_hangs_reports_every_client_as_a_timeout() -> None:
    release = threading.Event()
    before = load_threads()
    try:
        report, collector, _ = measure(
            lambda r: release.wait(30), closed(4), 0.6, timeout_s=0.2, drain_s=0.3
        )
        assert collector.totals("measure") == (0, 4)
        assert report.abandoned == 4
    finally:
        release.set()
    # Released afterwards, the calls are not recorded a second time.
    workers = load_threads() - before
    wait_until(lambda: not any(t.is_alive() for t in workers), "the released clients exited")
    assert collector.totals("measure") == (0, 4)
