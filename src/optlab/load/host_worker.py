"""One load-generator worker on a Ray node (`workload.load.hosts`, docs/hosts.md): the
actor class, built from a `optlab.load.processes.WorkerJob`.

The actor only supervises: it spawns a plain local worker process, the very one
`processes: N` runs (`optlab.load.processes`: optlab's own `AsyncLoadGenerator` on its share of
the schedule), relays its samples when the coordinator (`optlab.load.hosts`) takes them, and
reports the node. The sending thread so never shares a process, or its GIL, with Ray's
threads and task calls (in the actor's own process they cost a Ray worker ~20% more send-lag
P99 than a local one at 2,000/s).
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
from typing import TYPE_CHECKING, Any

from optlab.load.processes import ProcessLoadGenerator, WorkerJob
from optlab.metrics.cpu import HostCpu
from optlab.metrics.histogram import LatencyHistogram
from optlab.metrics.worker_log import InboxLog, WorkerLog

if TYPE_CHECKING:
    from optlab.metrics.worker_log import Buffers

__all__ = ["LoadWorker"]


NEIGHBOURS = 3  # the node's busiest other processes reported
NEIGHBOUR_PCT = 5.0  # ... that used at least this much of one core


def _process_cpu() -> dict[int, tuple[str, float]]:
    """pid -> (name, user + system CPU seconds) of this node's processes that can be read."""
    import psutil

    found = {}
    for process in psutil.process_iter(["name", "cpu_times"]):
        times = process.info.get("cpu_times")
        if times is not None:
            found[process.pid] = (str(process.info.get("name") or "?"), times.user + times.system)
    return found


