"""How a process tree used the CPU between two moments: user and system time, context switches
and the busiest threads, from two snapshots of psutil's counters (docs/run-json.md
"evidence").

A snapshot reads every thread of every process of the tree, so it is taken twice per run (when
the measured phase starts and when it ends, by the resource sampler's thread), never per sample.
Context switches are counted thread by thread (/proc/PID/task/TID/status): a process's own
/proc/PID/status counts its main thread's only, which in optlab mostly sleeps.

In optlab's own process a thread is named by Python when it is one of Python's threads; any
other is a native thread, started by a C library (OpenBLAS's or OpenMP's pool under numpy or
torch, onnxruntime's): the kernel names it after the process, so its `comm` would pass it off
as the interpreter's. It is named `native thread TID (LIBRARY)`, the library being the thread
pool library the process has loaded (all of those loaded when more than one is).

Each figure is divided by the span between its own two reads (the clock is read right before
the counter): reading the threads' /proc files hands the GIL back and forth, and while a target
holds the GIL one snapshot can take seconds. A clock read once, after all of them, made the span
look short and the CPU high (1.87 cores for a process getrusage put at 1.02). On Linux each
thread's counters are read with a clock of their own (the file opened first, the clock read
right before the read, whose system call runs at once): a clock read once before all the
threads was 150-230 ms early for a spinning thread read after 300 idle ones, and put a spinning
thread at 114.6% of one core beside a loaded machine.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass

import psutil

__all__ = [
    "ProcessSnapshot",
    "ProcessUsage",
    "ThreadSnapshot",
    "TreeSnapshot",
    "snapshot_tree",
    "usage_between",
]

BUSY_THREAD_PCT = 1.0  # threads below this share of one core are left out of `threads`
BUSIEST_THREADS = 8


@dataclass(frozen=True)
class ThreadSnapshot:
    name: str
    cpu_s: float  # user + system
    ctx_voluntary: int | None
    ctx_involuntary: int | None
    at_s: float | None = None  # time.perf_counter() right before its counters were read


@dataclass(frozen=True)
class ProcessSnapshot:
    name: str
    created: float  # psutil's create_time: with the pid, which process this is
    user_s: float
    system_s: float
    # The whole process's switches, where the host gives them per process (not Linux, whose
    # per-process figure is the main thread's: there the threads' own counts are summed).
    ctx_voluntary: int | None
    ctx_involuntary: int | None
    rss_bytes: int | None
    threads: dict[int, ThreadSnapshot]
    # time.perf_counter() right before the process's times and right before its threads'
    # were read: each figure is divided by the span of its own reads (module docstring).
    read_at_s: float = 0.0
    threads_at_s: float = 0.0


@dataclass(frozen=True)
class TreeSnapshot:
    at_s: float  # time.perf_counter() when it was taken
    root_pid: int
    processes: dict[int, ProcessSnapshot]

    @property
    def rss_bytes(self) -> int | None:
        """The tree's resident memory; None when no process's could be read."""
        return self.rss_without(())

    def rss_without(self, pids: Collection[int]) -> int | None:
        """The tree's resident memory without these processes' (a measuring tool's)."""
        found = [
            p.rss_bytes
            for pid, p in self.processes.items()
            if p.rss_bytes is not None and pid not in pids
        ]
        return sum(found) if found else None


@dataclass(frozen=True)
class ProcessUsage:
    """A tree's use of the CPU over a span: percentages of ONE core, switches per second."""

    cpu_user_pct: float
    cpu_system_pct: float
    ctx_voluntary_per_s: float | None
    ctx_involuntary_per_s: float | None
    threads: tuple[tuple[str, float], ...]  # (name, percent of one core), busiest first


def snapshot_tree(procs: list[psutil.Process], root_pid: int) -> TreeSnapshot:
    """The counters of `procs` (a tree rooted at `root_pid`) now; unreadable processes are
    left out, unreadable figures are None."""
    found: dict[int, ProcessSnapshot] = {}
    at_s = time.perf_counter()
    for proc in sorted(procs, key=lambda p: p.pid != root_pid):  # the root first
        snap = _snapshot(proc)
        if snap is not None:
            found[proc.pid] = snap
    root = found.get(root_pid)
    return TreeSnapshot(root.read_at_s if root is not None else at_s, root_pid, found)


def _snapshot(proc: psutil.Process) -> ProcessSnapshot | None:
    try:
        with proc.oneshot():
            read_at_s = time.perf_counter()
            times = proc.cpu_times()
            threads_at_s = time.perf_counter()
            threads = proc.threads()
            created = proc.create_time()
            name = proc.name()
            voluntary: int | None
            involuntary: int | None
            try:
                ctx = proc.num_ctx_switches()
                voluntary, involuntary = int(ctx.voluntary), int(ctx.involuntary)
            except (psutil.Error, NotImplementedError, AttributeError):
                voluntary = involuntary = None
            try:
                rss: int | None = int(proc.memory_info().rss)
            except psutil.Error:
                rss = None
    except psutil.Error:
        return None
    names = _thread_names(proc.pid)
    # (the main thread's comm, the thread-pool libraries): read once a native thread is met
    native: tuple[str, str] | None = None
    found: dict[int, ThreadSnapshot] = {}
    for thread in threads:
        tid = thread.id
        if tid in names or proc.pid != os.getpid():
            thread_name = names.get(tid) or _comm(proc.pid, tid)
        else:
            if native is None:
                native = (_comm(proc.pid, proc.pid), _thread_pools())
            thread_name = _native_name(tid, _comm(proc.pid, tid), *native)
        thread_voluntary, thread_involuntary = _thread_switches(proc.pid, tid)
        own = _thread_cpu(proc.pid, tid)
        cpu, at_s = own if own is not None else (thread.user_time + thread.system_time, None)
        found[tid] = ThreadSnapshot(
            thread_name, float(cpu), thread_voluntary, thread_involuntary, at_s
        )
    return ProcessSnapshot(
        name=name,
        created=float(created),
        user_s=float(times.user),
        system_s=float(times.system),
        ctx_voluntary=voluntary,
        ctx_involuntary=involuntary,
        rss_bytes=rss,
        threads=found,
        read_at_s=read_at_s,
        threads_at_s=threads_at_s,
    )


def _thread_names(pid: int) -> dict[int, str]:
    """Python's names of this process's threads (the kernel's `comm` cuts them at 15
    characters, and most are "python3")."""
    if pid != os.getpid():
        return {}
    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}


