"""Load generation spread over several processes, for when one Python process cannot keep up.

Each worker process builds its own client from the target's picklable recipe and runs an
`AsyncLoadGenerator` on its share of the ONE schedule (request i goes to process i mod N, all
from one time zero: the merged run sends exactly what one process would have sent). Every
~0.2 s a worker ships the samples it recorded, whole buffers, to this process, where the run's
collector folds them like its own threads' samples: the run's HdrHistograms, windows and
send-lag figures cover every request of every process, and the validity checks judge the
merged run. `perf_counter_ns` is CLOCK_MONOTONIC on Linux, one clock for every process.

Workers ignore Ctrl-C (the parent stops them in order), exit when the parent's pipe closes,
and on Linux are killed by the kernel if the parent dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from optlab.config.modes import Load, mode_of
from optlab.load.aio import AsyncClient, AsyncLoadGenerator
from optlab.load.base import PROCESS_START_LEAD_NS, StopReport
from optlab.metrics.worker_log import InboxLog, WorkerLog

if TYPE_CHECKING:
    from optlab.metrics.log import Collector

__all__ = ["ClientRecipe", "LogSink", "ProcessLoadGenerator", "WorkerJob"]

SHIP_S = 0.2
READY_TIMEOUT_S = 120.0


class LogSink(Protocol):
    """Where the worker processes' samples go: a `Collector`, or (on a Ray node) the actor
    that hands them on."""

    def new_log(self, log: WorkerLog | None = None, *, source: str | None = None) -> WorkerLog: ...


class ClientRecipe(Protocol):
    """What a worker process builds its own client from (the target's `HttpRecipe`):
    picklable, so it crosses into a spawned process."""

    @property
    def bodies(self) -> Sequence[Any]: ...

    def build(self) -> AsyncClient: ...


# Picklable module-level functions the target layer hands in (it sits above this package):
# how a failed request is named, and what arms a child to die with its parent (None: nothing).
Classify = Callable[[BaseException], tuple[str, str]]
ArmParentDeath = Callable[[], Callable[[], None] | None]


@dataclass(frozen=True)
class WorkerJob:
    """What one worker process sends: share `index` of `count` of the schedule. Picklable:
    it crosses into a spawned process, and (`optlab.load.host_worker`) into a Ray actor."""

    recipe: ClientRecipe
    load: Load
    index: int
    count: int
    timeout_s: float
    seed: int
    trace_dir: Path | None
    classify: Classify
    parent_death: ArmParentDeath | None = None  # arms the process to die with its parent


class _OneLog:
    def __init__(self, log: WorkerLog) -> None:
        self.log = log

    def new_log(self) -> WorkerLog:
        return self.log


def _worker(conn: Connection, job: WorkerJob) -> None:  # pragma: no cover - runs in the child
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    arm = job.parent_death() if job.parent_death is not None else None
    if arm is not None:
        arm()  # the kernel kills this worker should optlab die without stopping it
    try:
        generator = AsyncLoadGenerator(
            job.recipe.build(),
            len(job.recipe.bodies),
            job.load,
            classify=job.classify,
            timeout_s=job.timeout_s,
            seed=job.seed,
            trace_dir=job.trace_dir,
            share=(job.index, job.count),
        )
        log = WorkerLog()
        conn.send(("ready",))
        message = conn.recv()
        if message[0] != "go":
            return
        generator.start(_OneLog(log), message[1])
        drain_s = 5.0
        while generator.failure is None:
            if conn.poll(SHIP_S):
                message = conn.recv()
                if message[0] == "stop":
                    drain_s = message[1]
                    break
            conn.send(("data", log.swap(), generator.issued, generator.completed))
        report = generator.stop(drain_s)
        conn.send(("data", log.swap(), generator.issued, generator.completed))
        failure = None if report.failure is None else repr(report.failure)
        conn.send(("done", report.issued, report.completed, report.late, failure))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return  # the parent is gone or stopping: nothing to report to
    except BaseException as exc:
        with contextlib.suppress(Exception):
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))


class _Worker:
    def __init__(self, process: BaseProcess, conn: Connection, inbox: InboxLog) -> None:
        self.process = process
        self.conn = conn
        self.inbox = inbox
        self.issued = 0
        self.completed = 0
        self.done: tuple[int, int, int, str | None] | None = None
        self.receiver: threading.Thread | None = None


class ProcessLoadGenerator:
    """N processes, one schedule; the `optlab.load.base.LoadGenerator` contract."""

    def __init__(
        self,
        recipe: ClientRecipe,
        load: Load,
        *,
        processes: int,
        classify: Classify,
        timeout_s: float,
        seed: int = 0,
        trace_dir: Path | None = None,
        parent_death: ArmParentDeath | None = None,
        share: tuple[int, int] | None = None,
    ) -> None:
        """`share` (first, of): these processes send shares first .. first + processes - 1
        of a schedule dealt over `of` workers in all (a node's part of a run from several
        hosts, `optlab.load.host_worker`); by default they send all of it."""
        first, count = share if share is not None else (0, processes)
        self._jobs = [
            WorkerJob(
                recipe, load, first + i, count, timeout_s, seed, trace_dir, classify, parent_death
            )
            for i in range(processes)
        ]
        self._open_loop = mode_of(load).open_loop
        self._workers: list[_Worker] = []
        self._failure: BaseException | None = None
        self._report: StopReport | None = None
        self._t0 = 0
        self._stopping = False

    @property
    def in_flight(self) -> int:
        return sum(w.issued - w.completed for w in self._workers)

    @property
    def issued(self) -> int:
        return sum(w.issued for w in self._workers)

    @property
    def completed(self) -> int:
        return sum(w.completed for w in self._workers)

    @property
    def pids(self) -> list[int]:
        """The worker processes' pids, once spawned."""
        return [w.process.pid for w in self._workers if w.process.pid is not None]

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    @property
    def open_loop(self) -> bool:
        return self._open_loop

    @property
    def t0_ns(self) -> int:
        return self._t0

    def start(self, collector: Collector) -> None:
        self.spawn(collector)
        self.go(time.perf_counter_ns() + PROCESS_START_LEAD_NS)  # after every "go"

    def spawn(self, collector: LogSink) -> None:
        """Start the worker processes, each with its log in `collector`, and wait until each
        has built its client: the slow part, before a time zero is chosen."""
        context = multiprocessing.get_context("spawn")  # never fork a process that has threads
        try:
            for job in self._jobs:
                parent, child = context.Pipe()
                process = context.Process(
                    target=_worker, args=(child, job), name=f"optlab-load-{job.index}", daemon=True
                )
                process.start()
                child.close()
                inbox = InboxLog()
                collector.new_log(inbox)
                self._workers.append(_Worker(process, parent, inbox))
            for worker in self._workers:
                self._expect_ready(worker)
        except BaseException:
            self._kill()
            raise

    def go(self, t0_ns: int) -> None:
        """Every worker starts its share of the schedule from `t0_ns` (perf_counter_ns)."""
        self._t0 = t0_ns
        try:
            for worker in self._workers:
                worker.conn.send(("go", self._t0))
                worker.receiver = threading.Thread(
                    target=self._receive, args=(worker,), name="optlab-load-inbox", daemon=True
                )
                worker.receiver.start()
        except BaseException:
            self._kill()
            raise

    def _expect_ready(self, worker: _Worker) -> None:
        if not worker.conn.poll(READY_TIMEOUT_S):
            raise RuntimeError(
                f"load-generator process {worker.process.name} was not ready within "
                f"{READY_TIMEOUT_S:g} s"
            )
        try:
            message = worker.conn.recv()
        except EOFError:
            raise RuntimeError(
                f"load-generator process {worker.process.name} exited while starting "
                f"(exit code {worker.process.exitcode})"
            ) from None
        if message[0] != "ready":
            raise RuntimeError(f"load-generator process {worker.process.name}: {message[1]}")

    def _receive(self, worker: _Worker) -> None:
        conn = worker.conn
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                if worker.done is None and not self._stopping and self._failure is None:
                    worker.process.join(1.0)
                    self._failure = RuntimeError(
                        f"load-generator process {worker.process.name} exited during the run "
                        f"(exit code {worker.process.exitcode})"
                    )
                return
            kind = message[0]
            if kind == "data":
                _, buffers, worker.issued, worker.completed = message
                if len(buffers):
                    worker.inbox.put(buffers)
            elif kind == "done":
                worker.done = message[1:]
                return
            elif kind == "failed":
                if self._failure is None:
                    self._failure = RuntimeError(
                        f"load-generator process {worker.process.name} failed: {message[1]}"
                    )
                return

    def stop(self, drain_timeout_s: float = 5.0) -> StopReport:
        if self._report is not None:
            return self._report
        self._stopping = True
        for worker in self._workers:
            with contextlib.suppress(OSError, BrokenPipeError):
                worker.conn.send(("stop", drain_timeout_s))
        deadline = time.monotonic() + drain_timeout_s + 15
        for worker in self._workers:
            if worker.receiver is not None:
                worker.receiver.join(max(0.0, deadline - time.monotonic()))
        self._kill()
        issued = completed = late = 0
        for worker in self._workers:
            if worker.done is not None:
                w_issued, w_completed, w_late, failure = worker.done
                issued, completed, late = issued + w_issued, completed + w_completed, late + w_late
                if failure is not None and self._failure is None:
                    self._failure = RuntimeError(f"{worker.process.name}: {failure}")
            else:
                issued, completed = issued + worker.issued, completed + worker.completed
        self._report = StopReport.of(
            issued, completed, late, open_loop=self._open_loop, failure=self._failure
        )
        return self._report

    def _kill(self) -> None:
        for worker in self._workers:
            worker.process.join(5.0 if worker.done is not None else 0.5)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join(5.0)
            worker.conn.close()
