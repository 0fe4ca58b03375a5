"""The dynamic batcher and the instance pool, with real threads (no mocks) and no clock read
by the test: waits are on conditions, and what must never wait is given a deadline of 600 s
that a 60 s hang bound would catch. Lower bounds of waits the batcher imposes (the queue stage
of a lone request is at least max_wait_ms) are exact whatever the machine does. How soon a lone
request leaves after max_wait_ms is a real-time figure: tests/timing/test_batcher_timing.py.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from optlab.errors import OptlabError
from optlab.metrics.stages import CURRENT, RequestTiming
from optlab.reference.classifier.batcher import (
    BatcherClosed,
    DynamicBatcher,
    InstancePool,
    Overloaded,
)
from tests.support.capabilities import needs_posix_signals
from tests.support.waits import wait_until

# A deadline no test reaches: batches close only when full. A batch that waited for it would
# hold its callers 600 s, far past every join's 60 s hang bound.
LONG_WAIT_MS = 600_000.0
HANG_S = 60


def echo(worker: int, items: list[int], timings: list[RequestTiming]) -> list[tuple[int, int]]:
    return [(item, worker) for item in items]


def submit_all(
    batcher: DynamicBatcher[Any, Any], items: Sequence[Any], timings: bool = False
) -> list[Any]:
    """Submit each item from its own thread, released together; results (or exceptions)."""
    out: list[Any] = [None] * len(items)
    gate = threading.Barrier(len(items))

    def call(i: int) -> None:
        if timings:
            CURRENT.set(RequestTiming())
        gate.wait()
        try:
            out[i] = batcher.submit(items[i])
        except BaseException as exc:
            out[i] = exc
        if timings:
            out[i] = (out[i], CURRENT.get())

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(items))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_S)
        assert not t.is_alive(), "a submit never returned"
    return out


@pytest.fixture
def closing() -> Iterator[list[DynamicBatcher[Any, Any]]]:
    """Batchers appended here are closed even when a test fails (no leaked threads)."""
    made: list[DynamicBatcher[Any, Any]] = []
    yield made
    for batcher in made:
        with contextlib.suppress(OptlabError):
            batcher.close(timeout_s=5)


def make(
    closing: list[DynamicBatcher[Any, Any]],
    run_batch: Callable[[int, list[Any], list[RequestTiming]], Sequence[Any]] = echo,
    **kwargs: Any,
) -> DynamicBatcher[Any, Any]:
    options: dict[str, Any] = {"max_batch_size": 4, "max_wait_ms": LONG_WAIT_MS, "max_queue": 64}
    options.update(kwargs)
    batcher: DynamicBatcher[Any, Any] = DynamicBatcher(run_batch, **options)
    closing.append(batcher)
    return batcher


def test_full_batches_close_at_once_and_results_go_to_their_callers(closing: list[Any]) -> None:
    batcher = make(closing, max_batch_size=8)
    # A full batch never waits for the (600 s) deadline: submit_all's hang bound would fail.
    results = submit_all(batcher, list(range(32)))
    # Every caller got its own item back, whatever batch it landed in.
    assert results == [(i, 0) for i in range(32)]
    assert batcher.batch_sizes() == {8: 4}
    metrics = batcher.metrics()
    assert metrics["batches"] == 4 and metrics["requests"] == 32
    assert metrics["mean_batch_size"] == 8.0 and metrics["rejected"] == 0
    assert metrics["max_batch_size"] == 8  # the configured limit: full batches fill it
    assert 1 <= metrics["max_queue_depth_seen"] <= 32


def test_a_lone_request_leaves_alone_at_its_deadline(closing: list[Any]) -> None:
    batcher = make(closing, max_batch_size=8, max_wait_ms=1.0)
    for i in range(5):
        assert batcher.submit(i) == (i, 0)
    assert batcher.batch_sizes() == {1: 5}


def test_queue_stage_is_recorded_for_harness_requests_and_throwaways(closing: list[Any]) -> None:
    seen: list[list[RequestTiming]] = []

    def record(worker: int, items: list[int], timings: list[RequestTiming]) -> list[int]:
        seen.append(list(timings))
        return items

    max_wait_ms = 20.0
    batcher = make(closing, record, max_batch_size=4, max_wait_ms=max_wait_ms)
    # Inside the harness: the caller's own RequestTiming gets the stage.
    out = submit_all(batcher, [1], timings=True)
    result, timing = out[0]
    assert result == 1
    assert timing.stages is not None
    assert timing.stages["queue"] >= max_wait_ms * 1e6
    assert seen[0][0] is timing
    # Outside it (no current request): run_batch still gets a RequestTiming with the stage.
    assert batcher.submit(2) == 2
    throwaway = seen[1][0]
    assert isinstance(throwaway, RequestTiming)
    assert throwaway.stages is not None and throwaway.stages["queue"] >= max_wait_ms * 1e6


def test_several_workers_run_batches_concurrently(closing: list[Any]) -> None:
    # Each batch waits at a barrier for another batch: it only passes if two run at once.
    meet = threading.Barrier(2, timeout=10)

    def together(worker: int, items: list[int], timings: list[RequestTiming]) -> list[Any]:
        meet.wait()
        return [(item, worker) for item in items]

    batcher = make(closing, together, max_batch_size=2, workers=2)
    results = submit_all(batcher, list(range(4)))
    assert [item for item, _ in results] == [0, 1, 2, 3]
    assert {worker for _, worker in results} == {0, 1}
    assert batcher.batch_sizes() == {2: 2}


def test_an_exception_reaches_every_request_of_its_batch_and_no_other(
    closing: list[Any],
) -> None:
    def fussy(worker: int, items: list[int], timings: list[RequestTiming]) -> list[int]:
        if any(item < 0 for item in items):
            raise ValueError("negative item")
        return [item * 10 for item in items]

    batcher = make(closing, fussy, max_batch_size=4)
    bad = submit_all(batcher, [1, 2, -3, 4])
    assert all(isinstance(r, ValueError) for r in bad)
    good = submit_all(batcher, [5, 6, 7, 8])
    assert good == [50, 60, 70, 80]
    assert batcher.batch_sizes() == {4: 2}


def test_a_wrong_number_of_results_is_an_error_for_the_whole_batch(closing: list[Any]) -> None:
    def short(worker: int, items: list[int], timings: list[RequestTiming]) -> list[int]:
        return items[:-1]

    batcher = make(closing, short, max_batch_size=3)
    results = submit_all(batcher, [1, 2, 3])
    assert all(isinstance(r, OptlabError) for r in results)
    assert "returned 2 results for a batch of 3" in str(results[0])


def test_a_full_queue_sheds_load_and_counts_it(closing: list[Any]) -> None:
    release = threading.Event()

    def blocked(worker: int, items: list[int], timings: list[RequestTiming]) -> list[int]:
        assert release.wait(HANG_S)
        return items

    batcher = make(closing, blocked, max_batch_size=1, max_queue=2)
    out: list[Any] = []

    def call(i: int) -> None:
        out.append(batcher.submit(i))

    threads = [threading.Thread(target=call, args=(0,))]
    threads[0].start()
    # The first request is taken by the (now blocked) worker; two more fill the queue.
    wait_until(lambda: batcher.metrics()["batches"] == 1, "the first batch taken")
    for i in (1, 2):
        thread = threading.Thread(target=call, args=(i,))
        thread.start()
        threads.append(thread)
    wait_until(lambda: batcher.metrics()["max_queue_depth_seen"] == 2, "two queued")
    with pytest.raises(Overloaded) as shed:
        batcher.submit(3)
    assert "queue is full (2 requests waiting)" in shed.value.message
    assert shed.value.hint is not None and "batching.max_queue" in shed.value.hint
    release.set()
    for thread in threads:
        thread.join(HANG_S)
    assert sorted(out) == [0, 1, 2]
    assert batcher.metrics()["rejected"] == 1
    batcher.reset_metrics()
    assert batcher.metrics()["rejected"] == 0 and batcher.batch_sizes() == {}


def test_close_drains_what_was_queued_then_refuses(closing: list[Any]) -> None:
    release = threading.Event()

    def blocked(worker: int, items: list[int], timings: list[RequestTiming]) -> list[int]:
        assert release.wait(HANG_S)
        return [item + 100 for item in items]

    # A deadline no request reaches: the drain must not wait for it either.
    batcher = make(closing, blocked, max_batch_size=4, max_queue=100)
    results: dict[int, Any] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, batcher.submit(i)))
        for i in range(10)
    ]
    for thread in threads:
        thread.start()
    wait_until(lambda: batcher.metrics()["max_queue_depth_seen"] >= 6, "six queued")
    wait_until(lambda: batcher.metrics()["batches"] >= 1, "the first batch taken")
    closer = threading.Thread(target=batcher.close)
    closer.start()
    wait_until(lambda: batcher.closed, "the batcher closed")
    with pytest.raises(BatcherClosed):
        batcher.submit(99)
    release.set()
    # The drained remainder (fewer than 4) runs without waiting for the 600 s deadline.
    closer.join(HANG_S)
    assert not closer.is_alive()
    for thread in threads:
        thread.join(HANG_S)
    assert results == {i: i + 100 for i in range(10)}
    assert sum(batcher.batch_sizes().values()) >= 3
    batcher.close()  # idempotent


def test_close_gives_up_on_a_stuck_batch_and_fails_the_queued_requests(
    closing: list[Any],
) -> None:
    release = threading.Event()

    def stuck(worker: int, items: list[int], timings: list[RequestTiming]) -> list[int]:
        release.wait(HANG_S)
        return items

    batcher = make(closing, stuck, max_batch_size=1)
    results: dict[int, Any] = {}

    def call(i: int) -> None:
        try:
            results[i] = batcher.submit(i)
        except BatcherClosed as exc:
            results[i] = exc

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    wait_until(lambda: batcher.metrics()["batches"] == 1, "the first batch taken")
    wait_until(lambda: batcher.metrics()["max_queue_depth_seen"] >= 2, "two queued")
    with pytest.raises(OptlabError, match="still inside run_batch"):
        batcher.close(timeout_s=0.1)
    release.set()
    for thread in threads:
        thread.join(HANG_S)
    ran = [r for r in results.values() if isinstance(r, int)]
    failed = [r for r in results.values() if isinstance(r, BatcherClosed)]
    assert len(ran) == 1 and len(failed) == 2
    batcher.close()  # now the worker is free: joins cleanly


def test_no_threads_are_left_behind() -> None:
    before = threading.active_count()
    batcher: DynamicBatcher[int, Any] = DynamicBatcher(
        echo, max_batch_size=4, max_wait_ms=1.0, max_queue=16, workers=3
    )
    assert threading.active_count() == before + 3
    assert [item for item, _ in submit_all(batcher, [1, 2, 3])] == [1, 2, 3]
    batcher.close()
    assert threading.active_count() == before


def test_submit_after_close_raises() -> None:
    batcher: DynamicBatcher[int, Any] = DynamicBatcher(
        echo, max_batch_size=2, max_wait_ms=1.0, max_queue=4
    )
    batcher.close()
    batcher.close()
    with pytest.raises(BatcherClosed):
        batcher.submit(1)


@pytest.mark.parametrize(
    "options",
    [
        {"max_batch_size": 0, "max_wait_ms": 1.0, "max_queue": 1},
        {"max_batch_size": 1, "max_wait_ms": -1.0, "max_queue": 1},
        {"max_batch_size": 1, "max_wait_ms": 1.0, "max_queue": 0},
        {"max_batch_size": 1, "max_wait_ms": 1.0, "max_queue": 1, "workers": 0},
    ],
)
def test_bad_settings_are_refused_before_any_thread_starts(options: dict[str, Any]) -> None:
    before = threading.active_count()
    with pytest.raises(ValueError):
        DynamicBatcher(echo, **options)
    assert threading.active_count() == before


# -- instance pool ----------------------------------------------------------------------------


def test_pool_never_shares_an_instance_and_records_the_wait() -> None:
    pool = InstancePool(["a", "b"])
    in_use: set[str] = set()
    peak = [0]
    guard = threading.Lock()
    timings: list[RequestTiming] = []
    gate = threading.Barrier(8)
    release = threading.Event()

    def call() -> None:
        timing = RequestTiming()
        CURRENT.set(timing)
        gate.wait()
        with pool.acquire() as instance:
            with guard:
                assert instance not in in_use
                in_use.add(instance)
                peak[0] = max(peak[0], len(in_use))
            assert release.wait(HANG_S)  # the first two hold their instances until all queue
            with guard:
                in_use.discard(instance)
        timings.append(timing)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    # Eight requests released together on two instances: two are served, six wait in line.
    wait_until(lambda: pool.metrics()["waiting"] == 6, "six waiting")
    release.set()
    for thread in threads:
        thread.join(HANG_S)
    assert peak[0] == 2
    # Every request records its queue stage: six of them a real wait (a line formed), the
    # two served at once next to nothing.
    queued = sorted(t.stages["queue"] for t in timings if t.stages)
    assert len(queued) == 8 and queued[2] > 0
    metrics = pool.metrics()
    assert metrics["requests"] == 8 and sum(metrics["requests_per_instance"]) == 8
    assert metrics["max_waiters_seen"] == 6 and metrics["waiting"] == 0
    pool.reset_metrics()
    assert pool.metrics()["requests"] == 0


def test_pool_serves_waiters_in_arrival_order() -> None:
    pool = InstancePool([object()])
    order: list[int] = []
    threads = []

    def call(i: int) -> None:
        with pool.acquire():
            order.append(i)

    def waiting(n: int) -> Callable[[], bool]:
        return lambda: pool.metrics()["waiting"] == n

    with pool.acquire():
        for i in range(5):
            thread = threading.Thread(target=call, args=(i,))
            thread.start()
            threads.append(thread)
            # Each one is queued before the next arrives.
            wait_until(waiting(i + 1), f"{i + 1} waiting")
    for thread in threads:
        thread.join(HANG_S)
    assert order == [0, 1, 2, 3, 4]


def test_pool_returns_the_instance_when_the_request_fails() -> None:
    pool = InstancePool([1])
    with pytest.raises(RuntimeError), pool.acquire():
        raise RuntimeError("engine failed")
    with pool.acquire() as instance:  # would block forever if it had leaked
        assert instance == 1
    assert pool.metrics()["requests"] == 2


def test_pool_needs_an_instance() -> None:
    with pytest.raises(ValueError):
        InstancePool([])


class Interrupted(Exception):
    pass


@needs_posix_signals
def test_pool_waiter_interrupted_by_a_signal_leaves_the_line() -> None:
    # Signals are delivered to the main thread only, which is where pytest runs a test.
    assert threading.current_thread() is threading.main_thread()
    pool = InstancePool(["only"])
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with pool.acquire():
            holding.set()
            release.wait(HANG_S)

    def interrupt() -> None:
        wait_until(lambda: pool.metrics()["waiting"] == 1, "one waiting")
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR1)

    def handler(signum: int, frame: object) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, handler)
    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(HANG_S)
        threading.Thread(target=interrupt).start()
        with pytest.raises(Interrupted), pool.acquire():
            pass
    finally:
        signal.signal(signal.SIGUSR1, previous)
        release.set()
        holder.join(HANG_S)
    assert pool.metrics()["waiting"] == 0
    with pool.acquire() as instance:  # the line is empty and the instance is free
        assert instance == "only"
