"""Load from several hosts on Ray (`workload.load.hosts`, docs/hosts.md).

The local multi-process mode (`optlab.load.processes`) spread over the nodes of a Ray cluster:
each worker is a Ray actor pinned to its node (node affinity, `num_cpus` declared) running
optlab's own `AsyncLoadGenerator` on its share of the ONE schedule (request i to worker
i mod N), on its own monotonic clock. Ray places, starts, watches and stops the workers; no
socket protocol of optlab's own.

Before the load starts, this process measures each node's clock against its own by
ping-pong through the actor calls (`optlab.load.clock`: the exchange with the smallest
round trip, offset within +-half of it). Time zero is one instant of this clock, handed to
each node in its own clock. Latency never crosses hosts: each request is timed on the node
that sent it; the offsets only place the schedule and move each node's sample instants onto
this clock, so the per-second windows line up.

Every ~0.5 s this process takes each worker's recorded samples (whole buffers, as the local
mode ships them) and hands them to the run's collector, under the node's name: the run's
histograms are the exact merge, and each node's own tally is kept beside them for its
verdict. A worker or node lost mid-run: what it shipped stays in the run, the generator's
failure names the node, and the run ends FAILED with that reason.

The cluster and its checks are `optlab.load.cluster`'s, the worker actor
`optlab.load.host_worker`'s. This process is a Ray driver only while it checks the cluster
and drives a load: it leaves the cluster when the load stops (Ray ends a driver whose head
has gone away).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from optlab.config.modes import Load, mode_of
from optlab.load.base import StopReport
from optlab.load.clock import ClockOffset, ping_pong
from optlab.load.processes import ArmParentDeath, Classify, ClientRecipe, WorkerJob
from optlab.metrics.backlog import LoadTimeline
from optlab.metrics.worker_log import InboxLog

if TYPE_CHECKING:
    from optlab.metrics.log import Collector
    from optlab.metrics.worker_log import Buffers
from optlab.load.cluster import (
    CALL_TIMEOUT_S,
    RAY_HINT,
    Cluster,
    Node,
    affinity,
    connect,
    ray_module,
)
from optlab.load.host_worker import LoadWorker

__all__ = [
    "RAY_HINT",
    "Cluster",
    "HostReport",
    "Node",
    "RayLoadGenerator",
    "connect",
]

SHIP_S = 0.2
CLOCK_ROUNDS = 16
# Time zero is this far ahead of "go", at least, and 20 round trips: every node is told its
# instant before it comes.
MIN_LEAD_NS = 500_000_000
LEAD_ROUND_TRIPS = 20


def _remote_clock(ray: ModuleType, actor: Any) -> Callable[[], int]:
    def read() -> int:
        return int(ray.get(actor.clock.remote(), timeout=CALL_TIMEOUT_S))

    return read


@dataclass
class _Worker:
    node: Node
    index: int
    actor: Any
    inbox: InboxLog
    issued: int = 0
    completed: int = 0
    done: dict[str, Any] | None = None
    lost: str | None = None
    lost_at_ns: int | None = None
    pids: tuple[int, ...] = ()  # on its node: the actor's, its worker process's
    nice: int = 0  # the niceness its worker process ran at


@dataclass(frozen=True)
class HostReport:
    """One node's part of a run, as the generator saw it (its figures over the measured
    phase come from the collector's tally of it)."""

    node: str
    node_id: str
    host: str
    ip: str
    workers: int
    offset_ms: float
    offset_bound_ms: float
    round_trip_ms: float
    consistent: bool
    issued: int
    completed: int
    first_send_lag_ms: float | None
    cpu_s: float | None
    lost: str | None = None
    lost_at_s: float | None = None  # seconds after time zero
    # The offset measured again after the load, minus the first (the clocks' drift over the
    # run), within +-drift_bound_ms (the two bounds); None where the node could not answer.
    drift_ms: float | None = None
    drift_bound_ms: float | None = None
    shipped: tuple[str, ...] = ()  # each worker's own histogram of what it handed over
    shipped_errors: int = 0
    t0_wall_ns: tuple[int, ...] = ()
    # The node's CPUs (all cores, 0..100) sampled ~2/s while it sent: mean, highest, stolen.
    node_cpu_pct: float | None = None
    node_cpu_max_pct: float | None = None
    steal_pct: float | None = None
    worker_nice: int = 0  # the highest niceness its workers' sending processes ran at
    # Its busiest other processes over the run: {"pid", "name", "cpu_pct" (of one core)}.
    neighbours: tuple[dict[str, Any], ...] = ()
    # Its requests sent and in flight ~5 times a second, on the coordinator's clock.
    timeline: LoadTimeline = field(default_factory=LoadTimeline, compare=False)


