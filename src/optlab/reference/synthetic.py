"""A synthetic service with a known service time: the ground truth for tests and benchmarks.

With ``servers`` (or ``single_server``) set it is an exact FCFS c-server queue: under Poisson
arrivals an M/M/c, M/D/c or M/G/c queue (exponential, fixed, lognormal service) whose sojourn
law and capacity :mod:`optlab.reference.queueing` computes. Without, every caller is served at
once: no queue.

With ``max_batch_size`` set (and servers) it batches dynamically, Triton-like: one open batch
collects arrivals until it is full or, at ``max(first arrival + max_wait_ms, the earliest server
free time)``, it closes; a batch of n takes ``service_ms + per_item_ms n + per_item2_ms n^2``
ms on the server that frees first. :mod:`optlab.reference.batching` states the rule, and
simulates it for its exact latencies and capacity.

Stalls freeze the server: service time only accrues outside the stall windows
``[k * stall_every, k * stall_every + stall)`` for k = 1, 2, ... (seconds from construction),
so a request in service or waiting when a stall begins is held until it ends, like a
stop-the-world GC pause. :func:`simulate_open_loop` computes the latencies a single-server FIFO
queue with the same stalls gives, which is what an honest open-loop measurement must report.
"""

from __future__ import annotations

import collections
import heapq
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field, model_validator

from optlab.config.knobs import StrictModel
from optlab.config.validation import target_knobs
from optlab.load.timerslack import sleep_until
from optlab.metrics.stages import stage
from optlab.reference.batching import Batch, BatchQueue, batch_costs_ns

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "SyntheticKnobs",
    "SyntheticTarget",
    "build",
    "inputs",
    "queue_app",
    "simulate_open_loop",
]

DEFAULT_INPUTS = 64


class SyntheticKnobs(StrictModel):
    """Knobs of the synthetic target."""

    distribution: Literal["fixed", "lognormal", "exponential"] = "fixed"
    service_ms: float = Field(
        1.0,
        ge=0,
        le=60_000,
        description="fixed time, the lognormal median, or the exponential mean",
    )
    sigma: float = Field(0.5, ge=0, le=5, description="lognormal shape")
    single_server: bool = Field(False, description="one request at a time: servers: 1")
    servers: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="FCFS servers: requests queue when all are busy; null: no queue at all",
    )
    stall_every_s: float | None = Field(None, gt=0, description="a stall every this many s")
    stall_ms: float = Field(0.0, ge=0, description="how long each stall freezes the server")
    error_rate: float = Field(0.0, ge=0, le=1, description="fraction raising RuntimeError")
    seed: int | None = Field(
        0,
        description="the service-time draws' seed: a run replays the same draws; null: fresh "
        "draws every run (one truth, a distribution, and sampling noise between runs)",
    )
    max_batch_size: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="dynamic batching: the most requests one batch on a server takes "
        "(needs servers); null: no batching, each request served alone",
    )
    max_wait_ms: float = Field(
        0.0,
        ge=0,
        le=60_000,
        description="how long the oldest request of an open batch may wait for it to fill "
        "(while every server is busy it fills on regardless)",
    )
    per_item_ms: float = Field(
        0.0,
        ge=0,
        le=60_000,
        description="a batch of n takes service_ms + per_item_ms n + per_item2_ms n^2 "
        "(service_ms: the fixed cost per batch)",
    )
    per_item2_ms: float = Field(
        0.0,
        ge=0,
        le=60_000,
        description="the quadratic term of a batch's time: with it a server's throughput "
        "n / time(n) peaks at n = sqrt(service_ms / per_item2_ms)",
    )
    interaction: bool = Field(
        False,
        description="the planted interaction: the servers share one memory, so the quadratic "
        "term is per_item2_ms x servers and the best batch size, sqrt(service_ms / "
        "(per_item2_ms servers)), shrinks as servers grow; false: it does not depend on them",
    )

    @model_validator(mode="after")
    def _stall_shorter_than_period(self) -> SyntheticKnobs:
        if self.stall_every_s is not None and self.stall_ms >= self.stall_every_s * 1000:
            raise ValueError(
                f"stall_ms ({self.stall_ms:g}) must be shorter than stall_every_s "
                f"({self.stall_every_s:g} s): the server would never run"
            )
        return self

    @model_validator(mode="after")
    def _one_server_count(self) -> SyntheticKnobs:
        if self.single_server and self.servers not in (None, 1):
            raise ValueError(
                f"single_server: true means servers: 1, but servers is {self.servers}: "
                "set one of the two knobs"
            )
        return self

    @model_validator(mode="after")
    def _batching_knobs(self) -> SyntheticKnobs:
        if self.max_batch_size is None:
            extra = [
                name
                for name in ("max_wait_ms", "per_item_ms", "per_item2_ms", "interaction")
                if getattr(self, name)
            ]
            if extra:
                raise ValueError(
                    f"{', '.join(extra)} only shape batches: set max_batch_size with them "
                    "(max_batch_size: 1 serves each request alone)"
                )
            return self
        if self.queue_servers is None:
            raise ValueError(
                "max_batch_size batches requests onto servers, but servers is null (no "
                "queue): set servers (e.g. servers: 1) with it"
            )
        if self.stall_every_s is not None:
            raise ValueError(
                "stalls (stall_every_s) and batching (max_batch_size) are not modelled "
                "together: unset one of them"
            )
        return self

    @property
    def queue_servers(self) -> int | None:
        """How many FCFS servers the target has; None: unlimited, nobody queues."""
        return 1 if self.single_server else self.servers


