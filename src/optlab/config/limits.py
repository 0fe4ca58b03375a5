"""Load settings this machine can honour, checked when the experiment is loaded.

The schema's bounds are the same everywhere; what a machine can start is not. A built-in or
python target is driven by the threaded generator, one OS thread per request in flight
(load/generator.py), so `concurrency` or `max_in_flight` beyond the thread limits fails only
when the run starts ("can't start new thread", after tens of seconds of thread creation). An
http or command target is driven by coroutines on an event loop (load/aio.py), one socket per
request in flight, so the open-file limit binds. And one Python process schedules requests at a
bounded rate: far beyond it the run measures the generator, not the target.
"""

from __future__ import annotations

import math
import os
import resource
from pathlib import Path

from optlab.config.models import Workload
from optlab.config.modes import MAX_PROCESSES, mode_of
from optlab.config.source import SourceFile
from optlab.errors import ConfigError

# The most generator threads optlab starts: the closed loop's schema bound; past a few thousand,
# threads contend for the GIL far more than they drive the target.
MAX_THREADS = 4096
# Requests in flight per event-loop process: each holds a connection and its buffers.
MAX_IN_FLIGHT_ASYNC = 10_000
# Twice the highest rate one generator process reached on the reference machine (48,000/s,
# benchmarks/README.md, harness_overhead): further beyond it only the generator is measured.
MAX_RATE_PER_PROCESS = 100_000
# Threads and file descriptors optlab itself needs beside the generator's (collector, resource
# sampler, engine threads; the database, logs, the target's own files).
THREAD_MARGIN = 64
FD_MARGIN = 256


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    try:
        return int(text.split()[0])
    except (ValueError, IndexError):
        return None  # "max" (no cgroup limit) or an unexpected format


def _system_threads() -> int:
    """Threads now running on the machine: /proc/loadavg's fourth field is running/total."""
    try:
        return int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    except (OSError, ValueError, IndexError):
        return 0


def _own_threads() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 1


def thread_headroom() -> tuple[int, str] | None:
    """How many more threads this process may start, and the limit that says so; None when no
    limit can be read (not Linux)."""
    found: list[tuple[int, str]] = []
    used = _system_threads()
    for path, what in (
        ("/proc/sys/kernel/threads-max", "kernel.threads-max"),
        ("/proc/sys/kernel/pid_max", "kernel.pid_max"),
    ):
        value = _read_int(path)
        if value is not None and used:
            found.append((value - used, f"{what} = {value}, {used} threads already running"))
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    # The kernel does not hold root to RLIMIT_NPROC; the system-wide limits still apply.
    if soft != resource.RLIM_INFINITY and os.getuid() != 0:
        own = _own_threads()
        found.append((soft - own, f"RLIMIT_NPROC (ulimit -u) = {soft}"))
    for folder in ("/sys/fs/cgroup", "/sys/fs/cgroup/pids"):
        limit, current = _read_int(f"{folder}/pids.max"), _read_int(f"{folder}/pids.current")
        if limit is not None and current is not None:
            found.append((limit - current, f"cgroup pids.max = {limit}, {current} in use"))
    if not found:
        return None
    room, why = min(found)
    return max(0, room - THREAD_MARGIN), why


def check_load(workload: Workload, source: SourceFile, *, threaded: bool, kind: str) -> None:
    """Refuse a load this machine cannot start, naming the file, line, field and allowed range.
    `threaded`: the target runs inside optlab's process (builtin, python)."""
    load = workload.load
    mode = mode_of(load)
    # Threads serve every request in flight in this process; coroutines, one process's share.
    count = mode.in_flight_limit(load) if threaded else mode.in_flight_per_process(load)
    name = mode.in_flight_field(load)
    where = source.where(("workload", "load", name))
    field = f"workload.load.{name}"
    if threaded:
        cap, why = MAX_THREADS, f"optlab's limit of {MAX_THREADS} generator threads"
        headroom = thread_headroom()
        if headroom is not None and headroom[0] < cap:
            cap, why = headroom[0], f"this machine's thread limit ({headroom[1]})"
        if count > cap:
            raise ConfigError(
                f"{where}: {field}: {count} is more threads than optlab can start here: a "
                f"{kind} target is called from one thread per request in flight, and {why} "
                f"allows 1..{cap}",
                hint=f"set {field} to at most {cap}; for more requests in flight, serve the "
                "model (`optlab serve`) and measure it as a command or http target, which uses "
                "coroutines instead of threads",
            )
    else:
        cap, why = MAX_IN_FLIGHT_ASYNC, f"optlab's limit of {MAX_IN_FLIGHT_ASYNC} per process"
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft - FD_MARGIN < cap:
            cap = max(0, soft - FD_MARGIN)
            why = f"the open-file limit (ulimit -n = {soft}, {FD_MARGIN} kept for optlab)"
        if count > cap:
            raise ConfigError(
                f"{where}: {field}: {count} requests in flight per load-generator process, "
                f"each holding a connection, but {why} allows 1..{cap}",
                hint=f"set {field} to at most {cap}"
                + (
                    ", or raise the open-file limit (`ulimit -n`)"
                    if cap < MAX_IN_FLIGHT_ASYNC
                    else ""
                )
                + (
                    "; or spread a closed loop over more `load.processes`"
                    if name == "concurrency"
                    else ""
                ),
            )
    peak = mode.peak_rate(load)
    if peak is not None:
        rate, rate_field = peak
        _check_rate(rate, rate_field, load.generators, source, threaded=threaded, kind=kind)


def _check_rate(
    rate: float, name: str, processes: int, source: SourceFile, *, threaded: bool, kind: str
) -> None:
    processes = 1 if threaded else processes
    cap = MAX_RATE_PER_PROCESS * processes
    if rate <= cap:
        return
    where = source.where(("workload", "load", name))
    head = (
        f"{where}: workload.load.{name}: {rate:,.0f} requests/s is more than a Python load "
        f"generator can schedule: at most {MAX_RATE_PER_PROCESS:,} per process, so "
        f"{processes} process{'es' if processes > 1 else ''} allow{'s' if processes == 1 else ''} "
        f"a rate above 0 up to {cap:,}"
    )
    needed = math.ceil(rate / MAX_RATE_PER_PROCESS)
    if threaded:
        hint = (
            f"lower the rate to at most {cap:,}; a {kind} target runs inside optlab's process, "
            "so for more, serve it (`optlab serve`) and measure it as a command or http target "
            "with `load.processes`, or drive it with a compiled load generator (wrk2)"
        )
    elif needed <= MAX_PROCESSES:
        hint = (
            f"set workload.load.processes to {needed} or more (at most {MAX_PROCESSES}), lower "
            "the rate, or drive the service with a compiled load generator (wrk2)"
        )
    else:
        hint = (
            f"lower the rate to at most {MAX_RATE_PER_PROCESS * MAX_PROCESSES:,} with "
            f"processes: {MAX_PROCESSES}, or drive the service with a compiled load generator "
            "(wrk2)"
        )
    raise ConfigError(head, hint=hint)