class RayLoadGenerator:
    """Workers on Ray nodes, one schedule; the `optlab.load.base.LoadGenerator` contract."""

    def __init__(
        self,
        recipe: ClientRecipe,
        load: Load,
        cluster: Cluster,
        *,
        classify: Classify,
        timeout_s: float,
        seed: int = 0,
        trace_dir: Path | None = None,
        parent_death: ArmParentDeath | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        """`parent_death` arms each node's worker process to die with its Ray actor
        (`optlab.load.processes`)."""
        self._recipe, self._load, self._cluster = recipe, load, cluster
        self._classify, self._timeout_s, self._seed = classify, timeout_s, seed
        self._trace_dir = trace_dir
        self._parent_death = parent_death
        self._clock = clock
        self._open_loop = mode_of(load).open_loop
        self._workers: list[_Worker] = []
        self._offsets: dict[str, ClockOffset] = {}
        # Each node's offset measured again once the load stopped: how far the two clocks
        # drifted apart over the run (windows are placed by the first).
        self._end_offsets: dict[str, ClockOffset] = {}
        self._failure: BaseException | None = None
        self._report: StopReport | None = None
        self._t0 = 0
        self._stopping = threading.Event()
        self._receiver: threading.Thread | None = None
        # Each node's requests sent and in flight, as the runner's timeline marks the run's.
        self._timelines = {node.name: LoadTimeline() for node in cluster.nodes}

    # -- the contract ---------------------------------------------------------------------------
    @property
    def issued(self) -> int:
        return sum(w.issued for w in self._workers)

    @property
    def in_flight(self) -> int:
        return sum(w.issued - w.completed for w in self._workers)

    @property
    def failure(self) -> BaseException | None:
        return self._failure

    @property
    def open_loop(self) -> bool:
        return self._open_loop

    @property
    def t0_ns(self) -> int:
        return self._t0

    @property
    def offsets(self) -> dict[str, ClockOffset]:
        return dict(self._offsets)

    @property
    def worker_pids(self) -> list[tuple[str, int]]:
        """(node name, pid on that node) of each worker's processes (its Ray actor and the
        worker process the actor started), once started."""
        return [(w.node.name, pid) for w in self._workers for pid in w.pids]

    def start(self, collector: Collector) -> None:
        ray = ray_module()
        hosts = self._cluster.hosts
        actor_class = ray.remote(LoadWorker)
        count = hosts.nodes * hosts.workers_per_node
        try:
            for node in self._cluster.nodes:
                for _ in range(hosts.workers_per_node):
                    index = len(self._workers)
                    job = WorkerJob(
                        self._recipe,
                        self._load,
                        index,
                        count,
                        self._timeout_s,
                        self._seed,
                        self._trace_dir,
                        self._classify,
                        self._parent_death,
                    )
                    actor = actor_class.options(
                        scheduling_strategy=affinity(node.node_id),
                        num_cpus=hosts.cpus_per_worker,
                        max_restarts=0,
                    ).remote(job)
                    inbox = InboxLog()
                    collector.new_log(inbox, source=node.name)
                    self._workers.append(_Worker(node, index, actor, inbox))
            started = self._call_all(lambda w: w.actor.prepare.remote(), "start")
            for worker, (pids, nice) in zip(self._workers, started, strict=True):
                worker.pids, worker.nice = tuple(int(p) for p in pids), int(nice)
            for node in self._cluster.nodes:
                first = next(w for w in self._workers if w.node is node)
                self._offsets[node.name] = ping_pong(
                    self._clock, _remote_clock(ray, first.actor), CLOCK_ROUNDS
                )
            worst = max(o.round_trip_ns for o in self._offsets.values())
            self._t0 = self._clock() + max(MIN_LEAD_NS, LEAD_ROUND_TRIPS * worst)
            self._call_all(
                lambda w: w.actor.go.remote(self._offsets[w.node.name].to_remote(self._t0)), "go"
            )
        except BaseException:
            self._kill()
            raise
        self._receiver = threading.Thread(
            target=self._receive, name="optlab-ray-inbox", daemon=True
        )
        self._receiver.start()

    def _call_all(self, call: Callable[[_Worker], Any], what: str) -> list[Any]:
        ray = ray_module()
        refs = [call(w) for w in self._workers]
        results = []
        for worker, ref in zip(self._workers, refs, strict=True):
            try:
                results.append(ray.get(ref, timeout=CALL_TIMEOUT_S))
            except Exception as exc:
                raise RuntimeError(
                    f"{self._name(worker)} failed to {what}: {type(exc).__name__}: "
                    f"{str(exc).splitlines()[0] if str(exc) else ''}"
                ) from exc
        return results

    def _name(self, worker: _Worker) -> str:
        node = worker.node
        return f"{node.name} ({node.host}, {node.ip}) worker {worker.index}"

    def _ship(self, worker: _Worker, buffers: Buffers) -> None:
        # The node's instants onto this clock: its offset is its clock minus this one.
        buffers.shift(-self._offsets[worker.node.name].offset_ns)
        if len(buffers):
            worker.inbox.put(buffers)

    def _lose(self, worker: _Worker, exc: BaseException) -> None:
        worker.lost = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        worker.lost_at_ns = self._clock()
        if self._failure is None:
            into = (worker.lost_at_ns - self._t0) / 1e9
            self._failure = RuntimeError(
                f"{self._name(worker)} was lost {into:.1f} s into the load ({worker.lost}); "
                "what it sent before is kept"
            )

    def _receive(self) -> None:
        ray = ray_module()
        while not self._stopping.wait(SHIP_S):
            live = [w for w in self._workers if w.lost is None]
            refs = [w.actor.take.remote() for w in live]
            for worker, ref in zip(live, refs, strict=True):
                try:
                    buffers, worker.issued, worker.completed, _, failure = ray.get(
                        ref, timeout=CALL_TIMEOUT_S
                    )
                except Exception as exc:
                    self._lose(worker, exc)
                    continue
                self._ship(worker, buffers)
                if failure is not None and self._failure is None:
                    self._failure = RuntimeError(f"{self._name(worker)} failed: {failure}")
            now = self._clock()
            for node in self._cluster.nodes:
                workers = [w for w in self._workers if w.node is node]
                issued = sum(w.issued for w in workers)
                self._timelines[node.name].mark(
                    now, issued, issued - sum(w.completed for w in workers)
                )

    def stop(self, drain_timeout_s: float = 5.0) -> StopReport:
        if self._report is not None:
            return self._report
        self._stopping.set()
        if self._receiver is not None:
            self._receiver.join(CALL_TIMEOUT_S)
        ray = ray_module()
        live = [w for w in self._workers if w.lost is None]
        refs = [w.actor.stop.remote(drain_timeout_s) for w in live]
        for worker, ref in zip(live, refs, strict=True):
            try:
                worker.done = ray.get(ref, timeout=drain_timeout_s + 30)
            except Exception as exc:
                self._lose(worker, exc)
                continue
            self._ship(worker, worker.done["buffers"])
            worker.issued, worker.completed = worker.done["issued"], worker.done["completed"]
            if worker.done["failure"] is not None and self._failure is None:
                self._failure = RuntimeError(f"{self._name(worker)}: {worker.done['failure']}")
        self._measure_drift()
        self._kill()
        late = sum(w.done["late"] for w in self._workers if w.done is not None)
        self._report = StopReport.of(
            self.issued,
            sum(w.completed for w in self._workers),
            late,
            open_loop=self._open_loop,
            failure=self._failure,
        )
        return self._report

    def _measure_drift(self) -> None:
        """Each node's offset again, through a worker that is still there (the load has
        stopped, so the exchanges compete with nothing)."""
        ray = ray_module()
        for node in self._cluster.nodes:
            alive = next((w for w in self._workers if w.node is node and w.lost is None), None)
            if alive is None or node.name not in self._offsets:
                continue
            with contextlib.suppress(Exception):  # a node that cannot answer has no drift figure
                self._end_offsets[node.name] = ping_pong(
                    self._clock, _remote_clock(ray, alive.actor), CLOCK_ROUNDS
                )

    def _kill(self) -> None:
        with contextlib.suppress(Exception):
            ray = ray_module()
            for worker in self._workers:
                with contextlib.suppress(Exception):
                    ray.kill(worker.actor, no_restart=True)
            # Leave the cluster: a Ray driver whose head goes away is ended by Ray itself a
            # minute later, and this process still has a run to store (or a notebook to keep).
            ray.shutdown()

    def reports(self) -> list[HostReport]:
        """Each node's part: its clock, what its workers sent, whether it was lost."""
        out = []
        for node in self._cluster.nodes:
            workers = [w for w in self._workers if w.node is node]
            offset = self._offsets.get(node.name)
            end = self._end_offsets.get(node.name)
            drift = drift_bound = None
            if offset is not None and end is not None:
                drift = (end.offset_ns - offset.offset_ns) / 1e6
                drift_bound = (end.bound_ns + offset.bound_ns) / 1e6
            done = [w.done for w in workers if w.done is not None]
            lost = next((w for w in workers if w.lost is not None), None)
            firsts = [d["first_send_lag_ns"] for d in done if d["first_send_lag_ns"] is not None]
            out.append(
                HostReport(
                    node=node.name,
                    node_id=node.node_id,
                    host=node.host,
                    ip=node.ip,
                    workers=len(workers),
                    offset_ms=offset.offset_ns / 1e6 if offset else 0.0,
                    offset_bound_ms=offset.bound_ns / 1e6 if offset else 0.0,
                    round_trip_ms=offset.round_trip_ns / 1e6 if offset else 0.0,
                    consistent=offset.consistent if offset else True,
                    drift_ms=drift,
                    drift_bound_ms=drift_bound,
                    issued=sum(w.issued for w in workers),
                    completed=sum(w.completed for w in workers),
                    first_send_lag_ms=max(firsts) / 1e6 if firsts else None,
                    cpu_s=sum(d["cpu_ns"] for d in done) / 1e9 if done else None,
                    lost=lost.lost if lost is not None else None,
                    lost_at_s=(
                        (lost.lost_at_ns - self._t0) / 1e9
                        if lost is not None and lost.lost_at_ns is not None
                        else None
                    ),
                    shipped=tuple(d["shipped"] for d in done),
                    shipped_errors=sum(d["shipped_errors"] for d in done),
                    t0_wall_ns=tuple(d["t0_wall_ns"] for d in done),
                    node_cpu_pct=done[0]["node_cpu_pct"] if done else None,
                    node_cpu_max_pct=done[0]["node_cpu_max_pct"] if done else None,
                    steal_pct=done[0]["steal_pct"] if done else None,
                    worker_nice=max((w.nice for w in workers), default=0),
                    neighbours=tuple(done[0]["neighbours"]) if done else (),
                    timeline=self._timelines[node.name],
                )
            )
        return out
