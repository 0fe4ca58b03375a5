"""The synthetic target on the real clock: its sleeps land on their deadlines, and its FCFS
queue holds when real threads call it. The schedule itself (queue, stalls, FCFS order, the
M/M/2 law) is tested exactly on a fake clock in tests/unit/test_synthetic.py; here only what
the wall clock adds. Bounds are generous for a busy 2-core machine (checked beside
`stress-ng --cpu 2`); every message prints the figures measured."""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np

from optlab.load.timerslack import sleep_until
from optlab.metrics.stages import CURRENT, RequestTiming
from optlab.reference.synthetic import build

MS = 1_000_000


def test_a_service_time_sleep_lands_on_its_deadline() -> None:
    target = build({"service_ms": 1.0})
    elapsed_ms = []
    for request in range(30):
        started = time.perf_counter_ns()
        target(request)
        elapsed_ms.append((time.perf_counter_ns() - started) / MS)
    figures = (
        f"median {statistics.median(elapsed_ms):.3f} ms, "
        f"p90 {np.percentile(elapsed_ms, 90):.3f} ms, min {min(elapsed_ms):.3f} ms"
    )
    # Never early: the deadline is taken after `started`. Hybrid sleep + spin lands within
    # ~50 us on an idle machine; a busy one delays the wake-up, never brings it forward.
    assert min(elapsed_ms) >= 1.0, f"a 1 ms service came back early: {figures}"
    assert statistics.median(elapsed_ms) < 3.0, f"1 ms service: {figures}"


def test_one_server_serves_real_threads_in_arrival_order() -> None:
    # Twenty threads call a 10 ms single server 3 ms apart (a queue of up to ~14 at once).
    # Threads waiting on a lock wake in no set order; the target must finish them in the order
    # they arrived. Judged on pairs called 5 ms or more apart: which of two calls close
    # together took the target's lock first is not visible from here. One attempt.
    target = build({"service_ms": 10.0, "servers": 1})
    n = 20
    start = time.perf_counter_ns() + 100 * MS  # every thread started and asleep by then
    due = [start + i * 3 * MS for i in range(n)]
    called = np.zeros(n, dtype=np.int64)
    ended = np.zeros(n, dtype=np.int64)
    timings = [RequestTiming() for _ in range(n)]

    def worker(i: int) -> None:
        sleep_until(due[i])
        token = CURRENT.set(timings[i])
        try:
            called[i] = time.perf_counter_ns()
            target(i)
            ended[i] = time.perf_counter_ns()
        finally:
            CURRENT.reset(token)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(60)
        assert not thread.is_alive(), "a call never returned"
    apart = (called[None, :] - called[:, None]) >= 5 * MS  # [i, j]: i called well before j
    late_ms = np.round((called - np.array(due)) / MS, 2).tolist()
    order = np.argsort(ended).tolist()
    figures = (
        f"{int(apart.sum())} pairs 5 ms apart; finish order {order}; call lateness {late_ms} ms"
    )
    assert apart.sum() >= 100, f"the calls bunched up: {figures}"
    assert np.all((ended[:, None] < ended[None, :])[apart]), f"out of order: {figures}"
    # The last to arrive queued behind the others: at least 10 ms for each that had not begun
    # its service when it came, however late it came (a lower bound the queue imposes).
    last = int(np.argmax(called))
    waiting = int((ended > called[last]).sum()) - 2  # not itself, nor the one in service
    stages = timings[last].stages
    assert stages is not None
    queued_ms = stages["queue"] / MS
    assert queued_ms >= 10 * waiting - 1, f"queued {queued_ms:.1f} ms behind {waiting}: {figures}"
