"""Dynamic batching and an instance pool for the reference pipeline: plain threads, no torch.

:class:`DynamicBatcher` gathers requests submitted from many caller threads into batches run by
``workers`` threads, one per model instance. A batch closes when it holds ``max_batch_size``
requests or when its OLDEST request has waited ``max_wait_ms`` (Triton's
``max_queue_delay_microseconds``), whichever comes first. The queue is bounded: a full queue
sheds load with :class:`Overloaded` instead of letting latency grow without limit (Triton's
``max_queue_size``).

:class:`InstancePool` is the other mode (batching off): each request runs on its caller's thread
on one of N instances, waiting in strict FIFO order for a free one.

Both record the wait as the request's ``queue`` stage (:mod:`optlab.metrics.stages`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar, cast

from optlab.errors import OptlabError
from optlab.load.timerslack import tighten_timer_slack
from optlab.metrics.stages import RequestTiming, current_request

__all__ = ["BatcherClosed", "DynamicBatcher", "InstancePool", "Overloaded", "QUEUE_STAGE"]

T = TypeVar("T")
R = TypeVar("R")
E = TypeVar("E")

QUEUE_STAGE = "queue"
# Idle workers wake this often to notice an interpreter shutting down without close() (their
# threads are non-daemon, so otherwise they would hold the process open forever).
IDLE_POLL_S = 0.25


class Overloaded(OptlabError):
    """The batcher's queue is full: the request was shed, not queued."""


class BatcherClosed(OptlabError):
    """A request was submitted after close(), or close() gave up on it."""


class _Pending(Generic[T, R]):
    """One submitted request: its item, its timing, and a lock its caller blocks on."""

    __slots__ = ("done", "enqueued_ns", "error", "item", "result", "timing")

    def __init__(self, item: T, timing: RequestTiming) -> None:
        self.item = item
        self.timing = timing
        self.enqueued_ns = 0
        self.result: R | None = None
        self.error: BaseException | None = None
        # A bare lock, acquired here and released by the worker, is the cheapest one-shot
        # future CPython has (concurrent.futures.Future builds a Condition per request).
        self.done = threading.Lock()
        self.done.acquire()


