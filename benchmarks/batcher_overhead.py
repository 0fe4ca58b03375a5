"""The dynamic batcher's own overhead: a batch of N requests through it against N direct calls.

The work is a fixed-cost spin per item (``--item-us``, default 20 µs), so a batch of N costs
exactly N direct calls and everything above that is the batcher. For N in (1, 8, 32), N client
threads are released together by a barrier, each submits one request, and the batcher
(``max_batch_size`` = N, a deadline no round reaches) runs them as one batch on its worker.
Per round three instants are kept: the first submit, the last submit (the batch is complete
from then on) and the last answer. Printed, each as the median over the rounds:

* ``direct``: the same N calls made one after the other on one thread (the reference);
* ``batcher``: last submit -> last answer, i.e. waking the worker, the batch's run and handing N
  results back; ``overhead`` is this less ``direct``, per request, and ``ratio`` is this over
  ``direct``;
* ``bare``: the same through ``BareBatcher`` (a SimpleQueue in, a lock per request out, no
  deadline, bound, metrics or stage timing), measured in the same run: what the thread
  hand-offs alone cost on this machine, so ``batcher`` less ``bare`` is the batcher's own code;
* ``span``: first submit -> last answer, which adds the clients' own staggered arrival (the
  barrier wakes N threads one by one: a cost of having N callers, not of the batcher).

The uncontended ``InstancePool.acquire`` (batching off) is measured against the bare work too.

Then a lone request, submitted with nothing else queued, for ``max_wait_ms`` of 1 and 5 ms:
its latency should be max_wait_ms and not much more (the deadline is a timed wait). Interleaved
with it, the same wait through ``BareTimedWait`` (a thread's timed lock wait, then waking the
caller: the same two wake-ups and nothing else) shows what this machine's timer and scheduler
alone allow. Goal: never earlier, and P99 at most max_wait_ms + 1 ms. It is a measurement, not
a test: PASS/MISS is printed and the exit status is 0 either way.

Run: ``PYTHONPATH=src python benchmarks/batcher_overhead.py [--smoke]`` (~20 s; smoke ~3 s).
"""

from __future__ import annotations

import argparse
import os
import platform
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from provenance import source_hashes

from optlab.load.timerslack import tighten_timer_slack
from optlab.metrics.stages import RequestTiming
from optlab.reference.classifier.batcher import DynamicBatcher, InstancePool

SIZES = (1, 8, 32)
LONE_WAITS_MS = (1.0, 5.0)
NEVER_MS = 10_000.0  # a deadline no round reaches: each batch closes because it is full
LONE_SLACK_MS = 1.0  # the goal's allowance over max_wait_ms (the generator's own LATE_NS)
WARMUP_ROUNDS = 50


def spin(item: int, ns: int) -> int:
    """The per-item work: a busy wait of fixed length (holds the GIL, like a Python engine)."""
    clock = time.perf_counter_ns
    end = clock() + ns
    while clock() < end:
        pass
    return item


@dataclass(frozen=True)
class BatchFigures:
    size: int
    rounds: int
    direct_us: float
    bare_us: float  # BareBatcher, last submit -> last answer
    after_last_us: float
    span_us: float
    one_batch_share: float  # rounds that ran as exactly one batch of `size`

    @property
    def overhead_us(self) -> float:
        return (self.after_last_us - self.direct_us) / self.size

    @property
    def bare_overhead_us(self) -> float:
        return (self.bare_us - self.direct_us) / self.size


def direct_us(size: int, work_ns: int, rounds: int) -> float:
    clock = time.perf_counter_ns
    times = []
    for _ in range(rounds):
        start = clock()
        for i in range(size):
            spin(i, work_ns)
        times.append(clock() - start)
    return statistics.median(times) / 1e3


