"""Background sampling of CPU, memory and GPU use while a run is going on, about once a second.

CPU percentages are computed from our own deltas of ``cpu_times`` rather than psutil's
``cpu_percent``: the latter keeps its previous sample in module-global state, so any other caller
in the process (a library, a second sampler) would silently shorten our interval.

GPU figures come from NVML, imported only when a sampler starts. When NVML cannot be initialised
(no driver, no GPU) every GPU field is None: a missing reading is never replaced by a made-up one.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psutil

__all__ = [
    "THERMAL_REASONS",
    "GpuReading",
    "ResourceReading",
    "ResourceSampler",
    "decode_throttle_reasons",
]

# Reasons that mean the clocks were lowered because of heat; any of them invalidates a run.
THERMAL_REASONS = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown"})

# NVML renamed "ClocksThrottleReason" to "ClocksEventReason" (driver 535 era); accept both.
_REASON_PREFIXES = ("nvmlClocksEventReason", "nvmlClocksThrottleReason")
_NOT_A_REASON = {"All", "None"}


@dataclass(frozen=True)
class GpuReading:
    index: int
    util_pct: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    temperature_c: float | None
    power_w: float | None
    sm_clock_mhz: float | None
    throttle_reasons: list[str] | None  # active reasons, e.g. ["hw_thermal_slowdown"]


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
    # A service optlab started (a command target): its process tree, apart from optlab's.
    service_cpu_pct: float | None = None
    service_rss_bytes: int | None = None
    # The machine taken away: CPU stolen by the hypervisor (all cores, 0..100, where
    # /proc/stat reports it), and CPU used by processes outside the run (percent of one
    # core, like cpu_process_pct): a neighbour competing for the same cores.
    steal_pct: float | None = None
    other_cpu_pct: float | None = None


def _snake(camel: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", camel).lower()


def _reason_table(nvml: ModuleType) -> list[tuple[int, str]]:
    table: dict[int, str] = {}
    for prefix in _REASON_PREFIXES:
        for attr in dir(nvml):
            if not attr.startswith(prefix):
                continue
            suffix = attr[len(prefix) :]
            value = getattr(nvml, attr)
            if suffix in _NOT_A_REASON or not isinstance(value, int) or value <= 0:
                continue
            # Only single-bit constants are reasons; composite masks would double-report.
            if value & (value - 1) == 0:
                table.setdefault(value, _snake(suffix))
    return sorted(table.items())


def decode_throttle_reasons(mask: int, nvml: ModuleType | None = None) -> list[str]:
    """Names of the reasons set in an NVML clocks-event bitmask, using pynvml's constants."""
    if nvml is None:
        import pynvml

        nvml = pynvml
    table = _reason_table(nvml)
    names = [name for bit, name in table if mask & bit]
    known = 0
    for bit, _ in table:
        known |= bit
    if mask & ~known:
        names.append(f"unknown_0x{mask & ~known:x}")
    return names