class DynamicBatcher(Generic[T, R]):
    """Collect submitted items into batches and run them on ``workers`` threads.

    ``run_batch(worker, items, timings)`` is called on worker thread ``worker`` (0 ..
    ``workers - 1``, so each worker can own one model instance) with the batch's items in
    arrival order and their :class:`RequestTiming` objects (the callers' current requests, or
    throwaways outside the harness), for ``stage("infer", requests=timings)``. It must return
    one result per item, in the same order. If it raises, or returns the wrong number of
    results, every request of that batch (and no other) gets the exception.

    The worker threads start here and are non-daemon: call :meth:`close` (it drains and joins).
    """

    def __init__(
        self,
        run_batch: Callable[[int, list[T], list[RequestTiming]], Sequence[R]],
        *,
        max_batch_size: int,
        max_wait_ms: float,
        max_queue: int,
        workers: int = 1,
        name: str = "batcher",
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, not {max_batch_size}")
        if max_wait_ms < 0:
            raise ValueError(f"max_wait_ms must not be negative, not {max_wait_ms}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, not {max_queue}")
        if workers < 1:
            raise ValueError(f"workers must be at least 1, not {workers}")
        self._run_batch = run_batch
        self._max_batch = max_batch_size
        self._max_wait_ns = int(max_wait_ms * 1_000_000)
        self._max_queue = max_queue
        self.name = name
        # One Condition guards the queue, the closed flag and the counters: a submit takes
        # one uncontended lock, and notifies only when a worker could act on it.
        self._cond = threading.Condition(threading.Lock())
        self._queue: deque[_Pending[T, R]] = deque()
        self._closed = False
        self._batch_sizes: dict[int, int] = {}
        self._rejected = 0
        self._max_depth = 0
        self._threads = [
            threading.Thread(target=self._work, args=(i,), name=f"{name}-{i}", daemon=False)
            for i in range(workers)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def closed(self) -> bool:
        """True once close() has begun (or the interpreter is shutting down)."""
        return self._closed

    # -- callers ------------------------------------------------------------------------------
    def submit(self, item: T) -> R:
        """Queue ``item``, block until its batch has run, and return its result (or raise)."""
        timing = current_request()
        pending: _Pending[T, R] = _Pending(item, RequestTiming() if timing is None else timing)
        cond, queue = self._cond, self._queue
        with cond:
            if self._closed:
                raise BatcherClosed(
                    f"{self.name}: submit after close()",
                    hint="close the batcher only after the last request was submitted",
                )
            depth = len(queue)
            if depth >= self._max_queue:
                self._rejected += 1
                raise Overloaded(
                    f"{self.name}: the queue is full ({self._max_queue} requests waiting); "
                    "the request was shed",
                    hint="raise batching.max_queue or lower the load",
                )
            pending.enqueued_ns = time.perf_counter_ns()
            queue.append(pending)
            depth += 1
            if depth > self._max_depth:
                self._max_depth = depth
            # A worker needs waking only when the queue stops being empty (it may be idle) or
            # a batch is full (it is waiting on the deadline); otherwise its deadline wakes it.
            if depth == 1 or depth >= self._max_batch:
                cond.notify()
        pending.done.acquire()
        if pending.error is not None:
            raise pending.error
        return cast(R, pending.result)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop accepting requests, run everything already queued, and join the workers.

        Idempotent. If a worker is still inside ``run_batch`` after ``timeout_s``, the
        requests still queued are failed with :class:`BatcherClosed` (so no caller waits
        forever) and an :class:`OptlabError` is raised; calling close() again joins again.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = [t.name for t in self._threads if t.is_alive()]
        if not stuck:
            return
        with self._cond:
            abandoned = list(self._queue)
            self._queue.clear()
        for pending in abandoned:
            pending.error = BatcherClosed(
                f"{self.name}: closed before this request ran",
                hint="a batch did not finish within close()'s timeout",
            )
            pending.done.release()
        raise OptlabError(
            f"{self.name}: {', '.join(stuck)} still inside run_batch after {timeout_s:g} s; "
            f"{len(abandoned)} queued requests were failed",
            hint="run_batch did not return: look for a hung engine call, or give close() "
            "a longer timeout",
        )

    # -- metrics ------------------------------------------------------------------------------
    def batch_sizes(self) -> dict[int, int]:
        """How many batches of each size ran since the last reset_metrics()."""
        with self._cond:
            return dict(sorted(self._batch_sizes.items()))

    def reset_metrics(self) -> None:
        with self._cond:
            self._batch_sizes = {}
            self._rejected = 0
            self._max_depth = len(self._queue)

    def metrics(self) -> dict[str, Any]:
        with self._cond:
            sizes = dict(sorted(self._batch_sizes.items()))
            rejected, depth = self._rejected, self._max_depth
        batches = sum(sizes.values())
        requests = sum(size * count for size, count in sizes.items())
        return {
            "batches": batches,
            "requests": requests,
            "mean_batch_size": requests / batches if batches else None,
            # The configured limit: mean / max is how full batches ran. The wait for a batch
            # to close is each request's `queue` stage, not counted twice here.
            "max_batch_size": self._max_batch,
            "batch_sizes": sizes,
            "rejected": rejected,
            "max_queue_depth_seen": depth,
        }

    # -- workers ------------------------------------------------------------------------------
    def _next_batch(self) -> list[_Pending[T, R]] | None:
        """Block until a batch closes and take it; None when closed and drained."""
        cond, queue, clock = self._cond, self._queue, time.perf_counter_ns
        max_batch, max_wait_ns = self._max_batch, self._max_wait_ns
        with cond:
            while True:
                while not queue:
                    if self._closed:
                        return None
                    cond.wait(IDLE_POLL_S)
                    if not queue and not threading.main_thread().is_alive():
                        # The interpreter is exiting and nobody closed us: refuse new work
                        # (a later submit must not wait on workers that are gone) and stop.
                        self._closed = True
                        cond.notify_all()
                        return None
                # Wait for a full batch or the oldest request's deadline. The head may change
                # under us (another worker took a batch), so the deadline is re-read each time.
                while queue and len(queue) < max_batch and not self._closed:
                    remaining = queue[0].enqueued_ns + max_wait_ns - clock()
                    if remaining <= 0:
                        break
                    cond.wait(remaining / 1e9)
                if queue:
                    break
            take = min(len(queue), max_batch)
            batch = [queue.popleft() for _ in range(take)]
            self._batch_sizes[take] = self._batch_sizes.get(take, 0) + 1
            if queue:
                cond.notify()  # more is waiting: let an idle worker start on it
            return batch

    def _work(self, index: int) -> None:
        tighten_timer_slack()
        run_batch, clock = self._run_batch, time.perf_counter_ns
        while (batch := self._next_batch()) is not None:
            started = clock()
            items: list[T] = []
            timings: list[RequestTiming] = []
            for pending in batch:
                pending.timing.add(QUEUE_STAGE, started - pending.enqueued_ns)
                items.append(pending.item)
                timings.append(pending.timing)
            try:
                results = run_batch(index, items, timings)
                if len(results) != len(batch):
                    raise OptlabError(
                        f"{self.name}: run_batch returned {len(results)} results for a batch "
                        f"of {len(batch)}",
                        hint="run_batch must return exactly one result per item, in order",
                    )
            # BaseException too: whatever escapes run_batch belongs to its callers, and a dead
            # worker would leave every later request waiting forever.
            except BaseException as exc:
                for pending in batch:
                    pending.error = exc
                    pending.done.release()
            else:
                for pending, result in zip(batch, results, strict=True):
                    pending.result = result
                    pending.done.release()


class _Waiter:
    __slots__ = ("granted", "index")

    def __init__(self) -> None:
        self.granted = threading.Lock()
        self.granted.acquire()
        self.index = -1


class InstancePool(Generic[E]):
    """N instances (engines) shared by caller threads, one request per instance at a time.

    Waiters are served in strict arrival order: a released instance is handed directly to the
    oldest waiter, so a newcomer can never take it first (a plain Condition would let it, and
    put the woken waiter back at the end of the line).
    """

    def __init__(self, instances: Sequence[E]) -> None:
        if not instances:
            raise ValueError("an InstancePool needs at least one instance")
        self._instances = list(instances)
        self._lock = threading.Lock()
        # A stack: the most recently used instance is reused first (its caches are warm).
        self._free = list(range(len(self._instances) - 1, -1, -1))
        self._waiters: deque[_Waiter] = deque()
        self._served = [0] * len(self._instances)
        self._waited = 0
        self._max_waiters = 0

    def __len__(self) -> int:
        return len(self._instances)

    @contextmanager
    def acquire(self) -> Iterator[E]:
        """Wait for a free instance and hold it for the block; the wait is the queue stage."""
        clock = time.perf_counter_ns
        start = clock()
        waiter: _Waiter | None = None
        with self._lock:
            if self._free and not self._waiters:
                index = self._free.pop()
            else:
                waiter = _Waiter()
                self._waiters.append(waiter)
                self._waited += 1
                if len(self._waiters) > self._max_waiters:
                    self._max_waiters = len(self._waiters)
        if waiter is not None:
            try:
                waiter.granted.acquire()
            except BaseException:
                # Interrupted while waiting (KeyboardInterrupt): leave the line, or pass on the
                # instance if it was handed over meanwhile, so that it is never lost.
                with self._lock:
                    if waiter.index < 0:
                        self._waiters.remove(waiter)
                        raise
                self._release(waiter.index, count=False)
                raise
            index = waiter.index
        timing = current_request()
        if timing is not None:
            timing.add(QUEUE_STAGE, clock() - start)
        try:
            yield self._instances[index]
        finally:
            self._release(index, count=True)

    def _release(self, index: int, *, count: bool) -> None:
        with self._lock:
            if count:
                self._served[index] += 1
            if self._waiters:
                nxt = self._waiters.popleft()
                nxt.index = index
                nxt.granted.release()
            else:
                self._free.append(index)

    def metrics(self) -> dict[str, Any]:
        with self._lock:
            served = list(self._served)
            return {
                "instances": len(self._instances),
                "requests": sum(served),
                "requests_per_instance": served,
                "waited": self._waited,
                "waiting": len(self._waiters),
                "max_waiters_seen": self._max_waiters,
            }

    def reset_metrics(self) -> None:
        with self._lock:
            self._served = [0] * len(self._instances)
            self._waited = 0
            self._max_waiters = len(self._waiters)
