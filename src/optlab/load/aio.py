"""The asynchronous load generator: drives a network client from one event loop thread.

A service measured over HTTP spends its time on the other side of a socket, so one event loop
keeps thousands of requests in flight where a thread per request would fight over the GIL.
Same contract as the threaded generator (`optlab.load.base.LoadGenerator`: start, stop ->
StopReport, in_flight, failure),
same records into the same `Collector`, same latency definitions:

- closed loop: `concurrency` coroutines, each sending its next request when the last returned;
  latency from the actual send (labelled closed loop, as it hides stalls);
- open loop and replay: one scheduler coroutine takes each INTENDED send time from the schedule
  and starts the request then; latency is measured from the intended time (wrk2), and a request
  that could not leave on time (`max_in_flight` reached, the loop busy) is charged its wait and
  counted late, which is how the generator reports that it fell behind.

`share=(i, n)` makes this generator send every n-th request of the schedule starting at i (the
multi-process generator runs one per process, with one shared time zero).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from optlab.config.modes import IndexedTrace, Load, Schedule, mode_of
from optlab.errors import ConfigError
from optlab.load.base import LATE_NS, START_LEAD_NS, LogSource, StopReport
from optlab.load.timerfd import TimerFd
from optlab.metrics.stages import RequestTiming

if TYPE_CHECKING:
    from optlab.metrics.worker_log import WorkerLog

__all__ = ["AsyncClient", "AsyncLoadGenerator", "LogSource"]

# The loop's own timers sleep to the millisecond (epoll's timeout): the last stretch before an
# intended time is spun with sleep(0), which still serves every ready socket on each turn but
# keeps a core busy. On Linux a timerfd the loop watches wakes it TAIL_NS before the intended
# time instead: at 500 requests/s this spent ~0.2 ms of CPU per request where spinning LOOP_SPIN_NS
# spent ~1 ms, with the same send-lag median (2-5 µs) on a shared 2-core VM.
LOOP_SPIN_NS = 1_500_000
TAIL_NS = 100_000  # spun after the timerfd's wake-up: its median lateness was ~40-65 µs here
# A scheduler whose sends are all overdue yields to the loop this often, so responses are read.
YIELD_EVERY = 16
OPEN_TIMEOUT_S = 60.0


class AsyncClient(Protocol):
    async def open(self) -> None: ...

    async def send(self, index: int, timing: RequestTiming) -> None: ...

    async def close(self) -> None: ...


class AsyncLoadGenerator:
    """Drive `client` with request indices 0..n-1 under a closed, open or replayed load."""

    def __init__(
        self,
        client: AsyncClient,
        n_requests: int,
        load: Load,
        *,
        classify: Callable[[BaseException], tuple[str, str]],
        timeout_s: float,
        seed: int = 0,
        trace_dir: Path | None = None,
        share: tuple[int, int] = (0, 1),
    ) -> None:
        if n_requests < 1:
            raise ConfigError(
                "the target has no requests to send",
                hint="workload.inputs must give at least one request body",
            )
        index, count = share
        if not 0 <= index < count:
            raise ValueError(f"share {share} is not (i, n) with 0 <= i < n")
        self._client = client
        self._n = n_requests
        self._load = load
        self._classify = classify
        self._timeout_ns = round(timeout_s * 1e9)
        self._seed = seed
        self._share = share
        self._mode = mode_of(load)
        self._trace: IndexedTrace | None = self._mode.indexed_trace(load, trace_dir, n_requests)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop_requested: asyncio.Event | None = None
        self._sleeper: asyncio.Future[None] | None = None
        self._timer: TimerFd | None = None
        self._drain_s = 5.0
        self._running = False
        self._closed = False
        self._started = False
        self._t0 = 0
        self.issued = 0
        self.completed = 0
        self.late = 0
        self._failure: BaseException | None = None
        self._report: StopReport | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        # Closed-loop clients take the requests round robin; with n processes, this process
        # takes every n-th one, so together they cycle through all of them.
        self._position = itertools.count(share[0], share[1])

    # -- public API -----------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        return self.issued - self.completed

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    @property
    def open_loop(self) -> bool:
        return self._mode.open_loop

    @property
    def t0_ns(self) -> int:
        return self._t0

    def start(self, logs: LogSource, t0_ns: int | None = None) -> None:
        """Open the client, start the loop thread and return once the load is under way.

        `t0_ns` (perf_counter_ns) is the schedule's time zero, for generators in several
        processes sharing one schedule; by default it is a moment after the client is open.
        Raises what opening the client raised.
        """
        if self._started or self._report is not None:
            raise RuntimeError("an AsyncLoadGenerator can be started once, before its stop()")
        self._started = True
        log = logs.new_log()
        self._thread = threading.Thread(
            target=self._thread_main, args=(log, t0_ns), name="optlab-load-aio", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(OPEN_TIMEOUT_S + 5):
            raise RuntimeError("the load generator's event loop did not start")
        if self._failure is not None:
            failure, self._failure = self._failure, None
            self._thread.join(5)
            raise failure

    def stop(self, drain_timeout_s: float = 5.0) -> StopReport:
        """Stop issuing, wait up to `drain_timeout_s` for requests in flight, close the client."""
        if self._report is not None:
            return self._report
        if not self._started:  # a Ctrl-C between building and starting: nothing was sent
            self._report = StopReport.of(0, 0, 0, open_loop=self.open_loop, failure=None)
            return self._report
        self._drain_s = max(0.0, drain_timeout_s)
        loop, thread = self._loop, self._thread
        if loop is not None and thread is not None and thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed on its own (a failure)
                loop.call_soon_threadsafe(self._request_stop)
            thread.join(self._drain_s + 10)
        self._closed = True
        self._report = StopReport.of(
            self.issued, self.completed, self.late, open_loop=self.open_loop, failure=self._failure
        )
        return self._report

    # -- the loop thread ------------------------------------------------------------------------
    def _thread_main(self, log: WorkerLog, t0_ns: int | None) -> None:
        loop = _new_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._main(log, t0_ns))
        except BaseException as exc:
            if self._failure is None:
                self._failure = exc
        finally:
            self._ready.set()  # a failure before the load started must not leave start() waiting
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _main(self, log: WorkerLog, t0_ns: int | None) -> None:
        self._stop_requested = asyncio.Event()
        await asyncio.wait_for(self._client.open(), OPEN_TIMEOUT_S)
        try:
            self._t0 = t0_ns if t0_ns is not None else time.perf_counter_ns() + START_LEAD_NS
            self._running = True
            load, mode = self._load, self._mode
            # Requests in flight at most: the closed loop's clients (this process deals itself
            # every n-th one), or the open loop's limit in each process.
            limit = mode.in_flight_limit(load)
            workers: list[asyncio.Task[None]]
            schedule = mode.schedule(load, self._n, self._seed, self._trace)
            if schedule is None:
                index, count = self._share
                clients = len(range(index, limit, count))
                workers = [asyncio.create_task(self._closed_worker(log)) for _ in range(clients)]
            else:
                self._timer = TimerFd.open(asyncio.get_running_loop())
                workers = [asyncio.create_task(self._scheduler(schedule, log, limit))]
            self._ready.set()
            stopper = asyncio.create_task(self._stop_requested.wait())
            running: set[asyncio.Task[None]] = set(workers)
            # Until stop() (or a worker's failure): not until every worker has returned, which
            # after stop() may take a slow request's whole timeout; the drain bounds that.
            while not stopper.done():
                done, _ = await asyncio.wait(
                    {stopper, *running}, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done - {stopper}:
                    failure = task.exception()
                    if failure is not None:
                        raise failure
                running -= done
            self._running = False
            pending = {t for t in (*workers, *self._in_flight) if not t.done()}
            if pending:
                await asyncio.wait(pending, timeout=self._drain_s)
            self._closed = True
            for task in (*workers, *self._in_flight):
                task.cancel()
            await asyncio.gather(*workers, *self._in_flight, return_exceptions=True)
        finally:
            self._running = False
            self._closed = True
            if self._timer is not None:
                self._timer.close()
                self._timer = None
            await self._client.close()

    def _request_stop(self) -> None:
        self._running = False
        if self._stop_requested is not None:
            self._stop_requested.set()
        sleeper = self._sleeper
        if sleeper is not None and not sleeper.done():
            sleeper.set_result(None)

    async def _sleep_until(self, intended: int) -> None:
        """Sleep until `intended` (woken at once by stop): on the timerfd where there is one,
        else by the loop's timer to ~LOOP_SPIN_NS before it, then spinning."""
        clock = time.perf_counter_ns
        timer = self._timer
        if timer is not None:
            if intended - clock() > TAIL_NS:
                sleeper = self._sleeper = asyncio.get_running_loop().create_future()
                timer.arm(intended - TAIL_NS, sleeper)
                try:
                    await sleeper
                finally:
                    self._sleeper = None
            while self._running and clock() < intended:
                await asyncio.sleep(0)
            return
        wait = intended - clock() - LOOP_SPIN_NS
        if wait > 0:
            loop = asyncio.get_running_loop()
            sleeper = self._sleeper = loop.create_future()
            handle = loop.call_later(wait / 1e9, _resolve, sleeper)
            try:
                await sleeper
            finally:
                handle.cancel()
                self._sleeper = None
        while self._running and clock() < intended:
            await asyncio.sleep(0)

    # -- workers --------------------------------------------------------------------------------
    async def _closed_worker(self, log: WorkerLog) -> None:
        send, classify, record = self._client.send, self._classify, log.record
        clock, n, position = time.perf_counter_ns, self._n, self._position
        while self._running:
            index = next(position) % n
            timing = RequestTiming()
            self.issued += 1
            start = clock()
            error = message = None
            try:
                await send(index, timing)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                error, message = classify(exc)
            end = clock()
            if self._closed:
                return
            self.completed += 1
            record(end, end - start, 0, 0, timing, error, message)

    async def _scheduler(self, whole: Schedule, log: WorkerLog, limit: int) -> None:
        first, stride = self._share
        schedule = itertools.islice(whole, first, None, stride)
        clock, t0, tasks = time.perf_counter_ns, self._t0, self._in_flight
        slot_free = asyncio.Event()
        overdue = 0
        for offset, index in schedule:
            if not self._running:
                return
            intended = t0 + offset
            if intended > clock():
                overdue = 0
                await self._sleep_until(intended)
                if not self._running:
                    return
            else:
                overdue += 1
                if overdue % YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            while len(tasks) >= limit and self._running:
                slot_free.clear()
                await slot_free.wait()
            if not self._running:
                return
            sent = clock()
            if sent - intended > LATE_NS:
                self.late += 1
            task = asyncio.create_task(self._one(index, intended, sent, log))
            tasks.add(task)
            task.add_done_callback(_finished(tasks, slot_free))

    async def _one(self, index: int, intended: int, sent: int, log: WorkerLog) -> None:
        timing = RequestTiming()
        self.issued += 1
        start = time.perf_counter_ns()
        error = message = None
        try:
            await self._client.send(index, timing)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error, message = self._classify(exc)
        end = time.perf_counter_ns()
        if self._closed:
            return
        self.completed += 1
        # Latency from the INTENDED send time: the coordinated-omission correction.
        log.record(end, end - intended, sent - intended, start - intended, timing, error, message)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _finished(
    tasks: set[asyncio.Task[None]], slot_free: asyncio.Event
) -> Callable[[asyncio.Task[None]], None]:
    def done(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        slot_free.set()

    return done


def _new_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it is installed (a faster loop, same semantics), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
