"""Stage timing, latency histograms and the load-generator -> collector hand-off.

Stages are timed on a fake clock (the `clock` fixture stands in for the `time` module that
optlab.metrics.stages reads), so their durations are exact. What recording costs in CPU time
is a real-time figure: tests/timing/test_metrics_timing.py.
"""

from __future__ import annotations

import contextvars
import threading

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from optlab.metrics import stages as stages_module
from optlab.metrics.histogram import HIGHEST_NS, LOWEST_NS, SIGNIFICANT_DIGITS, LatencyHistogram
from optlab.metrics.log import Collector, Window
from optlab.metrics.stages import CURRENT, RequestTiming, current_request, stage

MS = 1_000_000
S = 1_000_000_000
# LOWEST_NS=1000 rounds down to a 512 ns unit: below ~1 ms (2048 units) precision is absolute.
RESOLUTION_MS = 512 / MS


class FakeClock:
    """`perf_counter_ns` for optlab.metrics.stages: time moves only when a test's work says."""

    def __init__(self) -> None:
        self.ns = 10 * S
        self._lock = threading.Lock()

    def perf_counter_ns(self) -> int:
        return self.ns

    def work(self, ns: int) -> None:
        """A block of work that takes `ns`."""
        with self._lock:
            self.ns += ns


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(stages_module, "time", fake)
    return fake


def _in_request(fn: object) -> RequestTiming:
    """Run ``fn`` the way the load generator does: with a fresh RequestTiming in CURRENT."""
    timing = RequestTiming()
    token = CURRENT.set(timing)
    try:
        fn()  # type: ignore[operator]
    finally:
        CURRENT.reset(token)
    return timing


# -- stages ------------------------------------------------------------------------------------


def test_request_timing_allocates_nothing_until_used() -> None:
    timing = RequestTiming()
    assert timing.stages is None
    timing.add("a", 5)
    timing.add("a", 7)
    timing.add("b", 1)
    assert timing.stages == {"a": 12, "b": 1}
    with pytest.raises(AttributeError):
        timing.other = 1  # type: ignore[attr-defined]


def test_stage_accumulates_into_current_request_including_nested(clock: FakeClock) -> None:
    def target() -> None:
        assert current_request() is not None
        with stage("tokenize"):
            clock.work(2 * MS)
        with stage("model"):
            clock.work(3 * MS)
            with stage("inner"):
                clock.work(1 * MS)
        clock.work(7 * MS)  # outside every stage: counted in none
        with stage("tokenize"):
            clock.work(2 * MS)

    timing = _in_request(target)
    # Repeated stages add up; the outer stage includes the nested one.
    assert timing.stages == {"tokenize": 4 * MS, "model": 4 * MS, "inner": 1 * MS}
    assert current_request() is None


def test_stage_outside_request_is_noop_and_total_is_reserved() -> None:
    assert current_request() is None
    with stage("anything"):
        pass
    with stage("queue"):  # reserved for targets' own batch queues, but allowed
        pass
    with pytest.raises(ValueError, match="total"), stage("total"):
        pass
    timing = _in_request(lambda: None)
    assert timing.stages is None


def test_stage_time_is_recorded_when_the_block_raises(clock: FakeClock) -> None:
    def target() -> None:
        with pytest.raises(KeyError), stage("failing"):
            clock.work(1 * MS)
            raise KeyError("x")

    timing = _in_request(target)
    assert timing.stages == {"failing": 1 * MS}