class _Nvml:
    """The NVML handles of one sampler; every query degrades to None on its own."""

    def __init__(self, nvml: ModuleType, handles: list[Any]) -> None:
        self.nvml = nvml
        self.handles = handles

    @classmethod
    def open(cls) -> _Nvml | None:
        try:
            import pynvml
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
        except Exception:  # NVMLError, or OSError when the library itself is missing
            return None
        try:
            count = pynvml.nvmlDeviceGetCount()
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except Exception:
            _shutdown(pynvml)
            return None
        if not handles:
            _shutdown(pynvml)
            return None
        return cls(pynvml, handles)

    def close(self) -> None:
        _shutdown(self.nvml)

    def read(self) -> list[GpuReading]:
        return [self._read_one(i, h) for i, h in enumerate(self.handles)]

    def _query(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, fn)(*args)
        except Exception:  # not supported on this GPU / transient: report the field as missing
            return None

    def _read_one(self, index: int, handle: Any) -> GpuReading:
        nvml = self.nvml
        util = self._query("nvmlDeviceGetUtilizationRates", handle)
        memory = self._query("nvmlDeviceGetMemoryInfo", handle)
        temperature = self._query("nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)
        power_mw = self._query("nvmlDeviceGetPowerUsage", handle)
        clock = self._query("nvmlDeviceGetClockInfo", handle, nvml.NVML_CLOCK_SM)
        mask = None
        for fn in (
            "nvmlDeviceGetCurrentClocksEventReasons",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        ):
            if hasattr(nvml, fn):
                mask = self._query(fn, handle)
                if mask is not None:
                    break
        return GpuReading(
            index=index,
            util_pct=None if util is None else float(util.gpu),
            mem_used_bytes=None if memory is None else int(memory.used),
            mem_total_bytes=None if memory is None else int(memory.total),
            temperature_c=None if temperature is None else float(temperature),
            power_w=None if power_mw is None else float(power_mw) / 1000.0,
            sm_clock_mhz=None if clock is None else float(clock),
            throttle_reasons=None if mask is None else decode_throttle_reasons(int(mask), nvml),
        )


def _shutdown(nvml: ModuleType) -> None:
    with contextlib.suppress(Exception):
        nvml.nvmlShutdown()


def _busy(times: Any) -> tuple[float, float, float]:
    """(busy, total, iowait) seconds from a psutil cpu_times tuple; iowait counts as idle."""
    total = float(sum(times))
    idle = float(times.idle) + float(getattr(times, "iowait", 0.0))
    return total - idle, total, float(getattr(times, "iowait", 0.0))


def _pct(part: float, whole: float) -> float:
    return max(0.0, min(100.0, 100.0 * part / whole)) if whole > 0 else 0.0


CHILDREN_REFRESH_S = 5.0  # how often new child processes are looked for
# Phases at whose start every process's CPU is noted: the measured span's neighbours.
NEIGHBOUR_SNAPSHOTS = ("measure", "drain")


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
        self._nvml: _Nvml | None = None
        self._process: psutil.Process | None = None
        self._procs: dict[int, psutil.Process] = {}
        self._own_cpu = _TreeCpu()
        self._prev_cores: list[Any] | None = None
        self._last_sample = 0.0
        self.started_ns: int | None = None  # perf_counter_ns at start(), to align t_s with runs
        # A service optlab started: sampled as its own tree, and left out of optlab's figures.
        self._service: psutil.Process | None = None
        self._service_procs: dict[int, psutil.Process] = {}
        self._service_cpu = _TreeCpu()
        self._trees_at = -CHILDREN_REFRESH_S
        # CPU seconds of every process outside the run, when the measured phase started and
        # when it ended: who else used the machine (see `neighbours`).
        self._snapshot_due: str | None = None
        self._snapshots: dict[str, tuple[float, float, dict[int, tuple[str, float, float]]]] = {}

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
        self._nvml = _Nvml.open()
        self.started_ns = time.perf_counter_ns()
        # The first sample only establishes baselines for the CPU deltas.
        self._cpu_process_pct()
        self._cpu_host()
        self._service_cpu_pct()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="optlab-resources", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and join the thread; takes a last reading if a useful interval has passed."""
        thread = self._thread
        if thread is None:
            return
        self._stop.set()
        thread.join()
        self._thread = None
        if time.perf_counter() - self._last_sample >= 0.2 * self.interval_s:
            self._sample()
        with self._lock:
            due, self._snapshot_due = self._snapshot_due, None
        if due is not None:  # the run ended before the next sample
            self._snapshot(due)
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    def track_service(self, pid: int) -> None:
        """Sample the process tree of `pid` separately (call before start())."""
        try:
            self._service = psutil.Process(pid)
        except psutil.Error:
            self._service = None
        self._trees_at = -CHILDREN_REFRESH_S

    def _run(self) -> None:
        deadline = time.perf_counter() + self.interval_s
        # A fixed schedule rather than sleep(interval) so slow NVML calls do not add drift.
        while not self._stop.wait(max(0.0, deadline - time.perf_counter())):
            self._sample()
            deadline += self.interval_s
            now = time.perf_counter()
            if deadline < now:  # fell behind (suspended host): skip rather than burst
                deadline = now + self.interval_s

    def set_phase(self, phase: str) -> None:
        with self._lock:
            self._phase = phase
            if phase in NEIGHBOUR_SNAPSHOTS:
                # Taken by the sampler's thread at its next sample: a scan of every process
                # on the caller's thread would stall the load right as the phase starts.
                self._snapshot_due = phase

    # -- results -------------------------------------------------------------------------------

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
        (percent of one core over the measured phase), most first; [] when unknown."""
        with self._lock:
            start = self._snapshots.get("measure")
            end = self._snapshots.get("drain")
        if start is None or end is None or end[0] <= start[0]:
            return []
        wall = end[0] - start[0]
        used: list[dict[str, Any]] = []
        for pid, (name, cpu, created) in end[2].items():
            before = start[2].get(pid)
            if before is not None and before[0] == name and before[2] == created:
                spent = cpu - before[1]
            elif before is None or created > before[2]:
                # Started during the phase (or a pid reused by a newer process): all its CPU
                # is the phase's. Judged against the first scan, not the wall clock: psutil's
                # start times can be a second off it (boot time in whole seconds).
                spent = cpu
            else:
                continue
            pct = 100.0 * spent / wall
            if pct >= least_pct:
                used.append({"name": name, "pid": pid, "cpu_pct": round(pct, 1)})
        used.sort(key=lambda entry: -float(entry["cpu_pct"]))
        return used[:most]

    # -- sampling ------------------------------------------------------------------------------

    def _sample(self) -> None:
        now = time.perf_counter()
        self._last_sample = now
        cpu_process = self._cpu_process_pct()
        cpu_system, per_core, iowait, steal, busy_cores = self._cpu_host()
        rss = self._rss()
        service_cpu = self._service_cpu_pct()
        other_cpu = None
        if busy_cores is not None and cpu_process is not None:
            other_cpu = max(0.0, 100.0 * busy_cores - cpu_process - (service_cpu or 0.0))
        with self._lock:
            due, self._snapshot_due = self._snapshot_due, None
        if due is not None:
            self._snapshot(due)
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

    def _cpu_host(
        self,
    ) -> tuple[float | None, list[float] | None, float | None, float | None, float | None]:
        """(system %, per-core %, iowait %, steal % or None, cores busy running processes)."""
        try:
            cores = psutil.cpu_times(percpu=True)
        except (OSError, psutil.Error):
            return None, None, None, None, None
        previous, self._prev_cores = self._prev_cores, cores
        if previous is None or len(previous) != len(cores):
            return None, None, None, None, None
        per_core: list[float] = []
        busy_sum = total_sum = iowait_sum = steal_sum = 0.0
        for before, after in zip(previous, cores, strict=True):
            b0, t0, w0 = _busy(before)
            b1, t1, w1 = _busy(after)
            per_core.append(_pct(b1 - b0, t1 - t0))
            busy_sum += b1 - b0
            total_sum += t1 - t0
            iowait_sum += w1 - w0
            steal_sum += float(getattr(after, "steal", 0.0)) - float(getattr(before, "steal", 0.0))
        has_steal = hasattr(cores[0], "steal")
        # Busy minus stolen: the time this machine's processes really ran, in cores.
        running = (busy_sum - steal_sum) / total_sum * len(cores) if total_sum > 0 else None
        return (
            _pct(busy_sum, total_sum),
            per_core,
            _pct(iowait_sum, total_sum),
            _pct(steal_sum, total_sum) if has_steal else None,
            running,
        )

    def _snapshot(self, phase: str) -> None:
        """CPU seconds of every process outside the run (optlab's tree and the service's)."""
        inside = {self.pid, *self._procs, *self._service_procs}
        seen: dict[int, tuple[str, float, float]] = {}
        for proc in psutil.process_iter(["name", "cpu_times", "create_time"]):
            info = proc.info
            times, created = info.get("cpu_times"), info.get("create_time")
            if proc.pid in inside or times is None or created is None:
                continue
            name = str(info.get("name") or "?")
            seen[proc.pid] = (name, float(times.user + times.system), float(created))
        with self._lock:
            self._snapshots[phase] = (time.perf_counter(), time.time(), seen)

    def _rss(self) -> int | None:
        return self._tree_rss(self._tracked())

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


class _TreeCpu:
    """CPU used by a process tree between two samples, in percent of one core."""

    def __init__(self) -> None:
        self._previous: dict[int, float] = {}
        self._wall = 0.0

    def sample(self, procs: list[psutil.Process], root_pid: int) -> float | None:
        wall = time.perf_counter()
        seen: dict[int, float] = {}
        for proc in procs:
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            seen[proc.pid] = float(times.user + times.system)
        elapsed = wall - self._wall
        previous, self._previous, self._wall = self._previous, seen, wall
        if root_pid not in seen or elapsed <= 0 or not previous:
            return None
        # Only processes present in both samples: a newcomer's lifetime CPU is not this interval's.
        used = sum(max(0.0, cpu - previous[pid]) for pid, cpu in seen.items() if pid in previous)
        return 100.0 * used / elapsed