def _stalled_before(t: int, every: int, stall: int) -> int:
    """Stalled ns in [0, t): stall windows start at every, 2*every, ..."""
    k = t // every
    if k < 1:
        return 0
    return (k - 1) * stall + min(stall, t - k * every)


def finish_time(start: int, service: int, every: int | None, stall: int) -> int:
    """When a request that enters service at ``start`` with ``service`` ns of work is done.

    Work progresses only outside stalls; a request whose work runs out exactly as a stall
    begins (or that needs none and arrives during one) leaves when the stall ends.
    """
    if every is None or stall <= 0:
        return start + service
    work = start - _stalled_before(start, every, stall) + service
    if work < every:
        return work
    # After the first period, each period adds (every - stall) of work after its stall.
    period, rest = divmod(work - every, every - stall)
    return (period + 1) * every + stall + rest


def simulate_open_loop(
    arrivals_ns: Sequence[int], service_ns: int, stall_every_ns: int | None, stall_ns: int
) -> npt.NDArray[np.int64]:
    """Latency of each request from its arrival in a single-server FIFO queue with stalls.

    Arrivals are ns from the server's construction (the stall clock's zero), in order.
    """
    latencies = np.empty(len(arrivals_ns), dtype=np.int64)
    free_at = -math.inf
    for i, arrival in enumerate(arrivals_ns):
        begin = int(max(arrival, free_at))
        done = finish_time(begin, service_ns, stall_every_ns, stall_ns)
        latencies[i] = done - arrival
        free_at = done
    return latencies