class BareBatcher:
    """The least a batcher can be: a SimpleQueue in, a lock per request out, a worker that
    waits for exactly ``size`` items. No deadline, no bound, no metrics, no stage timing: the
    reference for what the thread hand-offs alone cost on this machine."""

    def __init__(self, size: int, work_ns: int) -> None:
        self._size, self._work_ns = size, work_ns
        self._queue: queue.SimpleQueue[tuple[int, threading.Lock, list[int]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._work)
        self._thread.start()

    def submit(self, item: int) -> int:
        done = threading.Lock()
        done.acquire()
        out: list[int] = []
        self._queue.put((item, done, out))
        done.acquire()
        return out[0]

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _work(self) -> None:
        get, size, work_ns = self._queue.get, self._size, self._work_ns
        while True:
            batch: list[tuple[int, threading.Lock, list[int]]] = []
            while len(batch) < size:
                entry = get()
                if entry is None:
                    return
                batch.append(entry)
            results = [spin(item, work_ns) for item, _, _ in batch]
            for (_, done, out), result in zip(batch, results, strict=True):
                out.append(result)
                done.release()


@dataclass(frozen=True)
class Rounds:
    rounds: int
    after_last_us: float  # median of last submit -> last answer
    span_us: float  # median of first submit -> last answer


def drive_rounds(submit: Callable[[int], int], size: int, seconds: float) -> Rounds:
    """Release ``size`` client threads together, each submitting one item, round after round."""
    clock = time.perf_counter_ns
    starts = [0] * size
    ends = [0] * size
    go = threading.Barrier(size + 1)
    done = threading.Barrier(size + 1)
    stop = False

    def client(i: int) -> None:
        while True:
            go.wait()
            if stop:
                return
            starts[i] = clock()
            submit(i)
            ends[i] = clock()
            done.wait()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(size)]
    for thread in threads:
        thread.start()
    after_last: list[int] = []
    spans: list[int] = []
    deadline = time.monotonic() + seconds
    rounds = 0
    try:
        while rounds < WARMUP_ROUNDS or time.monotonic() < deadline:
            go.wait()
            done.wait()
            rounds += 1
            if rounds == WARMUP_ROUNDS:
                deadline = time.monotonic() + seconds  # the measured time starts now
            elif rounds > WARMUP_ROUNDS:
                after_last.append(max(ends) - max(starts))
                spans.append(max(ends) - min(starts))
    finally:
        stop = True
        go.wait()
        for thread in threads:
            thread.join()
    return Rounds(
        rounds=len(after_last),
        after_last_us=statistics.median(after_last) / 1e3,
        span_us=statistics.median(spans) / 1e3,
    )


def through_batcher(size: int, work_ns: int, seconds: float) -> BatchFigures:
    def run_batch(worker: int, items: list[int], timings: list[RequestTiming]) -> list[int]:
        return [spin(item, work_ns) for item in items]

    bare = BareBatcher(size, work_ns)
    try:
        bare_rounds = drive_rounds(bare.submit, size, seconds / 2)
    finally:
        bare.close()
    batcher: DynamicBatcher[int, int] = DynamicBatcher(
        run_batch, max_batch_size=size, max_wait_ms=NEVER_MS, max_queue=2 * size
    )
    try:
        # The warmup rounds are counted in batch_sizes too: WARMUP_ROUNDS more batches.
        rounds = drive_rounds(batcher.submit, size, seconds)
    finally:
        batcher.close()
    batches = batcher.batch_sizes()
    total = rounds.rounds + WARMUP_ROUNDS
    return BatchFigures(
        size=size,
        rounds=rounds.rounds,
        direct_us=direct_us(size, work_ns, min(rounds.rounds, 2_000)),
        bare_us=bare_rounds.after_last_us,
        after_last_us=rounds.after_last_us,
        span_us=rounds.span_us,
        one_batch_share=batches.get(size, 0) / total,
    )


def pool_us(work_ns: int, seconds: float) -> tuple[float, float]:
    """Median of one uncontended acquire + work + release, and of the work alone."""
    pool = InstancePool([object()])
    clock = time.perf_counter_ns
    with_pool, alone = [], []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start = clock()
        with pool.acquire():
            spin(1, work_ns)
        middle = clock()
        spin(1, work_ns)
        with_pool.append(middle - start)
        alone.append(clock() - middle)
    return statistics.median(with_pool) / 1e3, statistics.median(alone) / 1e3


class BareTimedWait:
    """A worker thread that waits ``max_wait_ms`` on a lock with a timeout (timer slack
    tightened, as the batcher's workers do) and then wakes its caller: the same two wake-ups a
    lone request costs, with nothing else. The reference for the lone-request figures."""

    def __init__(self, max_wait_ms: float) -> None:
        self._wait_s = max_wait_ms / 1e3
        self._requests: queue.SimpleQueue[threading.Lock | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work)
        self._thread.start()

    def submit(self, item: int) -> int:
        done = threading.Lock()
        done.acquire()
        self._requests.put(done)
        done.acquire()
        return item

    def close(self) -> None:
        self._requests.put(None)
        self._thread.join()

    def _work(self) -> None:
        tighten_timer_slack()
        never = threading.Lock()
        never.acquire()
        while (done := self._requests.get()) is not None:
            never.acquire(timeout=self._wait_s)
            done.release()


