"""The synthetic target on the real clock: its sleeps land on their deadlines, and its FCFS
schedule holds when real threads call it. The schedule itself (queue, stalls, FCFS order, the
M/M/2 law) is tested exactly on a fake clock in tests/unit/test_synthetic.py; here only what
the wall clock adds. Bounds are generous for a busy 2-core machine (checked beside
`stress-ng --cpu 2`); every message prints the figures measured."""

from __future__ import annotations

import statistics
import threading
import time

import numpy as np

from optlab.load.timerslack import sleep_until
from optlab.reference.queueing import simulate_sojourn
from optlab.reference.synthetic import SyntheticTarget, build

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


def test_one_server_keeps_its_fcfs_schedule_on_real_threads() -> None:
    # Twenty threads call a 10 ms single server 3 ms apart (a queue of up to ~14 at once).
    # Threads waiting on a lock wake in no set order; the target schedules each call when it
    # arrives, under its lock, and sleeps it to that schedule. The arrivals are read from the
    # target's own clock reads (its `now` seam, the real clock observed): a thread descheduled
    # between its own timestamp and the target's lock would otherwise look like a reordering.
    # One attempt.
    arrived: dict[int, int] = {}

    def now() -> int:
        t = time.perf_counter_ns()
        arrived[threading.get_ident()] = t  # under the target's lock, at each arrival
        return t

    target = SyntheticTarget(build({"service_ms": 10.0, "servers": 1}).knobs, now=now)
    n = 20
    start = time.perf_counter_ns() + 100 * MS  # every thread started and asleep by then
    arrival = np.zeros(n, dtype=np.int64)
    ended = np.zeros(n, dtype=np.int64)

    def worker(i: int) -> None:
        sleep_until(start + i * 3 * MS)
        target(i)
        ended[i] = time.perf_counter_ns()
        arrival[i] = arrived[threading.get_ident()]

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(60)
        assert not thread.is_alive(), "a call never returned"
    # The FCFS schedule of these arrivals: each is done 10 ms after it arrived or after the
    # one before it was done, whichever is later.
    order = np.argsort(arrival, kind="stable")
    sojourn_s = simulate_sojourn((arrival[order] - target.t0_ns) / 1e9, np.full(n, 0.010), 1)
    due = np.empty(n, dtype=np.int64)
    due[order] = arrival[order] + np.rint(sojourn_s * 1e9).astype(np.int64)
    late_ms = (ended - due) / MS
    figures = (
        f"lateness after the scheduled finish {np.round(late_ms, 2).tolist()} ms "
        f"(median {np.median(late_ms):.2f}); arrival order {order.tolist()}"
    )
    # Never before its turn: a lower bound the queue imposes, whatever the machine does.
    assert np.all(late_ms >= -0.001), f"a call left before its FCFS turn: {figures}"
    # And about on time: hybrid sleep + spin wakes within ~0.1 ms idle; a busy machine wakes
    # twenty threads late (medians 0.06-5.9 ms in 17 attempts beside `stress-ng --cpu 2` and
    # other tests). The exact schedule is the unit test's; how precisely one sleep lands is
    # the test above.
    assert np.median(late_ms) < 20.0, figures
