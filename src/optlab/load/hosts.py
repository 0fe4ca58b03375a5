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

Ray is imported only here and only when a load asks for hosts: `pip install 'optlab[ray]'`.
This process is a Ray driver only while it checks the cluster and drives a load: it leaves
the cluster when the load stops (Ray ends a driver whose head has gone away).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from optlab.config.modes import Load, mode_of
from optlab.config.modes.base import Hosts, address_parts
from optlab.errors import ConfigError
from optlab.load.aio import AsyncLoadGenerator
from optlab.load.base import StopReport
from optlab.load.clock import ClockOffset, ping_pong
from optlab.load.processes import Classify, ClientRecipe
from optlab.metrics.backlog import LoadTimeline
from optlab.metrics.cpu import HostCpu
from optlab.metrics.histogram import LatencyHistogram
from optlab.metrics.log import InboxLog, WorkerLog

if TYPE_CHECKING:
    from optlab.metrics.log import Collector, _Buffers

__all__ = [
    "RAY_HINT",
    "Cluster",
    "HostReport",
    "Node",
    "RayLoadGenerator",
    "connect",
]

RAY_HINT = (
    "install Ray beside optlab, here and on every node (the same Ray, Python and optlab "
    "versions everywhere): pip install 'optlab[ray]'"
)
CONNECT_TIMEOUT_S = 3.0  # a TCP connect to the head's port, before Ray's own long retries
CALL_TIMEOUT_S = 60.0  # a probe or a worker's start
SHIP_S = 0.2
CLOCK_ROUNDS = 16
# Time zero is this far ahead of "go", at least, and 20 round trips: every node is told its
# instant before it comes.
MIN_LEAD_NS = 500_000_000
LEAD_ROUND_TRIPS = 20


def _ray() -> ModuleType:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ConfigError(
            "workload.load.hosts: load from several hosts runs on Ray, which is not installed here",
            hint=RAY_HINT,
        ) from None