def lone_latencies_ms(max_wait_ms: float, count: int) -> tuple[list[float], list[float]]:
    """Lone requests through the batcher and through BareTimedWait, interleaved one by one so
    that both see the same moments of a shared machine."""

    def run_batch(worker: int, items: list[int], timings: list[RequestTiming]) -> list[int]:
        return items

    batcher: DynamicBatcher[int, int] = DynamicBatcher(
        run_batch, max_batch_size=8, max_wait_ms=max_wait_ms, max_queue=8
    )
    bare = BareTimedWait(max_wait_ms)
    clock = time.perf_counter_ns
    through: list[float] = []
    reference: list[float] = []
    try:
        for i in range(count + 5):
            for submit, out in ((batcher.submit, through), (bare.submit, reference)):
                start = clock()
                submit(i)
                out.append((clock() - start) / 1e6)
    finally:
        batcher.close()
        bare.close()
    # The first few pay for the workers' first wake-ups.
    return through[5:], reference[5:]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def code_id() -> str:
    return source_hashes("reference/classifier/batcher.py")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a few seconds in all")
    parser.add_argument("--seconds", type=float, help="measured seconds per batch size (def. 3)")
    parser.add_argument("--item-us", type=float, default=20.0, help="work per item, µs")
    args = parser.parse_args(argv)
    seconds = args.seconds or (0.3 if args.smoke else 3.0)
    work_ns = int(args.item_us * 1e3)
    lone_count = 20 if args.smoke else 200

    load1, _, _ = os.getloadavg()
    print(
        f"# batcher_overhead: Python {platform.python_version()}, {os.cpu_count()} CPUs, "
        f"load average {load1:.2f}; code: {code_id()}; work {args.item_us:g} µs per item "
        f"(spin); {seconds:g} s per batch size; medians over rounds"
    )
    with_pool, alone = pool_us(work_ns, seconds / 2)
    print(
        f"instance pool          acquire+release {with_pool - alone:6.2f} µs/request  "
        f"(uncontended; {with_pool:.1f} µs against {alone:.1f} µs direct, "
        f"ratio {with_pool / alone:.3f})"
    )
    for size in SIZES:
        fig = through_batcher(size, work_ns, seconds)
        ratio = fig.after_last_us / fig.direct_us
        print(
            f"batch N={size:>2}  direct {fig.direct_us:8.1f} µs  "
            f"batcher {fig.after_last_us:8.1f} µs"
            f"  overhead {fig.overhead_us:6.1f} µs/request  (ratio {ratio:.3f})"
            f"  bare {fig.bare_us:8.1f} µs, overhead {fig.bare_overhead_us:6.1f} µs/request"
            f"  span {fig.span_us:8.1f} µs  one batch of {size} in {fig.one_batch_share:.1%}"
            f" of {fig.rounds:,} rounds"
        )
    verdicts = []
    for max_wait_ms in LONE_WAITS_MS:
        lat, ref = lone_latencies_ms(max_wait_ms, lone_count)
        p50, p99 = percentile(lat, 50), percentile(lat, 99)
        early = sum(1 for value in lat if value < max_wait_ms)
        ok = early == 0 and p99 <= max_wait_ms + LONE_SLACK_MS
        verdicts.append((max_wait_ms, early, p99, ok))
        print(
            f"lone request  max_wait_ms {max_wait_ms:4.1f}  latency P50 {p50:.3f} ms  "
            f"P99 {p99:.3f} ms  max {max(lat):.3f} ms  overshoot P50 "
            f"{(p50 - max_wait_ms) * 1e3:+.0f} µs  {len(lat)} requests, {early} early"
        )
        ref50, ref99 = percentile(ref, 50), percentile(ref, 99)
        print(
            f"bare timed wait  {max_wait_ms:4.1f} ms     latency P50 {ref50:.3f} ms  "
            f"P99 {ref99:.3f} ms  max {max(ref):.3f} ms  overshoot P50 "
            f"{(ref50 - max_wait_ms) * 1e3:+.0f} µs  (batcher/bare P50 {p50 / ref50:.3f}, "
            f"P99 {p99 / ref99:.3f})"
        )
    print("# goal")
    for max_wait_ms, early, p99, ok in verdicts:
        print(
            f"lone request at max_wait_ms {max_wait_ms:g}: never early ({early} early) and "
            f"P99 <= {max_wait_ms + LONE_SLACK_MS:g} ms ({p99:.3f} ms) "
            f"{'PASS' if ok else 'MISS'}"
        )
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
