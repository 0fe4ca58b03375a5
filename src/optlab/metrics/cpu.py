"""CPU use from our own deltas of psutil's CPU times, for the host and for a process tree.

Percentages are computed from deltas between two samples rather than with psutil's
``cpu_percent``: the latter keeps its previous sample in module-global state, so any other
caller in the process (a library, a second sampler) would silently shorten our interval.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

import psutil

__all__ = ["HostCpu", "HostCpuSample", "TreeCpu"]


class HostCpuSample(NamedTuple):
    system_pct: float | None  # all cores together, 0..100
    per_core: list[float] | None
    iowait_pct: float | None
    steal_pct: float | None  # None where /proc/stat does not report it
    busy_cores: float | None  # cores busy running this machine's processes (stolen time out)


_UNKNOWN = HostCpuSample(None, None, None, None, None)


def _busy(times: Any) -> tuple[float, float, float]:
    """(busy, total, iowait) seconds from a psutil cpu_times tuple; iowait counts as idle."""
    total = float(sum(times))
    idle = float(times.idle) + float(getattr(times, "iowait", 0.0))
    return total - idle, total, float(getattr(times, "iowait", 0.0))


def _pct(part: float, whole: float) -> float:
    return max(0.0, min(100.0, 100.0 * part / whole)) if whole > 0 else 0.0


class HostCpu:
    """The host's CPU use since the previous sample; the first sample only sets the baseline."""

    def __init__(self) -> None:
        self._prev_cores: list[Any] | None = None

    def sample(self) -> HostCpuSample:
        try:
            cores = psutil.cpu_times(percpu=True)
        except (OSError, psutil.Error):
            return _UNKNOWN
        previous, self._prev_cores = self._prev_cores, cores
        if previous is None or len(previous) != len(cores):
            return _UNKNOWN
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
        return HostCpuSample(
            _pct(busy_sum, total_sum),
            per_core,
            _pct(iowait_sum, total_sum),
            _pct(steal_sum, total_sum) if has_steal else None,
            running,
        )


class TreeCpu:
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