def _affinity(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


@dataclass(frozen=True)
class Node:
    """One node that sends load: `name` is optlab's (node-a, node-b, ... in the cluster's
    order), the rest Ray's and the node's own."""

    name: str
    node_id: str
    host: str
    ip: str
    cpus: float
    environment: dict[str, Any]


@dataclass(frozen=True)
class Cluster:
    """The nodes a load runs on, checked: reachable, enough CPUs, optlab and the same version
    on each."""

    address: str
    hosts: Hosts
    nodes: tuple[Node, ...]
    ray_version: str

    def fingerprint(self) -> dict[str, Any]:
        """The node set and each node's environment: part of the run's environment, so a step
        measured from other nodes is refused as a hidden variable."""
        # In a stable order of what they are (Ray's order of nodes changes as they restart).
        nodes = sorted(
            ({**n.environment, "ip": n.ip} for n in self.nodes),
            key=lambda n: json.dumps(n, sort_keys=True, default=str),
        )
        return {
            "ray": self.ray_version,
            "workers_per_node": self.hosts.workers_per_node,
            "nodes": nodes,
        }


_CLUSTERS: dict[tuple[Any, ...], Cluster] = {}


def _reachable(address: str) -> None:
    parts = address_parts(address)
    if parts is None:
        return
    try:
        with socket.create_connection(parts, timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ConfigError(
            f"workload.load.hosts.ray: the Ray cluster at {address} cannot be reached "
            f"({exc.strerror or exc})",
            hint="start it (`ray start --head --port=6379` on the head node), or correct the "
            "address: HOST:PORT of the head node, reachable from this machine (docs/hosts.md)",
        ) from None


def _init(ray: ModuleType, address: str) -> None:
    if ray.is_initialized():
        context = ray.get_runtime_context()
        current = getattr(context, "gcs_address", None)
        if address in ("auto", current):
            return
        ray.shutdown()
    try:
        ray.init(
            address=address,
            namespace="optlab",
            log_to_driver=False,
            logging_level=logging.ERROR,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"workload.load.hosts.ray: cannot join the Ray cluster at {address}: {exc}",
            hint="check that `ray status --address " + address + "` works from this machine "
            "and that its Ray and Python versions match the cluster's (docs/hosts.md)",
        ) from None


def connect(hosts: Hosts) -> Cluster:
    """Join the cluster and pick the nodes, each checked before any run row exists: alive,
    with the CPUs its workers reserve, able to import optlab, at this optlab's version."""
    key = (hosts.ray, hosts.nodes, hosts.workers_per_node, hosts.cpus_per_worker)
    ray = _ray()
    known = _CLUSTERS.get(key)
    if known is not None and ray.is_initialized():
        up = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        if all(node.node_id in up for node in known.nodes):
            return known
    _reachable(hosts.ray)
    _init(ray, hosts.ray)
    need = hosts.workers_per_node * hosts.cpus_per_worker
    alive = sorted(
        (n for n in ray.nodes() if n.get("Alive")),
        key=lambda n: (n.get("NodeManagerAddress", ""), n["NodeID"]),
    )
    fit = [n for n in alive if float(n.get("Resources", {}).get("CPU", 0)) >= need]
    if len(fit) < hosts.nodes:
        listed = ", ".join(
            f"{n.get('NodeManagerAddress', '?')} ({n.get('Resources', {}).get('CPU', 0):g} CPUs)"
            for n in alive
        )
        raise ConfigError(
            f"workload.load.hosts: {hosts.nodes} nodes with {need:g} CPUs each are asked for "
            f"({hosts.workers_per_node} workers x {hosts.cpus_per_worker:g} CPUs), but the "
            f"cluster at {hosts.ray} has {len(fit)} such node{'s' if len(fit) != 1 else ''} "
            f"of {len(alive)} alive: {listed or 'none'}",
            hint="lower hosts.nodes or hosts.workers_per_node (or cpus_per_worker), or add "
            "nodes to the cluster (`ray start --address=HEAD:PORT --num-cpus=N` on each)",
        )
    chosen = fit[: hosts.nodes]
    facts = _probe_all(ray, chosen)
    nodes = tuple(
        Node(
            name=f"node-{_letter(i)}",
            node_id=n["NodeID"],
            host=fact["host"],
            ip=n.get("NodeManagerAddress", ""),
            cpus=float(n.get("Resources", {}).get("CPU", 0)),
            environment=fact["environment"],
        )
        for i, (n, fact) in enumerate(zip(chosen, facts, strict=True))
    )
    cluster = Cluster(hosts.ray, hosts, nodes, str(ray.__version__))
    _CLUSTERS[key] = cluster
    return cluster


def _letter(i: int) -> str:
    letters = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        letters = chr(ord("a") + r) + letters
    return letters


def node_facts() -> dict[str, Any]:  # pragma: no cover - runs on a Ray node
    """What a node says of itself (the probe): its host, optlab version, environment."""
    from optlab import __version__
    from optlab.env.collect import host_fingerprint

    return {"host": socket.gethostname(), "optlab": __version__, "environment": host_fingerprint()}


def _probe_all(ray: ModuleType, chosen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from optlab import __version__

    probe = ray.remote(node_facts)
    refs = [
        probe.options(scheduling_strategy=_affinity(n["NodeID"]), num_cpus=0).remote()
        for n in chosen
    ]
    facts: list[dict[str, Any]] = []
    for n, ref in zip(chosen, refs, strict=True):
        where = f"node {n.get('NodeManagerAddress', '?')} ({n['NodeID'][:12]})"
        try:
            facts.append(ray.get(ref, timeout=CALL_TIMEOUT_S))
        except Exception as exc:
            text = str(exc)
            if "No module named 'optlab" in text or "ModuleNotFoundError" in text:
                raise ConfigError(
                    f"workload.load.hosts: {where} cannot import optlab (ModuleNotFoundError): "
                    "every node runs optlab's own load generator",
                    hint=f"install optlab {__version__} on that node, in the Python environment "
                    "its `ray start` runs from (docs/hosts.md)",
                ) from None
            raise ConfigError(
                f"workload.load.hosts: {where} did not answer optlab's probe: "
                f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}",
                hint="check the node with `ray status`; its Ray and Python versions must match "
                "this machine's",
            ) from None
    wrong = [
        f"{n.get('NodeManagerAddress', '?')} ({n['NodeID'][:12]}) has optlab {f['optlab']}"
        for n, f in zip(chosen, facts, strict=True)
        if f["optlab"] != __version__
    ]
    if wrong:
        raise ConfigError(
            f"workload.load.hosts: this machine runs optlab {__version__}, but "
            + "; ".join(wrong)
            + ": every node must run the same optlab (its generator is part of what is measured)",
            hint=f"install optlab {__version__} on those nodes and restart their `ray start`",
        )
    return facts


@dataclass(frozen=True)
class _Job:
    recipe: ClientRecipe
    load: Load
    index: int
    count: int
    timeout_s: float
    seed: int
    trace_dir: Path | None
    classify: Classify


class _OneLog:
    def __init__(self, log: WorkerLog) -> None:
        self.log = log

    def new_log(self) -> WorkerLog:
        return self.log


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


class LoadWorker:  # pragma: no cover - runs inside a Ray actor (tests/ray)
    """One load-generator process on a node (a Ray actor): optlab's `AsyncLoadGenerator` on
    its share of the schedule, its samples taken by the coordinator ~2/s. It keeps its own
    count and latency histogram of everything it handed over, so the merge can be checked
    against what each node measured."""

    def __init__(self, job: _Job) -> None:
        self._job = job
        self._log = WorkerLog()
        self._generator: AsyncLoadGenerator | None = None
        self._shipped = LatencyHistogram()
        self._shipped_errors = 0
        self._first: tuple[int, int] | None = None  # (intended ns, send lag ns) of the first
        self._cpu0 = 0
        self._t0_wall_ns = 0
        self._host_cpu = HostCpu()
        self._node_cpu: list[float] = []
        self._steal: list[float] = []
        self._processes: tuple[float, dict[int, tuple[str, float]]] | None = None

    def clock(self) -> int:
        return time.perf_counter_ns()

    def prepare(self) -> tuple[int, int]:
        """Build the generator; (pid, the niceness its sending thread will run at)."""
        # Ray starts its workers at nice 15 (`RAY_worker_niceness`) so that they yield to the
        # node's own daemons: for a load generator that is a lag on every busy node. Back to 0
        # where this process may (root, CAP_SYS_NICE); the sending thread, started later from
        # this one, inherits it. Where it may not, the niceness is reported with the node.
        with contextlib.suppress(OSError):
            if os.getpriority(os.PRIO_PROCESS, 0) > 0:
                os.setpriority(os.PRIO_PROCESS, 0, 0)
        # The node's processes' CPU now, for its neighbours over the run (a scan here and at
        # the stop, never while sending).
        self._processes = (time.monotonic(), _process_cpu())
        job = self._job
        self._generator = AsyncLoadGenerator(
            job.recipe.build(),
            len(job.recipe.bodies),
            job.load,
            classify=job.classify,
            timeout_s=job.timeout_s,
            seed=job.seed,
            trace_dir=job.trace_dir,
            share=(job.index, job.count),
        )
        return os.getpid(), os.getpriority(os.PRIO_PROCESS, 0)

    def go(self, t0_ns: int) -> None:
        assert self._generator is not None
        self._cpu0 = time.process_time_ns()
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
        self._generator.start(_OneLog(self._log), t0_ns)

    def _sample_cpu(self) -> None:
        sample = self._host_cpu.sample()
        if sample.system_pct is not None:
            self._node_cpu.append(sample.system_pct)
        if sample.steal_pct is not None:
            self._steal.append(sample.steal_pct)

    def _take(self) -> _Buffers:
        import numpy as np

        buffers = self._log._swap()
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
        worker left out."""
        if self._processes is None:
            return []
        started, before = self._processes
        elapsed = max(time.monotonic() - started, 1e-3)
        after = _process_cpu()
        used = sorted(
            (
                (round(100 * (cpu - before[pid][1]) / elapsed, 1), pid, name)
                for pid, (name, cpu) in after.items()
                if pid in before and pid != os.getpid()
            ),
            reverse=True,
        )
        return [
            {"pid": pid, "name": name, "cpu_pct": pct}
            for pct, pid, name in used[:NEIGHBOURS]
            if pct >= NEIGHBOUR_PCT
        ]

    def take(self) -> tuple[_Buffers, int, int, int, str | None]:
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
            "cpu_ns": time.process_time_ns() - self._cpu0,
            "t0_wall_ns": self._t0_wall_ns,
        }


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
    pid: int | None = None  # on its node
    nice: int = 0  # the niceness its sending thread ran at


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
    shipped: tuple[str, ...] = ()  # each worker's own histogram of what it handed over
    shipped_errors: int = 0
    t0_wall_ns: tuple[int, ...] = ()
    # The node's CPUs (all cores, 0..100) sampled ~2/s while it sent: mean, highest, stolen.
    node_cpu_pct: float | None = None
    node_cpu_max_pct: float | None = None
    steal_pct: float | None = None
    worker_nice: int = 0  # the highest niceness its workers' sending threads ran at
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
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        self._recipe, self._load, self._cluster = recipe, load, cluster
        self._classify, self._timeout_s, self._seed = classify, timeout_s, seed
        self._trace_dir = trace_dir
        self._clock = clock
        self._open_loop = mode_of(load).open_loop
        self._workers: list[_Worker] = []
        self._offsets: dict[str, ClockOffset] = {}
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
    def worker_pids(self) -> list[tuple[str, int | None]]:
        """(node name, pid on that node) of each worker, once started."""
        return [(w.node.name, w.pid) for w in self._workers]

    def start(self, collector: Collector) -> None:
        ray = _ray()
        hosts = self._cluster.hosts
        actor_class = ray.remote(LoadWorker)
        count = hosts.nodes * hosts.workers_per_node
        try:
            for node in self._cluster.nodes:
                for _ in range(hosts.workers_per_node):
                    index = len(self._workers)
                    job = _Job(
                        self._recipe,
                        self._load,
                        index,
                        count,
                        self._timeout_s,
                        self._seed,
                        self._trace_dir,
                        self._classify,
                    )
                    actor = actor_class.options(
                        scheduling_strategy=_affinity(node.node_id),
                        num_cpus=hosts.cpus_per_worker,
                        max_restarts=0,
                    ).remote(job)
                    inbox = InboxLog()
                    collector.new_log(inbox, source=node.name)
                    self._workers.append(_Worker(node, index, actor, inbox))
            started = self._call_all(lambda w: w.actor.prepare.remote(), "start")
            for worker, (pid, nice) in zip(self._workers, started, strict=True):
                worker.pid, worker.nice = int(pid), int(nice)
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
        ray = _ray()
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

    def _ship(self, worker: _Worker, buffers: _Buffers) -> None:
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
        ray = _ray()
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
        ray = _ray()
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

    def _kill(self) -> None:
        with contextlib.suppress(Exception):
            ray = _ray()
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