def _children_cpu_s() -> float:
    """User + system CPU seconds of this process's children that have been reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class LoadWorker:  # pragma: no cover - runs inside a Ray actor (tests/ray)
    """One load-generator worker on a node (a Ray actor): a local worker process on its share
    of the schedule, its samples taken by the coordinator ~5/s. It keeps its own count and
    latency histogram of everything it handed over, so the merge can be checked against what
    each node measured."""

    def __init__(self, job: WorkerJob) -> None:
        self._job = job
        self._inbox = InboxLog()
        self._generator: ProcessLoadGenerator | None = None
        self._shipped = LatencyHistogram()
        self._shipped_errors = 0
        self._first: tuple[int, int] | None = None  # (intended ns, send lag ns) of the first
        self._cpu0 = 0
        self._children_cpu0 = 0.0
        self._t0_wall_ns = 0
        self._host_cpu = HostCpu()
        self._node_cpu: list[float] = []
        self._steal: list[float] = []
        self._processes: tuple[float, dict[int, tuple[str, float]]] | None = None

    def new_log(self, log: WorkerLog | None = None, *, source: str | None = None) -> WorkerLog:
        """Where the worker process's samples arrive (`optlab.load.processes.LogSink`)."""
        assert isinstance(log, InboxLog)
        self._inbox = log
        return log

    def clock(self) -> int:
        return time.perf_counter_ns()

    def prepare(self) -> tuple[list[int], int]:
        """Start the worker process and wait until its client is built; (this actor's pid
        and the worker process's, the niceness the worker runs at)."""
        # Ray starts its workers at nice 15 (`RAY_worker_niceness`) so that they yield to the
        # node's own daemons: for a load generator that is a lag on every busy node. Back to 0
        # where this process may (root, CAP_SYS_NICE); the worker process, started from this
        # thread, inherits it. Where it may not, the niceness is reported with the node.
        with contextlib.suppress(OSError):
            if os.getpriority(os.PRIO_PROCESS, 0) > 0:
                os.setpriority(os.PRIO_PROCESS, 0, 0)
        # The node's processes' CPU now, for its neighbours over the run (a scan here and at
        # the stop, never while sending).
        self._processes = (time.monotonic(), _process_cpu())
        job = self._job
        self._generator = ProcessLoadGenerator(
            job.recipe,
            job.load,
            processes=1,
            classify=job.classify,
            timeout_s=job.timeout_s,
            seed=job.seed,
            trace_dir=job.trace_dir,
            parent_death=job.parent_death,
            share=(job.index, job.count),
        )
        self._generator.spawn(self)
        pids = self._generator.pids
        nice = max((os.getpriority(os.PRIO_PROCESS, pid) for pid in pids), default=0)
        return [os.getpid(), *pids], nice

    def go(self, t0_ns: int) -> None:
        assert self._generator is not None
        self._cpu0 = time.process_time_ns()
        self._children_cpu0 = _children_cpu_s()
        self._host_cpu.sample()
        # Time zero on the wall clock too (on one machine, a clock a time namespace does not
        # shift): how together the nodes started can be checked against it. Of a few reads,
        # the one with the least time between its two monotonic reads.
        reads = []
        for _ in range(5):
            before = time.perf_counter_ns()
            wall = time.time_ns()
            after = time.perf_counter_ns()
            reads.append((after - before, wall - ((before + after) // 2 - t0_ns)))
        self._t0_wall_ns = min(reads)[1]
        self._generator.go(t0_ns)

    def _sample_cpu(self) -> None:
        sample = self._host_cpu.sample()
        if sample.system_pct is not None:
            self._node_cpu.append(sample.system_pct)
        if sample.steal_pct is not None:
            self._steal.append(sample.steal_pct)

    def _take(self) -> Buffers:
        import numpy as np

        buffers = self._inbox.swap()
        if buffers.end:
            total = np.frombuffer(buffers.total, dtype=np.int64)
            self._shipped.record_array(total)
            intended = np.frombuffer(buffers.end, dtype=np.int64) - total
            first = int(np.argmin(intended))
            if self._first is None or int(intended[first]) < self._first[0]:
                self._first = (int(intended[first]), int(buffers.send_lag[first]))
        self._shipped_errors += len(buffers.errors)
        return buffers

    def _neighbours(self) -> list[dict[str, Any]]:
        """The node's processes that used the most CPU since prepare() (% of one core), this
        actor and its worker process left out."""
        if self._processes is None:
            return []
        own = {os.getpid(), *(self._generator.pids if self._generator is not None else [])}
        started, before = self._processes
        elapsed = max(time.monotonic() - started, 1e-3)
        after = _process_cpu()
        used = sorted(
            (
                (round(100 * (cpu - before[pid][1]) / elapsed, 1), pid, name)
                for pid, (name, cpu) in after.items()
                if pid in before and pid not in own
            ),
            reverse=True,
        )
        return [
            {"pid": pid, "name": name, "cpu_pct": pct}
            for pct, pid, name in used[:NEIGHBOURS]
            if pct >= NEIGHBOUR_PCT
        ]

    def take(self) -> tuple[Buffers, int, int, int, str | None]:
        gen = self._generator
        assert gen is not None
        failure = None if gen.failure is None else repr(gen.failure)
        self._sample_cpu()
        return self._take(), gen.issued, gen.completed, time.perf_counter_ns(), failure

    def stop(self, drain_s: float) -> dict[str, Any]:
        gen = self._generator
        assert gen is not None
        report = gen.stop(drain_s)
        buffers = self._take()
        self._sample_cpu()
        cpu = self._node_cpu
        return {
            "neighbours": self._neighbours(),
            "node_cpu_pct": sum(cpu) / len(cpu) if cpu else None,
            "node_cpu_max_pct": max(cpu) if cpu else None,
            "steal_pct": sum(self._steal) / len(self._steal) if self._steal else None,
            "buffers": buffers,
            "issued": report.issued,
            "completed": report.completed,
            "late": report.late,
            "failure": None if report.failure is None else repr(report.failure),
            "shipped": self._shipped.encode(),
            "shipped_errors": self._shipped_errors,
            "first_send_lag_ns": None if self._first is None else self._first[1],
            # This actor's CPU and its worker process's (reaped by the stop), both the
            # load's cost on the node.
            "cpu_ns": time.process_time_ns()
            - self._cpu0
            + int((_children_cpu_s() - self._children_cpu0) * 1e9),
            "t0_wall_ns": self._t0_wall_ns,
        }
