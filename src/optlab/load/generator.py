"""The threaded load generator: drives a thread-safe target callable and records every request.

Closed loop: ``concurrency`` threads, each sending its next request as soon as the last one
returned. Its latency is measured from the actual send, so it is labelled closed loop: a stall
holds the clients back and hides itself (coordinated omission).

Open loop (constant or Poisson arrivals) and trace replay: a pool of worker threads. One idle
worker at a time takes the next INTENDED send time from the schedule, waits for it, hands that
role to the next idle worker and calls the target. Latency is measured from the intended time,
as wrk2 does, so a request that could not leave on time (every worker busy, the GIL held) is
charged for its wait, and requests that arrive during a stall are still sent on time by idle
workers and wait inside the target, where their latency includes the stall.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optlab.config.models import ClosedLoad, OpenLoad, ReplayLoad, in_flight_limit
from optlab.errors import ConfigError
from optlab.load.base import LATE_NS, START_LEAD_NS, StopReport
from optlab.load.counters import WorkerCounters, describe_error, mark_returned, sweep_timeouts
from optlab.load.schedules import indexed_trace, make_schedule
from optlab.load.timerslack import SPIN_NS, tighten_timer_slack
from optlab.metrics.stages import CURRENT, RequestTiming

if TYPE_CHECKING:
    from optlab.metrics.log import Collector, WorkerLog

__all__ = ["ThreadLoadGenerator"]

MAX_LOGS = 4
WATCH_S = 0.1  # how often calls are checked for hanging past the timeout


class ThreadLoadGenerator:
    """Drive ``call`` with ``requests`` under a closed, open or replayed load.

    Requests are used round robin. In a replay, a trace id that is an integer picks
    ``requests[id % len(requests)]``; entries without an id take the next one round robin.
    """

    def __init__(
        self,
        call: Callable[[Any], Any],
        requests: Sequence[Any],
        load: ClosedLoad | OpenLoad | ReplayLoad,
        *,
        timeout_s: float,
        seed: int = 0,
        trace_dir: Path | None = None,
    ) -> None:
        if not requests:
            raise ConfigError(
                "the target has no requests to send",
                hint="the target's inputs(workload) must return at least one request",
            )
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive, got {timeout_s}")
        self._call = call
        self._requests = list(requests)
        self._load = load
        self._timeout_ns = round(timeout_s * 1e9)
        self._seed = seed
        self._trace: list[tuple[int, int | None]] | None = None
        if isinstance(load, ReplayLoad):
            self._trace = indexed_trace(load, trace_dir, len(self._requests))
        self._threads: list[threading.Thread] = []
        self._counters: list[WorkerCounters] = []
        # Only the thread holding this takes from the schedule (generators are not
        # thread-safe) and waits for the next intended time; see _open_worker.
        self._leader = threading.Lock()
        self._schedule: Iterator[tuple[int, int]] | None = None
        self._round_robin = itertools.count()
        # Held by the generator while it runs; released by stop(). The open loop's leader
        # waits for the next intended time on it with a timeout, so stop() wakes it at once
        # (a 1 req/s schedule must not delay stop by a second); waiting on a Lock is one C
        # call, where Event.wait builds a Condition per wait.
        self._stop_lock = threading.Lock()
        self._signal_lock = threading.Lock()
        # Workers wait here until every thread exists. Each passes the lock on as it leaves,
        # so they wake one after another: an Event would wake all of them at once, and with
        # hundreds of threads the herd fighting over the GIL made the first requests ~20 ms late.
        self._gate = threading.Lock()
        self._running = False
        self._stop_signalled = False
        self._closed = False
        self._started = False
        self._t0 = 0
        self._failure: BaseException | None = None
        self._report: StopReport | None = None
        self._watchdog: threading.Thread | None = None

    # -- public API ---------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """Requests sent and not yet returned."""
        return sum(c.issued - c.completed for c in self._counters)

    @property
    def issued(self) -> int:
        """Requests sent so far."""
        return sum(c.issued for c in self._counters)

    @property
    def failure(self) -> BaseException | None:
        """A BaseException (KeyboardInterrupt, SystemExit, a harness bug) that stopped the
        generator; poll it while the load runs. Target exceptions are recorded, never here."""
        return self._failure

    @property
    def open_loop(self) -> bool:
        return not isinstance(self._load, ClosedLoad)

    @property
    def t0_ns(self) -> int:
        """``perf_counter_ns`` of the schedule's time zero: intended send i is t0_ns + offset i.
        0 before start()."""
        return self._t0

    def start(self, collector: Collector) -> None:
        """Start the worker threads and return. Time zero of the schedule is taken once every
        thread exists, so thread creation does not make the first requests late."""
        if self._started:
            raise RuntimeError("a ThreadLoadGenerator can be started once")
        self._started = True
        load = self._load
        if isinstance(load, ClosedLoad):
            workers, body = load.concurrency, self._closed_worker
        else:
            self._schedule = make_schedule(load, len(self._requests), self._seed, self._trace)
            workers = in_flight_limit(load)
            body = self._open_worker
        self._stop_lock.acquire()
        self._gate.acquire()
        self._running = True
        # Workers share a few logs (WorkerLog.record takes the log's lock, so sharing is
        # safe): the collector's drain costs time per log while holding the GIL, and with a
        # log per thread, 512 open-loop threads made every drain delay sends by milliseconds.
        logs = [collector.new_log() for _ in range(min(workers, MAX_LOGS))]
        try:
            for i in range(workers):
                counters = WorkerCounters(logs[i % len(logs)])
                thread = threading.Thread(
                    target=self._run,
                    args=(body, counters, counters.log),
                    name=f"optlab-load-{i}",
                    daemon=True,  # a target stuck forever must not keep the process alive
                )
                thread.start()  # RuntimeError when the OS refuses another thread
                self._counters.append(counters)
                self._threads.append(thread)
        except BaseException:
            # Let the threads already started through the gate to see the stop and exit.
            self._signal_stop()
            self._gate.release()
            raise
        self._t0 = time.perf_counter_ns() + START_LEAD_NS
        self._gate.release()
        self._watchdog = threading.Thread(
            target=self._watch, name="optlab-load-watchdog", daemon=True
        )
        self._watchdog.start()

    def stop(self, drain_timeout_s: float = 5.0) -> StopReport:
        """Stop issuing; wait up to ``drain_timeout_s`` for requests in flight to return.

        Never raises for what happened inside a worker: a failure is reported in the
        StopReport (and `failure`), so the caller can still store what was measured.
        """
        if self._report is not None:
            return self._report
        if not self._started:
            raise RuntimeError("stop() before start()")
        self._signal_stop()
        deadline = time.monotonic() + max(0.0, drain_timeout_s)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._watchdog is not None:
            self._watchdog.join()
        # A call still hung past the timeout now is a timeout too, not a request that vanished.
        sweep_timeouts(self._counters, self._timeout_ns)
        # From here on, requests that return are not recorded: the caller is about to close
        # the collector. A worker between this check and its record() can still slip one in.
        self._closed = True
        issued = sum(c.issued for c in self._counters)
        completed = sum(c.completed for c in self._counters)
        late = sum(c.late for c in self._counters)
        self._report = StopReport.of(
            issued, completed, late, open_loop=self.open_loop, failure=self._failure
        )
        return self._report

    # -- stopping -----------------------------------------------------------------------------
    def _signal_stop(self) -> None:
        with self._signal_lock:
            self._running = False
            if not self._stop_signalled:
                self._stop_signalled = True
                self._stop_lock.release()

    def _run(
        self,
        body: Callable[[WorkerCounters, WorkerLog], None],
        counters: WorkerCounters,
        log: WorkerLog,
    ) -> None:
        try:
            tighten_timer_slack()
            self._gate.acquire()
            self._gate.release()
            body(counters, log)
        except BaseException as exc:
            # KeyboardInterrupt or SystemExit raised by the target, or a bug in the harness:
            # stop everything and keep it for the caller (`failure`, StopReport.failure),
            # which fails the run with it. Not re-raised: a raw thread traceback on the
            # terminal, on top of the run's own report, only hides it.
            with self._signal_lock:
                if self._failure is None:
                    self._failure = exc
            self._signal_stop()

    # -- hung calls ----------------------------------------------------------------------------
    def _watch(self) -> None:
        """Count calls that have not returned within the timeout as timeouts while they hang.

        A synchronous Python call cannot be cancelled, so without this a request that never
        returns would be neither an error nor a latency, and a run whose every call hangs
        would report 0 errors.
        """
        period = min(WATCH_S, self._timeout_ns / 4e9)
        while not self._stop_lock.acquire(timeout=period):
            sweep_timeouts(self._counters, self._timeout_ns)
        self._stop_lock.release()  # pass the wake-up on

    # -- workers: the hot path; locals everywhere because attribute lookups cost per request --
    def _closed_worker(self, counters: WorkerCounters, log: WorkerLog) -> None:
        call, requests, n = self._call, self._requests, len(self._requests)
        round_robin = self._round_robin
        record, clock, timeout_ns = log.record, time.perf_counter_ns, self._timeout_ns
        set_current, new_timing, returned = CURRENT.set, RequestTiming, mark_returned
        while self._running:
            request = requests[next(round_robin) % n]
            timing = new_timing()
            # This thread's context belongs to the generator and the next request overwrites
            # it, so no reset is needed: one contextvar call per request, not two.
            set_current(timing)
            counters.issued += 1
            start = clock()
            counters.origin = counters.call_start = start
            try:
                call(request)
            except Exception as exc:
                end = clock()
                error: str | None = type(exc).__name__
                message: str | None = describe_error(exc)
            else:
                end = clock()
                error = message = None
                if end - start > timeout_ns:
                    # A synchronous Python call cannot be cancelled: the timeout is judged
                    # when the call returns (or by the watchdog while it hangs).
                    error, message = "timeout", self._timeout_message(end - start)
            unrecorded = returned(counters)
            if self._closed:
                return
            counters.completed += 1
            if unrecorded:
                record(end, end - start, 0, 0, timing, error, message)

    # Leader/followers: the one thread holding `leader` takes the next intended time and
    # waits for it; idle threads queue on the lock. Releasing it at dispatch promotes a
    # follower, which arms itself for the next time while this thread is inside the target.
    # A thread back from a fast target usually takes the lock again before a follower has
    # even woken, so at high rates with a fast target one thread does the work without a
    # context switch per request. One function: a call per request would cost on the hot path.
    def _open_worker(self, counters: WorkerCounters, log: WorkerLog) -> None:
        call, requests, leader = self._call, self._requests, self._leader
        record, clock, timeout_ns = log.record, time.perf_counter_ns, self._timeout_ns
        set_current, new_timing, returned = CURRENT.set, RequestTiming, mark_returned
        stop_lock, sleep, t0 = self._stop_lock, time.sleep, self._t0
        schedule = self._schedule
        assert schedule is not None
        while True:
            leader.acquire()
            try:
                if not self._running:
                    return
                offset, index = next(schedule)
                intended = t0 + offset
                now = clock()
                if intended - now > SPIN_NS:
                    if stop_lock.acquire(timeout=(intended - now - SPIN_NS) / 1e9):
                        stop_lock.release()  # pass the wake-up on
                        return
                    now = clock()
                while now < intended:
                    sleep(0)
                    now = clock()
                if not self._running:
                    return  # stopped while spinning: not sent
            finally:
                leader.release()
            # Late only when no thread was idle (or the GIL was held): the lag says so.
            send_lag = now - intended
            if send_lag > LATE_NS:
                counters.late += 1
            request = requests[index]
            timing = new_timing()
            set_current(timing)
            counters.issued += 1
            start = clock()
            counters.origin, counters.call_start = intended, start
            try:
                call(request)
            except Exception as exc:
                end = clock()
                error: str | None = type(exc).__name__
                message: str | None = describe_error(exc)
            else:
                end = clock()
                error = message = None
                if end - start > timeout_ns:
                    # Judged from the actual send: the target's time, not the generator's.
                    error, message = "timeout", self._timeout_message(end - start)
            unrecorded = returned(counters)
            if self._closed:
                return
            counters.completed += 1
            if unrecorded:
                # Latency from the INTENDED send time: the coordinated-omission correction.
                record(end, end - intended, send_lag, start - intended, timing, error, message)

    def _timeout_message(self, elapsed_ns: int) -> str:
        return (
            f"returned after {elapsed_ns / 1e6:.1f} ms, over the "
            f"{self._timeout_ns / 1e6:g} ms timeout"
        )
