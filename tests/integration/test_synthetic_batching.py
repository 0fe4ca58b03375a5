"""The synthetic target's dynamic batching on the real clock: the threaded target under
Poisson load gives the latencies and batches the simulation gives for the arrivals it saw, and
the HTTP service batches the same way."""

from __future__ import annotations

import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import numpy.typing as npt

from optlab.load.timerslack import sleep_until
from optlab.reference.batching import simulate_batching
from optlab.reference.queueing import poisson_arrivals
from optlab.reference.synthetic import SyntheticTarget, build
from tests.support.proc import free_port, service

MS = 1_000_000


def drive(
    target: SyntheticTarget, schedule_ns: npt.NDArray[np.float64], threads: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Calls `target` at `start + schedule_ns[i]` from a pool of threads (a thread that is
    still busy sends late: the arrival recorded is when it called). Each call's arrival (ns
    from the target's t0) and latency, in arrival order."""
    t0 = target.t0_ns
    start = time.perf_counter_ns() + 50 * MS
    lock = threading.Lock()
    cursor = iter(range(len(schedule_ns)))
    records: list[tuple[int, int]] = []

    def worker() -> None:
        while True:
            with lock:
                i = next(cursor, None)
            if i is None:
                return
            sleep_until(start + int(schedule_ns[i]))
            sent = time.perf_counter_ns()
            target(i)
            ended = time.perf_counter_ns()
            with lock:
                records.append((sent - t0, ended - sent))

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(120)
        assert not thread.is_alive(), "a call never returned"
    records.sort()
    arrivals, latencies = zip(*records, strict=True)
    return np.asarray(arrivals, dtype=np.int64), np.asarray(latencies, dtype=np.float64)


def test_the_threaded_target_batches_as_the_simulation_does() -> None:
    """Two servers, batches of up to 4 taking 3 + 1 n ms (1,143/s at most), 2 ms of wait, at
    350/s for 2.5 s: batches of 1 to 4 form. The simulation of the arrivals the calls made
    gives each call's latency to well under a ms at the median (the gap is wake-up lateness,
    and at batch edges a call that took the target's lock a little after it noted its arrival),
    and the batch sizes the target formed."""
    knobs = {
        "servers": 2,
        "service_ms": 3.0,
        "per_item_ms": 1.0,
        "max_batch_size": 4,
        "max_wait_ms": 2.0,
    }
    target = build(knobs)
    schedule = poisson_arrivals(350.0, 2.5, np.random.default_rng(5)) * 1e9
    arrivals, latencies = drive(target, schedule, threads=24)
    simulated = simulate_batching(arrivals, target.knobs)

    gap = np.abs(latencies - simulated.latencies_ns)
    assert np.median(gap) < 1 * MS, np.quantile(gap, [0.5, 0.9, 0.99]) / MS
    assert np.quantile(gap, 0.9) < 5 * MS, np.quantile(gap, [0.5, 0.9, 0.99]) / MS
    # No call is faster than its batch could be: the smallest batch's time, plus T_close's
    # wait unless the batch filled or the server was busy (then it is at least the 4 ms).
    assert latencies.min() >= 4 * MS * 0.99

    # The batches: the target's count by size against the simulation's.
    formed = target.batch_sizes
    assert sum(size * count for size, count in formed.items()) == arrivals.size
    ours = np.array([formed.get(n, 0) for n in range(1, 5)]) / sum(formed.values())
    theirs = np.bincount(simulated.batch_sizes, minlength=5)[1:] / simulated.batch_sizes.size
    assert theirs[1:].sum() > 0.3, theirs  # this load does batch
    assert np.abs(ours - theirs).max() < 0.1, (ours, theirs)
    mean_formed = arrivals.size / sum(formed.values())
    assert abs(mean_formed - simulated.batch_sizes.mean()) < 0.15 * simulated.batch_sizes.mean()


def test_the_http_service_batches() -> None:
    """Over HTTP (`python -m optlab.reference.synthetic`), one server, batches of up to 4
    taking 20 + 5 n ms with up to 200 ms of wait: four requests sent together fill a batch and
    are served at once in 40 ms; a lone one waits its 200 ms for company, then takes 25."""
    port = free_port()
    args = [
        *("--port", str(port), "--servers", "1", "--service-ms", "20"),
        *("--max-batch-size", "4", "--max-wait-ms", "200", "--per-item-ms", "5"),
    ]

    def post(_: int) -> tuple[float, float]:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/", data=b"x")
        with urllib.request.urlopen(request, timeout=60) as response:
            timing: str = response.headers["Server-Timing"]
        queue, served = (float(part.split("dur=")[1]) for part in timing.split(", "))
        return queue, served

    with service([sys.executable, "-m", "optlab.reference.synthetic", *args], port):
        with ThreadPoolExecutor(4) as pool:
            together = list(pool.map(post, range(4)))
        alone = post(0)
    # The four came within the 200 ms window (however the machine spread them), so they
    # made one batch of four: the same 40 ms each, queued until the last of them came.
    assert [served for _, served in together] == [40.0] * 4
    assert all(0 <= queue < 200 for queue, _ in together)
    assert alone[1] == 25.0
    assert alone[0] == 200.0  # T_close is its arrival + max_wait_ms, exactly