class SyntheticTarget:
    """callable(request) -> request after the configured service time; thread-safe.

    With a finite number of servers, each call is scheduled on arrival, under one short lock:
    it takes the server that frees first (a heap of their free times), begins when that server
    frees or at once, and is done when its service (stall-aware) runs out. The caller then
    sleeps to those instants. Threads waiting on a Lock or Semaphore are woken in no set order,
    so a queue built from one would serve out of order; scheduling at arrival makes the queue
    FCFS whatever order the threads are woken in, and a late wake-up delays only its own
    request, never the ones behind it.

    With ``max_batch_size`` set, a call joins a batch of :class:`BatchQueue` under the same
    lock, at its arrival. While its batch is open it waits on the batch's Event, set by the
    arrival that fills it, for up to the batch's T_close; then whoever takes the lock first
    closes it (at T_close, however late the thread wakes: the schedule stays the model's). The
    members then sleep to the batch's start ("queue") and done ("service"), as unbatched
    requests do. ``batch_sizes`` counts the batches closed by size.

    ``now`` and ``sleep_until`` are the clock it reads and sleeps on (``perf_counter_ns``
    and :func:`optlab.load.timerslack.sleep_until` unless given): the seam through which a
    test drives the schedule with a fake clock and reads each call's begin and done exactly.
    """

    def __init__(
        self,
        knobs: SyntheticKnobs,
        *,
        now: Callable[[], int] = time.perf_counter_ns,
        sleep_until: Callable[[int], None] = sleep_until,
    ) -> None:
        self.knobs = knobs
        self._now = now
        self._sleep_until = sleep_until
        self._t0 = now()
        self._service_ns = round(knobs.service_ms * 1e6)
        self._every_ns = None if knobs.stall_every_s is None else round(knobs.stall_every_s * 1e9)
        self._stall_ns = round(knobs.stall_ms * 1e6)
        # random.Random's methods are atomic under the GIL (lognormvariate does not use
        # gauss()'s cached state), so one generator serves every thread.
        # seed None: random.Random() seeds itself from the OS, so every run draws anew.
        self._rng = random.Random(knobs.seed) if knobs.seed is not None else random.Random()
        self._mu = math.log(knobs.service_ms) if knobs.service_ms > 0 else -math.inf
        servers = knobs.queue_servers
        # The servers' free times, ns from t0; None: unlimited servers, nobody queues.
        self._free: list[int] | None = None if servers is None else [0] * servers
        self._lock = threading.Lock()
        self._batches: BatchQueue | None = None
        # Each open batch's waiters: an Event for threads, a Future in queue_app's event loop.
        self._waiting: dict[int, threading.Event | asyncio.Future[None]] = {}
        self.batch_sizes: collections.Counter[int] = collections.Counter()
        if knobs.max_batch_size is not None:
            assert servers is not None  # the knobs refuse batching without servers
            costs = batch_costs_ns(knobs)

            def batch_ns(n: int) -> int:
                return round(costs[n] * self.batch_scale())

            self._batches = BatchQueue(
                servers,
                knobs.max_batch_size,
                round(knobs.max_wait_ms * 1e6),
                batch_ns,
                on_close=self._closed,
            )

    @property
    def t0_ns(self) -> int:
        """The clock's reading (``perf_counter_ns`` unless ``now`` was given) at
        construction: time zero of the stall clock."""
        return self._t0

    def __call__(self, request: Any) -> Any:
        if self._batches is not None:
            with stage("queue"):
                batch = self._join_batch()
                assert batch.start_ns is not None and batch.done_ns is not None
                self._sleep_until(self._t0 + batch.start_ns)
            with stage("service"):
                self._sleep_until(self._t0 + batch.done_ns)
        elif self._free is None:
            with stage("service"):
                self._serve()
        else:
            begin, done = self._schedule()
            with stage("queue"):
                self._sleep_until(self._t0 + begin)
            with stage("service"):
                self._sleep_until(self._t0 + done)
        if self.knobs.error_rate and self._rng.random() < self.knobs.error_rate:
            raise RuntimeError("synthetic error (error_rate)")
        return request

    def service_time(self) -> int:
        """One request's service time in ns: the fixed one, or a seeded draw: lognormal with
        ``service_ms`` as its median, or exponential with it as its mean."""
        if self.knobs.distribution == "fixed" or self._service_ns == 0:
            return self._service_ns
        if self.knobs.distribution == "exponential":
            return round(self._rng.expovariate(1.0) * self._service_ns)
        return round(self._rng.lognormvariate(self._mu, self.knobs.sigma) * 1e6)

    def batch_scale(self) -> float:
        """One batch's time scale: 1 (fixed) or a seeded draw, lognormal of median 1 with
        ``sigma`` or exponential of mean 1, from the generator the service times use."""
        if self.knobs.distribution == "fixed":
            return 1.0
        if self.knobs.distribution == "exponential":
            return self._rng.expovariate(1.0)
        return self._rng.lognormvariate(0.0, self.knobs.sigma)

    def _arrive(self) -> Batch:
        """Joins (or opens) a batch at this arrival, under the lock; the batch, maybe open."""
        batches = self._batches
        assert batches is not None
        with self._lock:
            return batches.arrive(self._now() - self._t0)

    def _close_due(self) -> None:
        batches = self._batches
        assert batches is not None
        with self._lock:
            batches.close_due(self._now() - self._t0)

    def _closed(self, batch: Batch) -> None:
        """BatchQueue's on_close (under the lock): wake the batch's waiters."""
        self.batch_sizes[batch.size] += 1
        waiting = self._waiting.pop(batch.index, None)
        if isinstance(waiting, threading.Event):
            waiting.set()
        elif waiting is not None and not waiting.done():
            waiting.set_result(None)

    def _join_batch(self) -> Batch:
        """This call's batch, once it has closed (its start and done are then set)."""
        batches = self._batches
        assert batches is not None
        with self._lock:
            batch = batches.arrive(self._now() - self._t0)
            if batch.closed:
                return batch
            event = self._waiting.setdefault(batch.index, threading.Event())
            assert isinstance(event, threading.Event)
        while not batch.closed:
            remaining = self._t0 + batch.close_ns - self._now()
            if remaining > 0:
                event.wait(remaining / 1e9)
            else:
                self._close_due()
        return batch

    def _schedule(self) -> tuple[int, int]:
        """This arrival's (begin, done) in ns from t0 on the server that frees first."""
        free = self._free
        assert free is not None
        with self._lock:
            # Arrival, the service draw and the heap update under one lock: arrivals are
            # ordered by when they took it, and the seeded draws go out in that order.
            arrival = self._now() - self._t0
            begin = max(arrival, free[0])
            done = finish_time(begin, self.service_time(), self._every_ns, self._stall_ns)
            heapq.heapreplace(free, done)
        return begin, done

    def _serve(self) -> None:
        service = self.service_time()
        start = self._now() - self._t0
        deadline = self._t0 + finish_time(start, service, self._every_ns, self._stall_ns)
        self._sleep_until(deadline)


