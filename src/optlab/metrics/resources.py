"""Background sampling of CPU, memory and GPU use while a run is going on, about once a second.

CPU figures come from `optlab.metrics.cpu` (our own deltas of psutil's CPU times), GPU figures
from NVML through `optlab.metrics.gpu`; a reading the host cannot give is None. At the start of
the measured phase, at its middle and at the drain's, the sampler also notes every other
process's CPU time, so that a run can name the neighbours that competed with it, and those that
came or went halfway when its halves disagree (`optlab.metrics.neighbours`), and the counters
of optlab's own process tree and of the target's service (`optlab.metrics.usage`): how each
used the CPU over the measured phase. Those snapshots are taken by the sampler's thread, woken
for them at once; the trees' at the drain on the caller's thread (the load's threads end a
moment later). In between, a child process (`optlab.metrics.procwatch`) notes every process's
CPU twice a second, so that a neighbour that exited before the phase's end is named too.

A service is a process tree apart from optlab's, the target's own: a command target's process,
or the process listening on an http target's port on this host. It is never a neighbour, and
neither is any descendant of optlab's process or of the service.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

import psutil

from optlab.metrics.cpu import HostCpu, TreeCpu
from optlab.metrics.gpu import THERMAL_REASONS, GpuReading, NvmlDevices
from optlab.metrics.neighbours import Other, Scan, busiest, changed_halves
from optlab.metrics.procwatch import ProcessWatch, Seen
from optlab.metrics.usage import ProcessUsage, TreeSnapshot, snapshot_tree, usage_between

__all__ = ["MIDDLE", "ResourceReading", "ResourceSampler"]


@dataclass(frozen=True)
class ResourceReading:
    t_s: float  # seconds since the sampler started (monotonic clock)
    phase: str
    cpu_process_pct: float | None  # percent of ONE core, so it can exceed 100 (like top)
    cpu_system_pct: float | None  # all cores together, 0..100
    cpu_per_core: list[float] | None
    rss_bytes: int | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    iowait_pct: float | None
    gpus: list[GpuReading] | None
    # The target's service (a command target's, an http target's on this host): its process
    # tree, apart from optlab's.
    service_cpu_pct: float | None = None
    service_rss_bytes: int | None = None
    # The machine taken away: CPU stolen by the hypervisor (all cores, 0..100, where
    # /proc/stat reports it), and CPU used by processes outside the run (percent of one
    # core, like cpu_process_pct): a neighbour competing for the same cores.
    steal_pct: float | None = None
    other_cpu_pct: float | None = None


CHILDREN_REFRESH_S = 5.0  # how often new child processes are looked for
# Phases at whose start every process's CPU is noted: the measured span's neighbours.
NEIGHBOUR_SNAPSHOTS = ("measure", "drain")
MIDDLE = "middle"  # the snapshot halfway through the measured phase (no phase of its own)
# The phase whose start reads optlab's and the service's trees on the caller's thread, at
# once: the load has stopped being measured, and a moment later its threads are gone, their
# counters with them.
AT_ONCE = "drain"


class ResourceSampler:
    """Samples the process (and its children), the host and the GPUs every ``interval_s``."""

    def __init__(
        self, interval_s: float = 1.0, pid: int | None = None, children: bool = True
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.interval_s = interval_s
        self.pid = os.getpid() if pid is None else pid
        self.children = children
        self._lock = threading.Lock()
        self._readings: list[ResourceReading] = []
        self._phase = "setup"
        self._peak_rss: int | None = None
        self._thermal = False
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        # Set to end the thread's wait early: on stop(), and when a phase's snapshot is due.
        self._wake = threading.Event()
        self._nvml: NvmlDevices | None = None
        self._process: psutil.Process | None = None
        self._procs: dict[int, psutil.Process] = {}
        self._own_cpu = TreeCpu()
        self._host_cpu = HostCpu()
        self._last_sample = 0.0
        self.started_ns: int | None = None  # perf_counter_ns at start(), to align t_s with runs
        # A service optlab started: sampled as its own tree, and left out of optlab's figures.
        self._service: psutil.Process | None = None
        self._service_procs: dict[int, psutil.Process] = {}
        self._service_cpu = TreeCpu()
        self._trees_at = -CHILDREN_REFRESH_S
        # CPU seconds of every process outside the run, when the measured phase started and
        # when it ended: who else used the machine (see `neighbours`); and the counters of
        # optlab's tree and the service's at the same moments (see `usage`).
        self._snapshots_due: list[str] = []
        self._snapshots: dict[str, Scan] = {}
        self._trees: dict[str, tuple[TreeSnapshot | None, TreeSnapshot | None]] = {}
        # Every process seen in between (the watcher's last reading of each), and every pid
        # that was ever part of optlab's tree or the service's: never a neighbour.
        self._watch: ProcessWatch | None = None
        self._watched: list[Seen] = []
        self._inside_ever: set[int] = set()
        # Measuring tools optlab starts (the process watch): their CPU is optlab's, but their
        # memory is no part of the run's: one started with the measured phase would read as
        # ~20 MiB of growth over it (docs/diagnose.md, memory-leak).
        self._tools: set[int] = set()

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Prime the counters, open NVML and start the daemon thread (first reading after one
        interval). ``gpu_available`` is settled when this returns."""
        if self._thread is not None:
            raise RuntimeError("sampler already started")
        try:
            self._process = psutil.Process(self.pid)
        except psutil.Error:
            self._process = None
        self._nvml = NvmlDevices.open()
        self.started_ns = time.perf_counter_ns()
        # The first sample only establishes baselines for the CPU deltas.
        self._cpu_process_pct()
        self._host_cpu.sample()
        self._service_cpu_pct()
        self._stop.clear()
        self._wake.clear()
        self._thread = threading.Thread(target=self._run, name="optlab-resources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread; takes a last reading if a useful interval has passed."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        self._wake.set()
        thread.join()
        self._thread = None
        if time.perf_counter() - self._last_sample >= 0.2 * self.interval_s:
            self._sample()
        self._take_due_snapshots()  # the run ended before the thread took them
        self._stop_watch()  # a run that never reached its drain
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    def track_service(self, pid: int) -> None:
        """Sample the process tree of `pid` separately, as the target's (call before
        start()): its CPU is the service's, never a neighbour's."""
        try:
            self._service = psutil.Process(pid)
        except psutil.Error:
            self._service = None
        else:
            self._inside_ever.add(pid)
        self._trees_at = -CHILDREN_REFRESH_S

    def _run(self) -> None:
        deadline = time.perf_counter() + self.interval_s
        # A fixed schedule rather than sleep(interval) so slow NVML calls do not add drift.
        while True:
            self._wake.wait(max(0.0, deadline - time.perf_counter()))
            self._wake.clear()
            if self._stop.is_set():
                return
            self._take_due_snapshots()
            if time.perf_counter() < deadline:  # woken for a snapshot only
                continue
            self._sample()
            deadline += self.interval_s
            now = time.perf_counter()
            if deadline < now:  # fell behind (suspended host): skip rather than burst
                deadline = now + self.interval_s

    def set_phase(self, phase: str) -> None:
        if phase == AT_ONCE:
            self._snapshot_trees(phase, refresh=False)
        with self._lock:
            self._phase = phase
        if phase in NEIGHBOUR_SNAPSHOTS:
            self._snapshot_due(phase)

    def mark_middle(self) -> None:
        """Note every process's CPU now, the measured phase's middle (see `neighbour_halves`)."""
        self._snapshot_due(MIDDLE)

    def _snapshot_due(self, name: str) -> None:
        # Taken by the sampler's thread, woken for it: a scan of every process on the
        # caller's thread would stall the load right as the phase starts.
        with self._lock:
            self._snapshots_due.append(name)
            self._wake.set()

    # -- results -------------------------------------------------------------------------------

    def noted(self, snapshot: str) -> bool:
        """Whether every process's CPU was noted at `snapshot` ("measure", MIDDLE, "drain")."""
        with self._lock:
            return snapshot in self._snapshots

    def take(self) -> list[ResourceReading]:
        """Readings since the last take, oldest first."""
        with self._lock:
            taken, self._readings = self._readings, []
        return taken

    def peak_rss_bytes(self) -> int | None:
        with self._lock:
            return self._peak_rss

    @property
    def gpu_available(self) -> bool:
        return self._nvml is not None

    def thermal_throttling_seen(self) -> bool:
        with self._lock:
            return self._thermal

    def neighbours(self, least_pct: float = 5.0, most: int = 3) -> list[dict[str, Any]]:
        """The processes outside the run that used the most CPU while it was measured
        (percent of one core over the measured phase), most first; [] when unknown.

        A process that exited before the phase's end counts with the CPU it had used when the
        watcher last saw it (a floor). optlab's process, the service's, and every process
        either of them started are the run's own, never neighbours.
        """
        with self._lock:
            start = self._snapshots.get("measure")
            end = self._snapshots.get("drain")
            watched = list(self._watched)
        if start is None or end is None:
            return []
        return busiest(start, end, watched, self._own(), least_pct, most)

    def neighbour_halves(self, least_pct: float = 5.0, most: int = 3) -> list[dict[str, Any]]:
        """The processes outside the run whose CPU changed the most between the first and
        the second half of the measured phase (percent of one core in each, `first_pct` and
        `second_pct`), up to `most` each way, largest change first; [] when the middle was not
        noted (a run stopped before it). The middle is the planned one (`mark_middle`): the
        neighbour that arrived or left halfway, not the one that was busy all along."""
        with self._lock:
            start = self._snapshots.get("measure")
            middle = self._snapshots.get(MIDDLE)
            end = self._snapshots.get("drain")
            watched = list(self._watched)
        if start is None or middle is None or end is None:
            return []
        return changed_halves(start, middle, end, watched, self._own(), least_pct, most)

    def _own(self) -> tuple[set[int], set[int]]:
        """(inside, owners) for `optlab.metrics.neighbours`: the pids that are the run's, and
        those whose descendants are too (optlab's own only when its children are sampled)."""
        with self._lock:
            inside = {self.pid, *self._inside_ever}
        return inside, inside if self.children else inside - {self.pid}

    def usage(self, tree: Literal["process", "service"] = "process") -> ProcessUsage | None:
        """How optlab's process tree ("process") or the started service's ("service") used
        the CPU over the measured phase; None when unknown (no service, a snapshot missing,
        the process gone)."""
        with self._lock:
            start = self._trees.get("measure")
            end = self._trees.get("drain")
        if start is None or end is None:
            return None
        pick = 0 if tree == "process" else 1
        before, after = start[pick], end[pick]
        return None if before is None or after is None else usage_between(before, after)

    def tree_rss(self) -> list[tuple[float, int | None, int | None]]:
        """(seconds since start(), optlab's tree RSS, the service's) when the measured phase
        started and when it ended, as the usage snapshots read them."""
        started = self.started_ns / 1e9 if self.started_ns is not None else 0.0
        with self._lock:
            found = [self._trees[p] for p in NEIGHBOUR_SNAPSHOTS if p in self._trees]
            tools = set(self._tools)
        marks = []
        for own, service in found:
            at = own.at_s if own is not None else service.at_s if service is not None else None
            if at is not None:
                marks.append(
                    (
                        at - started,
                        own.rss_without(tools) if own is not None else None,
                        service.rss_bytes if service is not None else None,
                    )
                )
        return marks

    # -- sampling ------------------------------------------------------------------------------

    def _take_due_snapshots(self) -> None:
        with self._lock:
            due, self._snapshots_due = self._snapshots_due, []
        for phase in due:
            self._snapshot(phase)
            if phase == "measure" and self._watch is None:
                self._watch = ProcessWatch()
                if not self._watch.start():
                    self._watch = None
                elif self._watch.pid is not None:
                    with self._lock:  # the measuring tool, whoever's child it is
                        self._inside_ever.add(self._watch.pid)
                        self._tools.add(self._watch.pid)
            elif phase == "drain":
                self._stop_watch()

    def _stop_watch(self) -> None:
        watch, self._watch = self._watch, None
        seen = watch.stop() if watch is not None else None
        if seen:
            with self._lock:
                self._watched = seen

    def _sample(self) -> None:
        now = time.perf_counter()
        self._last_sample = now
        cpu_process = self._cpu_process_pct()
        cpu_system, per_core, iowait, steal, busy_cores = self._host_cpu.sample()
        rss = self._rss()
        service_cpu = self._service_cpu_pct()
        other_cpu = None
        if busy_cores is not None and cpu_process is not None:
            other_cpu = max(0.0, 100.0 * busy_cores - cpu_process - (service_cpu or 0.0))
        service_rss = self._tree_rss(self._service_tree()) if self._service is not None else None
        memory = psutil.virtual_memory()
        gpus = self._nvml.read() if self._nvml is not None else None
        thermal = any(THERMAL_REASONS.intersection(g.throttle_reasons or ()) for g in gpus or ())
        started = self.started_ns if self.started_ns is not None else time.perf_counter_ns()
        with self._lock:
            reading = ResourceReading(
                t_s=(time.perf_counter_ns() - started) / 1e9,
                phase=self._phase,
                cpu_process_pct=cpu_process,
                cpu_system_pct=cpu_system,
                cpu_per_core=per_core,
                rss_bytes=rss,
                # total - available: memory that new work could not get, page cache excluded.
                mem_used_bytes=int(memory.total - memory.available),
                mem_total_bytes=int(memory.total),
                iowait_pct=iowait,
                gpus=gpus,
                service_cpu_pct=service_cpu,
                service_rss_bytes=service_rss,
                steal_pct=steal,
                other_cpu_pct=other_cpu,
            )
            self._readings.append(reading)
            if rss is not None and (self._peak_rss is None or rss > self._peak_rss):
                self._peak_rss = rss
            self._thermal = self._thermal or thermal

    def _refresh_trees(self) -> None:
        """Find the children of optlab and of the service, at most every CHILDREN_REFRESH_S.

        Finding them scans every process in /proc; each read hands the GIL over and back, so
        a scan per sample slowed a busy HTTP load generator in this process by ~10%.
        """
        now = time.perf_counter()
        if now - self._trees_at < CHILDREN_REFRESH_S:
            return
        self._trees_at = now
        service: dict[int, psutil.Process] = {}
        if self._service is not None:
            try:
                kids = self._service.children(recursive=True)
            except psutil.Error:
                kids = []  # the service is gone: nothing of it to sample
            else:
                service[self._service.pid] = self._service
            for kid in kids:
                # Keep the Process objects: psutil identifies a process by pid + create time.
                service[kid.pid] = self._service_procs.get(kid.pid, kid)
        self._service_procs = service
        mine: dict[int, psutil.Process] = {}
        if self._process is not None and self.children:
            try:
                kids = self._process.children(recursive=True)
            except psutil.Error:
                kids = []
            for kid in kids:
                if kid.pid not in service:
                    mine[kid.pid] = self._procs.get(kid.pid, kid)
        self._procs = mine
        with self._lock:
            self._inside_ever.update(service, mine)

    def _tracked(self) -> list[psutil.Process]:
        if self._process is None:
            return []
        self._refresh_trees()
        return [self._process, *self._procs.values()]

    def _service_tree(self) -> list[psutil.Process]:
        self._refresh_trees()
        return list(self._service_procs.values())

    def _cpu_process_pct(self) -> float | None:
        return self._own_cpu.sample(self._tracked(), self.pid)

    def _service_cpu_pct(self) -> float | None:
        if self._service is None:
            return None
        return self._service_cpu.sample(self._service_tree(), self._service.pid)

    def _snapshot_trees(self, phase: str, refresh: bool = True) -> None:
        """The counters of optlab's tree and the service's (without `refresh`, the processes
        already known: off the sampler's thread, the trees are not searched again)."""
        if refresh:
            self._refresh_trees()
        own = service = None
        if self._process is not None:
            own = snapshot_tree([self._process, *self._procs.values()], self.pid)
        if self._service is not None:
            service = snapshot_tree(list(self._service_procs.values()), self._service.pid)
        with self._lock:
            self._trees.setdefault(phase, (own, service))

    def _snapshot(self, phase: str) -> None:
        """The counters of optlab's tree and the service's (unless taken already), then the
        CPU seconds of every process outside the run."""
        with self._lock:
            taken = phase in self._trees or phase == MIDDLE  # the trees: phases' ends only
        if not taken:
            self._snapshot_trees(phase)
        inside = {self.pid, *self._procs, *self._service_procs}
        seen: dict[int, Other] = {}
        for proc in psutil.process_iter(["ppid", "name", "cpu_times", "create_time"]):
            info = proc.info
            times, created = info.get("cpu_times"), info.get("create_time")
            if proc.pid in inside or times is None or created is None:
                continue
            name = str(info.get("name") or "?")
            ppid = info.get("ppid")
            seen[proc.pid] = (
                name,
                float(times.user + times.system),
                float(created),
                None if ppid is None else int(ppid),
            )
        with self._lock:
            self._snapshots[phase] = (time.perf_counter(), time.time(), seen)

    def _rss(self) -> int | None:
        with self._lock:
            tools = set(self._tools)
        return self._tree_rss([p for p in self._tracked() if p.pid not in tools])

    @staticmethod
    def _tree_rss(procs: list[psutil.Process]) -> int | None:
        total = None
        for proc in procs:
            try:
                rss = int(proc.memory_info().rss)
            except psutil.Error:
                continue
            total = rss if total is None else total + rss
        return total
