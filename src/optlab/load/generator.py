"""The threaded load generator: drives a thread-safe target callable and records every request.

Closed loop: ``concurrency`` threads, each sending its next request as soon as the last one
returned. Its latency is measured from the actual send, so it is labelled closed loop: a stall
holds the clients back and hides itself (coordinated omission).

Open loop (constant or Poisson arrivals) and trace replay: a pool of worker threads. One of
them, the leader, takes the next INTENDED send time from the schedule, waits for it and calls
the target; while calls return quickly it keeps the role and sends request after request with no
thread switch in between. Another, the deputy, sleeps on an alarm the leader moves as it goes:
when a call has run HAND_OFF_NS and the next send is due (after a slow call: as soon as the
next send is near), the deputy becomes the leader, an idle worker becomes the deputy, and the
old leader goes back to the idle workers once its call returns. So a slow call holds a send up
by HAND_OFF_NS + ALARM_SLACK_NS and a thread's wake-up at most while a worker is idle, and a
fast target costs no thread wake-up per request. Latency is measured from the intended time,
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

from optlab.config.modes import IndexedTrace, Load, mode_of
from optlab.errors import ConfigError
from optlab.load.base import LATE_NS, START_LEAD_NS, StopReport
from optlab.load.counters import (
    ALARM_SLACK_NS,
    HAND_OFF_NS,
    Leadership,
    WorkerCounters,
    describe_error,
    mark_returned,
    sweep_timeouts,
)
from optlab.load.timerfd import Alarm
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
        load: Load,
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
        self._mode = mode_of(load)
        self._trace: IndexedTrace | None = self._mode.indexed_trace(
            load, trace_dir, len(self._requests)
        )
        self._threads: list[threading.Thread] = []
        self._counters: list[WorkerCounters] = []
        # The open loop's roles (see _open_worker): the thread holding `seat` is the deputy;
        # only the leader takes from the schedule (generators are not thread-safe).
        self._seat = threading.Lock()
        self._lead_state = Leadership()
        self._alarm: Alarm | None = None
        self._handoffs = 0
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
    def late(self) -> int:
        """Open loop: requests sent so far more than LATE_NS after their intended time."""
        return sum(c.late for c in self._counters)

    @property
    def handoffs(self) -> int:
        """Open loop: how often the leader's role passed to another thread (once at the start,
        then once per call that ran too long while a send was due)."""
        return self._handoffs

    @property
    def failure(self) -> BaseException | None:
        """A BaseException (KeyboardInterrupt, SystemExit, a harness bug) that stopped the
        generator; poll it while the load runs. Target exceptions are recorded, never here."""
        return self._failure

    @property
    def open_loop(self) -> bool:
        return self._mode.open_loop

    @property
    def t0_ns(self) -> int:
        """``perf_counter_ns`` of the schedule's time zero: intended send i is t0_ns + offset i.
        0 before start()."""
        return self._t0

    def start(self, collector: Collector) -> None:
        """Start the worker threads and return. Time zero of the schedule is taken once every
        thread exists, so thread creation does not make the first requests late."""
        if self._started or self._report is not None:
            raise RuntimeError("a ThreadLoadGenerator can be started once, before its stop()")
        # Held from here until the stop: a Ctrl-C before `_started` is set leaves nothing to
        # stop, one after it finds the lock held for `_signal_stop` to release.
        self._stop_lock.acquire()
        self._started = True
        load, mode = self._load, self._mode
        # One thread per request in flight: each closed-loop client, or the open loop's pool.
        workers = mode.in_flight_limit(load)
        self._schedule = mode.schedule(load, len(self._requests), self._seed, self._trace)
        if self._schedule is None:
            body = self._closed_worker
        else:
            body = self._open_worker
            self._alarm = Alarm.open()
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
            if self._alarm is not None:
                self._alarm.close()  # no thread waits on it: none got past the stop
            raise
        try:
            self._t0 = time.perf_counter_ns() + START_LEAD_NS
            if self._schedule is not None:
                offset, index = next(self._schedule)
                lead = self._lead_state = Leadership(self._t0 + offset, index)
                if self._alarm is not None:
                    lead.alarm_at = lead.take_at() + ALARM_SLACK_NS
                    self._alarm.arm(lead.alarm_at)
        except BaseException:  # a Ctrl-C here: the threads, let through, see the stop
            self._signal_stop()
            raise
        finally:
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
        if not self._started:  # a Ctrl-C between building and starting: nothing was sent
            self._report = StopReport.of(0, 0, 0, open_loop=self.open_loop, failure=None)
            return self._report
        self._signal_stop()
        deadline = time.monotonic() + max(0.0, drain_timeout_s)
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if self._watchdog is not None:
            self._watchdog.join()
        if self._alarm is not None and not any(t.is_alive() for t in self._threads):
            # Left open while a thread lives: closed, its number could be reused by another
            # file that the thread, back from its call, would then re-arm.
            self._alarm.close()
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
                if self._alarm is not None:
                    self._alarm.fire()  # wake the deputy

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

    # Leader, deputy, queue. The leader sends one request after another itself, calling the
    # target in between: with a fast target no thread switch happens per request. The deputy
    # (the thread holding `seat`) sleeps until the leader's call has run too long
    # (Leadership.take_at), then takes the role and frees the seat for a queued thread; the
    # old leader finishes its request and queues. Functions of their own, but no call per
    # request: the loops inside them are the hot path.
    def _open_worker(self, counters: WorkerCounters, log: WorkerLog) -> None:
        seat = self._seat
        while True:
            seat.acquire()
            if not (self._running and self._deputize()):
                seat.release()
                return
            # _lead frees the seat, for the next deputy, as its first call begins: after a slow
            # call, that deputy then finds the call under way and takes over without sleeping,
            # one thread woken per request, no more than a hand-off per request costs.
            if not self._lead(counters, log):
                if self._alarm is not None:
                    # Stopping: its last arm may have replaced stop()'s wake-up of the deputy.
                    self._alarm.fire()
                return

    def _deputize(self) -> bool:
        """Sleep until the leader's call holds up the schedule, then take its role (True).
        False when the generator stops."""
        lead, clock, alarm = self._lead_state, time.perf_counter_ns, self._alarm
        take = lead.baton.pop
        while self._running:
            now = clock()
            busy_since = lead.busy_since
            if busy_since and now >= max(lead.due - SPIN_NS, busy_since + lead.patience):
                try:
                    take()  # the leader back from its call, or this thread: never both
                except IndexError:
                    pass  # it came back just now
                else:
                    self._handoffs += 1
                    lead.patience = 0  # the next call is likely slow too
                    return True
            if alarm is not None:
                alarm.wait()  # the leader keeps it at Leadership.take_at; stop() rings it
                continue
            # No alarm: poll, at the alarm's slack at most, the earliest time a take-over can
            # be due (a leader between calls is due for nothing before its next call has run).
            wake = lead.take_at() if busy_since else max(lead.due, now) + HAND_OFF_NS
            if self._stop_lock.acquire(timeout=max(wake - now, ALARM_SLACK_NS) / 1e9):
                self._stop_lock.release()  # pass the wake-up on
                return False
        return False

    def _lead(self, counters: WorkerCounters, log: WorkerLog) -> bool:
        """Send on schedule until the deputy takes the role during a call (True: this thread
        queues again) or the generator stops (False)."""
        call, requests = self._call, self._requests
        record, clock, timeout_ns = log.record, time.perf_counter_ns, self._timeout_ns
        set_current, new_timing, returned = CURRENT.set, RequestTiming, mark_returned
        stop_lock, sleep, t0 = self._stop_lock, time.sleep, self._t0
        lead, schedule, alarm = self._lead_state, self._schedule, self._alarm
        assert schedule is not None
        hold, give = lead.baton.append, lead.baton.remove
        seat, seated = self._seat, True
        try:
            while True:
                intended, index = lead.due, lead.index
                now = clock()
                if intended - now > SPIN_NS:
                    if stop_lock.acquire(timeout=(intended - now - SPIN_NS) / 1e9):
                        stop_lock.release()  # pass the wake-up on
                        return False
                    now = clock()
                while now < intended:
                    sleep(0)
                    now = clock()
                if not self._running:
                    return False  # stopped while waiting: not sent
                # The next send time is published before the call: the deputy goes by it.
                offset, lead.index = next(schedule)
                lead.due = t0 + offset
                # Late only when no thread was free to send (or the GIL was held): the lag says so.
                send_lag = now - intended
                if send_lag > LATE_NS:
                    counters.late += 1
                request = requests[index]
                timing = new_timing()
                set_current(timing)
                counters.issued += 1
                start = clock()
                counters.origin, counters.call_start = intended, start
                lead.busy_since = start
                if alarm is not None:
                    patience = lead.patience
                    take_at = max(lead.due - SPIN_NS, start + patience)  # Leadership.take_at
                    slack = ALARM_SLACK_NS if patience else 0
                    # Not when the seat is freed below with the take-over already due: the
                    # deputy it wakes looks before it sleeps.
                    if not (
                        take_at <= lead.alarm_at <= take_at + slack or seated and take_at <= start
                    ):
                        lead.alarm_at = take_at + slack
                        alarm.arm(lead.alarm_at)
                hold(counters)
                if seated:
                    seat.release()
                    seated = False
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
                try:
                    give(counters)
                except ValueError:
                    deposed = True  # the deputy took the role while the call ran
                else:
                    deposed = False
                    lead.busy_since = 0
                    lead.patience = HAND_OFF_NS if end - start <= HAND_OFF_NS else 0
                    if alarm is not None and lead.due > lead.alarm_at > end:
                        # The next call starts after the alarm rings: it would wake the deputy
                        # for nothing. (Once rung, it is left: the deputy may be on its way.)
                        lead.alarm_at = 0
                        alarm.disarm()
                unrecorded = returned(counters)
                if self._closed:
                    return False
                counters.completed += 1
                if unrecorded:
                    # Latency from the INTENDED send time: the coordinated-omission correction.
                    record(end, end - intended, send_lag, start - intended, timing, error, message)
                if deposed:
                    return True
        finally:
            if seated:
                seat.release()

    def _timeout_message(self, elapsed_ns: int) -> str:
        return (
            f"returned after {elapsed_ns / 1e6:.1f} ms, over the "
            f"{self._timeout_ns / 1e6:g} ms timeout"
        )