def test_stage_attributes_a_batch_on_another_thread_to_every_request(clock: FakeClock) -> None:
    """The batching pattern: submitters capture current_request(), a batch thread times once."""
    submitted: list[RequestTiming] = []
    submitted_lock = threading.Lock()
    batch_ready = threading.Event()
    batch_done = threading.Event()

    def batch_thread() -> None:
        assert batch_ready.wait(60)
        with submitted_lock:
            batch = list(submitted)
        assert current_request() is None  # this thread serves no request of its own
        with stage("forward", requests=batch):
            clock.work(5 * MS)
        batch_done.set()

    def submit() -> None:
        captured = current_request()
        assert captured is not None
        with submitted_lock:
            submitted.append(captured)
            if len(submitted) == 3:
                batch_ready.set()
        assert batch_done.wait(60)

    worker = threading.Thread(target=batch_thread)
    worker.start()
    timings: list[RequestTiming] = []
    clients = []
    for _ in range(3):
        ctx = contextvars.copy_context()

        def run_client(ctx: contextvars.Context = ctx) -> None:
            timings.append(ctx.run(_in_request, submit))

        clients.append(threading.Thread(target=run_client))
    for client in clients:
        client.start()
    for client in clients:
        client.join(60)
    worker.join(60)
    assert len(timings) == 3
    values = []
    for timing in timings:
        assert timing.stages is not None and set(timing.stages) == {"forward"}
        values.append(timing.stages["forward"])
    # One interval measured once and given to each request in the batch.
    assert values == [5 * MS] * 3


def test_stage_with_explicit_requests_ignores_the_current_one() -> None:
    other = RequestTiming()

    def target() -> None:
        with stage("empty", requests=[]):
            pass
        with stage("elsewhere", requests=[other]):
            pass

    timing = _in_request(target)
    assert timing.stages is None
    assert other.stages is not None and set(other.stages) == {"elsewhere"}


# -- histograms --------------------------------------------------------------------------------