def build(knobs: dict[str, Any]) -> SyntheticTarget:
    """The target's factory: validates the knobs, then builds the target."""
    model = target_knobs(SyntheticKnobs, knobs, "synthetic")
    return SyntheticTarget(model)


def inputs(workload: Any) -> list[Any]:
    """Requests are just indices; ``workload.inputs.count`` sets how many (default 64)."""
    extra = getattr(workload, "inputs", None)
    count = extra.get("count", DEFAULT_INPUTS) if isinstance(extra, dict) else DEFAULT_INPUTS
    return list(range(int(count)))


# -- the same queue as an HTTP service ----------------------------------------------------------


def queue_app(target: SyntheticTarget) -> Any:
    """An aiohttp application that is `target` over HTTP: any request to `/` is scheduled on
    its servers at arrival (FCFS, as in process) and answered when its service ends; `GET
    /health` answers at once. The event loop sleeps to each request's finish, so one thread
    serves any number of waiting requests and the queue is the target's, not the server's.
    A `Server-Timing` header gives the `queue` and `service` stages in ms.

    With batching, each open batch has a Future its members await, resolved when the batch
    closes: by the arrival that fills it, or by a `loop.call_at` timer at its T_close."""
    import asyncio

    from aiohttp import web

    def close_when_due(batch: Batch) -> None:
        if batch.closed:
            return
        late = target._now() - (target.t0_ns + batch.close_ns)
        if late < 0:  # woken early against the target's clock: wait out the rest
            asyncio.get_running_loop().call_later(-late / 1e9, close_when_due, batch)
        else:
            target._close_due()

    async def batched() -> tuple[int, int, int]:
        loop = asyncio.get_running_loop()
        batch = target._arrive()
        arrival = batch.members[-1]
        if not batch.closed:
            future = target._waiting.get(batch.index)
            if future is None:  # the batch just opened: its Future and its T_close timer
                future = loop.create_future()
                target._waiting[batch.index] = future
                delay = (target.t0_ns + batch.close_ns - target._now()) / 1e9
                loop.call_at(loop.time() + delay, close_when_due, batch)
            assert not isinstance(future, threading.Event)
            await future
        assert batch.start_ns is not None and batch.done_ns is not None
        return arrival, batch.start_ns, batch.done_ns

    async def call(request: web.Request) -> web.Response:
        await request.read()
        if target._batches is not None:
            arrival, begin, done = await batched()
        elif target._free is None:  # no queue: every request served at once
            arrival = target._now() - target.t0_ns
            begin, done = arrival, arrival + target.service_time()
        else:
            arrival = target._now() - target.t0_ns
            begin, done = target._schedule()
        wait = (target.t0_ns + done - target._now()) / 1e9
        if wait > 0:
            await asyncio.sleep(wait)
        queued, served = max(0, begin - arrival) / 1e6, (done - begin) / 1e6
        timing = f"queue;dur={queued:.3f}, service;dur={served:.3f}"
        return web.Response(text="ok", headers={"Server-Timing": timing})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_route("*", "/", call)
    return app


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m optlab.reference.synthetic --port P [--servers C] [--distribution D]
    [--service-ms MS] [--seed S] [--max-batch-size N [--max-wait-ms MS] [--per-item-ms MS]
    [--per-item2-ms MS] [--interaction]]`: the synthetic queue as an HTTP service on
    127.0.0.1."""
    import argparse

    from aiohttp import web

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--distribution", default="fixed")
    parser.add_argument("--service-ms", type=float, default=10.0)
    parser.add_argument("--sigma", type=float, default=0.5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-batch-size", type=int, default=None)
    parser.add_argument("--max-wait-ms", type=float, default=0.0)
    parser.add_argument("--per-item-ms", type=float, default=0.0)
    parser.add_argument("--per-item2-ms", type=float, default=0.0)
    parser.add_argument("--interaction", action="store_true")
    args = parser.parse_args(argv)
    knobs = {
        "servers": args.servers,
        "distribution": args.distribution,
        "service_ms": args.service_ms,
        "sigma": args.sigma,
        "seed": args.seed,
        "max_batch_size": args.max_batch_size,
        "max_wait_ms": args.max_wait_ms,
        "per_item_ms": args.per_item_ms,
        "per_item2_ms": args.per_item2_ms,
        "interaction": args.interaction,
    }
    web.run_app(queue_app(build(knobs)), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