# Thread-pool libraries by a part of their file's name, as /proc/self/maps lists it.
THREAD_POOLS = (
    ("openblas", "OpenBLAS"),
    ("libmkl", "MKL"),
    ("libgomp", "OpenMP"),
    ("libiomp", "OpenMP"),
    ("libomp", "OpenMP"),
    ("libblis", "BLIS"),
    ("libtbb", "TBB"),
    ("onnxruntime", "onnxruntime"),
)


def _thread_pools() -> str:
    """The thread-pool libraries this process has loaded ("" when none is known, or unknown)."""
    found: list[str] = []
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as handle:
            files = {line.rsplit("/", 1)[-1].strip().lower() for line in handle if "/" in line}
    except OSError:
        return ""
    for part, library in THREAD_POOLS:
        if library not in found and any(part in f for f in files):
            found.append(library)
    return ", ".join(found)


def _native_name(tid: int, comm: str, main_comm: str, pools: str) -> str:
    """A thread of optlab's process that Python did not start: named for what started it."""
    if comm and comm != main_comm and not comm.startswith("thread "):
        return f"native thread {tid} ({comm})"  # the library named it
    return f"native thread {tid} ({pools or 'a C library'})"


def _comm(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8", errors="replace") as handle:
            return handle.read().strip() or f"thread {tid}"
    except OSError:
        return f"thread {tid}"


_TICKS_PER_S = float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


def _thread_cpu(pid: int, tid: int) -> tuple[float, float] | None:
    """(user + system seconds, the clock right before they were read) of one thread, from
    /proc/PID/task/TID/stat; None where there is no such file (not Linux, the thread ended)."""
    try:
        fd = os.open(f"/proc/{pid}/task/{tid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        at_s = time.perf_counter()
        raw = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # The fields after the command name (in parentheses, which may hold spaces): state is
    # the 3rd field of the line, utime the 14th and stime the 15th.
    fields = raw[raw.rfind(b")") + 2 :].split()
    try:
        return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S, at_s
    except (IndexError, ValueError):
        return None


def _thread_switches(pid: int, tid: int) -> tuple[int | None, int | None]:
    """(voluntary, involuntary) context switches of one thread; None where /proc has none."""
    voluntary = involuntary = None
    try:
        with open(f"/proc/{pid}/task/{tid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("voluntary_ctxt_switches:"):
                    voluntary = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches:"):
                    involuntary = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None, None
    return voluntary, involuntary


def usage_between(start: TreeSnapshot, end: TreeSnapshot) -> ProcessUsage | None:
    """What the tree used from `start` to `end`; None when the span is empty or the root
    process is missing from either snapshot.

    A process or thread that appeared in between counts with all its CPU (it is the span's); one
    that ended in between is lost (its counters went with it), so the figures are a floor.
    """
    wall = end.at_s - start.at_s
    root_before, root_after = start.processes.get(start.root_pid), end.processes.get(end.root_pid)
    if wall <= 0 or root_before is None or root_after is None:
        return None
    user = system = 0.0
    voluntary: int | None = 0
    involuntary: int | None = 0
    threads: list[tuple[str, float]] = []
    for pid, after in end.processes.items():
        before = start.processes.get(pid)
        if before is None or after.created > before.created:  # new, or a reused pid
            before = _EMPTY
        user += max(0.0, after.user_s - before.user_s)
        system += max(0.0, after.system_s - before.system_s)
        per_thread = [t.ctx_voluntary for t in after.threads.values()]
        if per_thread and None not in per_thread:
            switches = _thread_switch_deltas(before, after)
        else:
            switches = (
                _delta(after.ctx_voluntary, before.ctx_voluntary),
                _delta(after.ctx_involuntary, before.ctx_involuntary),
            )
        voluntary = _add(voluntary, switches[0])
        involuntary = _add(involuntary, switches[1])
        for tid, thread in after.threads.items():
            was = before.threads.get(tid)
            if was is not None and thread.cpu_s < was.cpu_s:
                was = None  # a new thread under a reused id: all its CPU is the span's
            spent = thread.cpu_s - (was.cpu_s if was is not None else 0.0)
            span = _thread_span(before, after, was, thread, wall)
            label = thread.name if pid == end.root_pid else f"{thread.name} (pid {pid})"
            threads.append((label, 100.0 * spent / (span if span > 0 else wall)))
    busiest = sorted((t for t in threads if t[1] >= BUSY_THREAD_PCT), key=lambda t: -t[1])
    return ProcessUsage(
        cpu_user_pct=100.0 * user / wall,
        cpu_system_pct=100.0 * system / wall,
        ctx_voluntary_per_s=None if voluntary is None else voluntary / wall,
        ctx_involuntary_per_s=None if involuntary is None else involuntary / wall,
        threads=tuple(busiest[:BUSIEST_THREADS]),
    )


_EMPTY = ProcessSnapshot("", 0.0, 0.0, 0.0, 0, 0, None, {})


def _thread_span(
    before: ProcessSnapshot,
    after: ProcessSnapshot,
    was: ThreadSnapshot | None,
    thread: ThreadSnapshot,
    wall: float,
) -> float:
    """The seconds a thread's CPU delta is divided by: between its own two reads where both
    were clocked (from the first snapshot's thread reads for a thread new in the span), else
    between the process's thread reads; the tree's span for a process new in it."""
    if before is _EMPTY:
        return wall
    end = thread.at_s if thread.at_s is not None else after.threads_at_s
    if was is None:
        return end - before.threads_at_s
    return end - (was.at_s if was.at_s is not None else before.threads_at_s)


def _thread_switch_deltas(
    before: ProcessSnapshot, after: ProcessSnapshot
) -> tuple[int | None, int | None]:
    """The switches of the process's threads over the span, summed (a thread that ended in it
    is lost; one that began in it counts whole)."""
    voluntary: int | None = 0
    involuntary: int | None = 0
    for tid, thread in after.threads.items():
        was = before.threads.get(tid)
        if was is not None and thread.cpu_s < was.cpu_s:
            was = None  # a reused thread id
        voluntary = _add(voluntary, _delta(thread.ctx_voluntary, was.ctx_voluntary if was else 0))
        involuntary = _add(
            involuntary, _delta(thread.ctx_involuntary, was.ctx_involuntary if was else 0)
        )
    return voluntary, involuntary


def _delta(after: int | None, before: int | None) -> int | None:
    return None if after is None or before is None else max(0, after - before)


def _add(total: int | None, delta: int | None) -> int | None:
    """A running sum that becomes None once any part was unknown."""
    return None if total is None or delta is None else total + delta