def _lognormal(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.lognormal(np.log(5 * MS), 1.2, n).astype(np.int64)


def test_record_array_is_identical_to_hdrh_record_value_loop() -> None:
    values = np.concatenate(
        [
            _lognormal(100_000),
            np.array([0, 1, 999, LOWEST_NS, 1_001, 2**20, HIGHEST_NS, HIGHEST_NS + 1, 10**15]),
        ]
    )
    hist = LatencyHistogram()
    hist.record_array(values)
    reference = HdrHistogram(LOWEST_NS, HIGHEST_NS, SIGNIFICANT_DIGITS)
    for value in np.clip(values, LOWEST_NS, HIGHEST_NS).tolist():
        reference.record_value(value)
    assert hist.count == reference.get_total_count() == values.size
    assert np.array_equal(hist.counts, np.ctypeslib.as_array(reference.counts))
    assert hist.encode() == reference.encode().decode("ascii")
    assert hist.clamped == 5  # 0, 1, 999 below the floor; two above an hour


def test_record_ns_matches_record_array_and_clamps() -> None:
    values = _lognormal(2_000, seed=3).tolist() + [10, HIGHEST_NS * 2]
    one_by_one = LatencyHistogram()
    for value in values:
        one_by_one.record_ns(value)
    batched = LatencyHistogram()
    batched.record_array(np.array(values, dtype=np.int64))
    assert one_by_one.encode() == batched.encode()
    assert one_by_one.clamped == batched.clamped == 2


def test_summary_statistics_agree_with_numpy_within_hdr_precision() -> None:
    values = _lognormal(100_000, seed=1)
    hist = LatencyHistogram()
    hist.record_array(values)
    summary = hist.summary_ms()
    assert summary["count"] == values.size
    ordered = np.sort(values)
    for key, q in (("p50", 50), ("p90", 90), ("p95", 95), ("p99", 99), ("p999", 99.9)):
        # HdrHistogram reports the top of the bucket holding the sample at rank round(q% * n).
        rank = max(int(q * values.size / 100 + 0.5), 1)
        exact = ordered[rank - 1] / MS
        got = summary[key]
        assert isinstance(got, float)
        assert exact <= got <= exact * (1 + 1e-3) + RESOLUTION_MS, key
        assert got == pytest.approx(np.percentile(values, q) / MS, rel=2e-3), key
    for key, expected in (
        ("min", values.min()),
        ("max", values.max()),
        ("mean", values.mean()),
        ("stddev", values.std()),
    ):
        got = summary[key]
        assert isinstance(got, float)
        assert got == pytest.approx(expected / MS, rel=1e-3, abs=RESOLUTION_MS), key


def test_summary_matches_hdrh_own_statistics() -> None:
    values = _lognormal(20_000, seed=2)
    hist = LatencyHistogram()
    hist.record_array(values)
    reference = HdrHistogram(LOWEST_NS, HIGHEST_NS, SIGNIFICANT_DIGITS)
    for value in values.tolist():
        reference.record_value(value)
    summary = hist.summary_ms()
    assert summary["p99"] == reference.get_value_at_percentile(99.0) / MS
    assert summary["p999"] == reference.get_value_at_percentile(99.9) / MS
    assert summary["max"] == reference.get_max_value() / MS
    assert summary["min"] == reference.get_min_value() / MS
    assert summary["mean"] == pytest.approx(reference.get_mean_value() / MS, rel=1e-12)
    assert summary["stddev"] == pytest.approx(reference.get_stddev() / MS, rel=1e-9)


def test_empty_histogram_summary_is_none() -> None:
    summary = LatencyHistogram().summary_ms()
    assert summary["count"] == 0
    assert all(summary[key] is None for key in summary if key != "count")
    assert LatencyHistogram.decode(LatencyHistogram().encode()).count == 0


def test_encode_decode_round_trip() -> None:
    hist = LatencyHistogram()
    hist.record_array(_lognormal(50_000, seed=4))
    encoded = hist.encode()
    assert isinstance(encoded, str)
    decoded = LatencyHistogram.decode(encoded)
    assert decoded.count == hist.count
    assert np.array_equal(decoded.counts, hist.counts)
    assert decoded.summary_ms() == hist.summary_ms()
    assert decoded.encode() == encoded
    # A decoded histogram keeps recording.
    decoded.record_ns(7 * MS)
    assert decoded.count == hist.count + 1


def test_decode_rejects_other_histogram_settings() -> None:
    other = HdrHistogram(1, 10**6, 2)
    other.record_value(5)
    with pytest.raises(ValueError, match="different settings"):
        LatencyHistogram.decode(other.encode().decode("ascii"))


def test_merge_equals_recording_everything_in_one() -> None:
    a_values, b_values = _lognormal(30_000, seed=5), _lognormal(20_000, seed=6) * 3
    a, b, both = LatencyHistogram(), LatencyHistogram(), LatencyHistogram()
    a.record_array(a_values)
    b.record_array(b_values)
    both.record_array(np.concatenate([a_values, b_values]))
    merged = LatencyHistogram()  # merging into an empty one must keep the right minimum
    merged.merge(a)
    merged.merge(LatencyHistogram.decode(b.encode()))
    assert merged.count == both.count
    assert np.array_equal(merged.counts, both.counts)
    assert merged.summary_ms() == both.summary_ms()
    assert merged.encode() == both.encode()
    merged.merge(merged)
    assert merged.count == 2 * both.count


# -- collector ---------------------------------------------------------------------------------


def test_phases_windows_and_totals_with_known_counts() -> None:
    collector = Collector(close_grace_s=0)
    log = collector.new_log()
    t0 = 10 * S
    collector.set_phase("warmup", t0)
    collector.set_phase("measure", t0 + 2 * S)
    log.record(t0 - 1, 1 * MS, 0, 0, None)  # before any phase: dropped
    # Warmup: 3 samples in second 0, 1 in second 1.
    for offset in (0, 100 * MS, 999 * MS, S + 5 * MS):
        log.record(t0 + offset, 2 * MS, 0, 0, None)
    # Measure: second 0 has latencies 1..10 ms, second 1 nothing, second 2 four samples.
    m0 = t0 + 2 * S
    for i in range(10):
        log.record(m0 + i * 50 * MS, (i + 1) * MS, i * 1000, 0, None)
    for i in range(4):
        log.record(m0 + 2 * S + i * MS, 20 * MS, 0, 0, None)
    collector.drain()
    windows = collector.windows("warmup")
    assert [(w.t_s, w.completed) for w in windows] == [(0, 3), (1, 1)]
    # Measure windows 0 and 1 are over (a sample past their end was seen); 2 is still open.
    assert [(w.t_s, w.completed) for w in collector.windows("measure")] == [(0, 10), (1, 0)]
    collector.finish()
    measure = collector.windows("measure")
    assert [(w.t_s, w.completed) for w in measure] == [(0, 10), (1, 0), (2, 4)]
    first = measure[0]
    assert first.phase == "measure" and first.errors == 0
    assert first.qps == pytest.approx(10.0)
    expected = np.arange(1, 11) * MS
    assert first.p50_ms == pytest.approx(np.percentile(expected, 50) / MS)
    assert first.p99_ms == pytest.approx(np.percentile(expected, 99) / MS)
    assert first.send_lag_p99_ms == pytest.approx(np.percentile(np.arange(10) * 1000, 99) / MS)
    assert measure[1] == Window("measure", 1, 0, 0, 0.0, None, None, None)
    assert collector.totals("warmup") == (4, 0)
    assert collector.totals("measure") == (14, 0)
    assert collector.unassigned == 1
    assert collector.histograms("warmup")["total"].count == 4
    hist = collector.histograms("measure")
    assert set(hist) == {"total", "send_lag", "start_lag"}
    assert hist["total"].count == 14
    assert collector.totals("nope") == (0, 0) and collector.windows("nope") == []


def test_window_truncated_by_next_phase_uses_its_true_length() -> None:
    collector = Collector(close_grace_s=0)
    log = collector.new_log()
    collector.set_phase("measure", 0)
    for i in range(50):
        log.record(i * 10 * MS, MS, 0, 0, None)  # 100/s over the first half second
    collector.set_phase("done", S // 2)
    collector.drain()
    collector.finish()
    (window,) = collector.windows("measure")
    assert window.completed == 50
    assert window.qps == pytest.approx(100.0)


def test_errors_are_counted_by_type_and_kept_out_of_latency() -> None:
    collector = Collector(close_grace_s=0)
    log = collector.new_log()
    collector.set_phase("measure", 0)
    for i in range(100):
        log.record(i * MS, 3 * MS, 0, 0, None)
    for i in range(7):
        log.record(i * MS, 10 * S, 0, 0, None, error="timeout", message=None if i == 0 else "t/o")
    log.record(5 * MS, 10 * S, 0, 0, None, error="ValueError", message="bad input")
    collector.finish()
    assert collector.totals("measure") == (100, 8)
    assert collector.error_counts("measure") == {
        "timeout": (7, "t/o"),
        "ValueError": (1, "bad input"),
    }
    (window,) = collector.windows("measure")
    assert (window.completed, window.errors) == (100, 8)
    for series in collector.histograms("measure").values():
        assert series.count == 100
    summary = collector.histograms("measure")["total"].summary_ms()
    assert summary["max"] == pytest.approx(3.0, rel=1e-3)


def test_user_stages_become_per_phase_series() -> None:
    collector = Collector()
    log = collector.new_log()
    collector.set_phase("warmup", 0)
    collector.set_phase("measure", S)
    for i in range(200):
        timing = RequestTiming()
        if i % 2 == 0:
            timing.add("model", 4 * MS)
            timing.add("queue", 1 * MS)
        end = i * 10 * MS  # first 100 warmup, next 100 measure
        log.record(end, 6 * MS, 0, 0, timing)
    collector.finish()
    for phase in ("warmup", "measure"):
        hist = collector.histograms(phase)
        assert hist["total"].count == 100
        assert hist["model"].count == 50 and hist["queue"].count == 50
        assert hist["model"].summary_ms()["p50"] == pytest.approx(4.0, rel=1e-3)


def test_take_new_windows_returns_each_window_once() -> None:
    collector = Collector(close_grace_s=0)
    log = collector.new_log()
    collector.set_phase("measure", 0)
    for second in range(5):
        log.record(second * S + 1, MS, 0, 0, None)
        collector.drain()
    first = collector.take_new_windows()
    assert [w.t_s for w in first] == [0, 1, 2, 3]
    assert collector.take_new_windows() == []
    collector.finish()
    assert [w.t_s for w in collector.take_new_windows()] == [4]
    assert [w.t_s for w in collector.windows("measure")] == [0, 1, 2, 3, 4]


def test_grace_keeps_a_window_open_for_slightly_late_records() -> None:
    collector = Collector(close_grace_s=0.25)
    log = collector.new_log()
    collector.set_phase("measure", 0)
    log.record(S + 100 * MS, MS, 0, 0, None)
    collector.drain()
    assert collector.windows("measure") == []  # 0.1 s past the end of window 0: within grace
    log.record(900 * MS, MS, 0, 0, None)  # a thread that took end_ns just before the drain
    log.record(S + 300 * MS, MS, 0, 0, None)
    collector.drain()
    assert [w.completed for w in collector.windows("measure")] == [1]
    assert collector.late == 0


def test_concurrent_recording_while_draining_loses_nothing() -> None:
    collector = Collector()
    collector.set_phase("measure", 0)
    per_thread = 50_000
    start = threading.Barrier(5)

    def worker() -> None:
        log = collector.new_log()
        start.wait()
        base = 10 * S
        for i in range(per_thread):
            if i % 1000 == 999:
                log.record(base + i, 0, 0, 0, None, error="boom", message="x")
            else:
                log.record(base + i, 1 * MS + i, i, i, None)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    start.wait()
    drains = 0
    while any(thread.is_alive() for thread in threads):
        collector.drain()
        drains += 1
    for thread in threads:
        thread.join()
    collector.finish()
    errors = 4 * (per_thread // 1000)
    assert collector.totals("measure") == (4 * per_thread - errors, errors)
    assert collector.histograms("measure")["total"].count == 4 * per_thread - errors
    assert collector.error_counts("measure") == {"boom": (errors, "x")}
    windows = collector.windows("measure")
    # A sliver window at the phase's end is left out of the time series, never out of the count.
    assert sum(w.completed + w.errors for w in windows) + collector.trimmed == 4 * per_thread
    assert sum(w.errors for w in windows) <= errors
    assert drains > 1


def test_memory_stays_bounded_over_twenty_seconds_of_samples() -> None:
    # What is held is one open window's samples whatever the rate: 10,000/s shows it as well
    # as the 100,000/s harness target would (and costs a tenth).
    collector = Collector()
    log = collector.new_log()
    collector.set_phase("measure", 0)
    per_second = 10_000
    held = []
    record = log.record
    for second in range(20):
        base = second * S
        step = S // per_second
        for i in range(per_second):
            record(base + i * step, MS + i, 0, 0, None)
        collector.drain()
        held.append(collector.held_samples())
        assert log.pending() == 0
    # Only the still-open window's raw samples are kept: at most about one window's worth.
    assert max(held) <= 2 * per_second
    assert held[-1] == held[1]
    collector.finish()
    assert collector.held_samples() == 0
    assert collector.totals("measure") == (20 * per_second, 0)
    assert len(collector.windows("measure")) == 20


def test_set_phase_rejects_repeats_and_time_travel() -> None:
    collector = Collector()
    collector.set_phase("warmup", 100)
    with pytest.raises(ValueError):
        collector.set_phase("warmup", 200)
    with pytest.raises(ValueError):
        collector.set_phase("measure", 50)


def test_a_sliver_window_at_the_phase_end_is_left_out_of_the_time_series() -> None:
    collector = Collector(close_grace_s=0)
    log = collector.new_log()
    collector.set_phase("measure", 0)
    for i in range(3_000):  # 1,000 per second for 3 s
        log.record(i * 1_000_000 + 500, 1_000_000, 0, 0, None)
    log.record(3_000_000_100, 1_000_000, 0, 0, None)  # in the last 0.2 ms of the phase
    collector.set_phase("drain", 3_000_200_000)
    collector.finish()
    windows = collector.windows("measure")
    assert [w.completed for w in windows] == [1_000, 1_000, 1_000]
    assert all(abs(w.qps - 1_000) < 1e-6 for w in windows)
    assert collector.trimmed == 1
    assert collector.totals("measure") == (3_001, 0)
