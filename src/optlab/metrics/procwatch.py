"""Every process's CPU time, seen about twice a second over the measured phase, by a small
child process: so that a neighbour that ran and exited between the phase's first and last
readings is still named (the resource sampler's two snapshots of every process only see the
ones alive at both).

The scan runs in its own process because it reads a /proc file per process: done on a thread
of optlab's process, each read hands the GIL over and back, and a scan a second slowed a busy
load generator by about a tenth. The child reads only psutil, and stops when its stdin closes
(optlab asked for its table, or optlab is gone): it writes what it saw as one JSON line
`[[pid, ppid, name, cpu_s, create_time], ...]`, the last reading of each process.

This file runs as a script (`python procwatch.py INTERVAL`): it imports nothing of optlab.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["WATCH_INTERVAL_S", "ProcessWatch", "Seen"]

WATCH_INTERVAL_S = 0.5
# The scan never takes more than about 1/COST_SHARE of a core: on a host with thousands of
# processes it scans less often.
COST_SHARE = 20
STOP_TIMEOUT_S = 10.0
# The kernel's name for the child, so that it reads as what it is in `top` and in optlab's own
# list of threads (its CPU is optlab's: it is a child of optlab's process).
COMM = b"optlab-watch"

# (pid, ppid, name, cpu seconds, create time): one process as last seen.
Seen = tuple[int, int | None, str, float, float]


class ProcessWatch:
    """The child that watches every process; `stop()` returns what it saw (None if unknown)."""

    def __init__(self, interval_s: float = WATCH_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self._child: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self._child is None else self._child.pid

    def start(self) -> bool:
        """Start the child; False when it cannot be started (the figures are then a floor)."""
        # -P: the script's folder (optlab's metrics package) is not put on the child's path,
        # where a module of it would shadow the standard library's of the same name.
        if not sys.executable:  # an embedded interpreter: nothing to start the child with
            return False
        command = [sys.executable, "-P", str(Path(__file__).resolve()), str(self.interval_s)]
        try:
            self._child = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                close_fds=True,
            )
        except OSError:
            self._child = None
        return self._child is not None

    def stop(self) -> list[Seen] | None:
        """Ask the child for its table and wait for it (bounded); None when it gave none."""
        child, self._child = self._child, None
        if child is None:
            return None
        try:
            out, _ = child.communicate(b"", timeout=STOP_TIMEOUT_S)
        except (subprocess.TimeoutExpired, OSError, ValueError):
            child.kill()
            child.wait()
            return None
        return parse(out)


def parse(out: bytes) -> list[Seen] | None:
    """The child's table, or None when it is not one (the child failed)."""
    try:
        rows = json.loads(out)
    except ValueError:
        return None
    if not isinstance(rows, list):
        return None
    found: list[Seen] = []
    for row in rows:
        try:
            pid, ppid, name, cpu, created = row
            parent = None if ppid is None else int(ppid)
            found.append((int(pid), parent, str(name), float(cpu), float(created)))
        except (TypeError, ValueError):
            continue
    return found


# -- the child ----------------------------------------------------------------------------------


def _scan(psutil: Any, seen: dict[tuple[int, float], Seen]) -> None:
    for proc in psutil.process_iter(["ppid", "name", "cpu_times", "create_time"]):
        info = proc.info
        times, created = info.get("cpu_times"), info.get("create_time")
        if times is None or created is None:
            continue
        cpu = float(times.user + times.system)
        ppid = info.get("ppid")
        seen[(proc.pid, float(created))] = (
            proc.pid,
            None if ppid is None else int(ppid),
            str(info.get("name") or "?"),
            cpu,
            float(created),
        )


def _watch(interval_s: float) -> None:
    import psutil

    # optlab stops the child by closing its stdin; a Ctrl-C meant for optlab is not its own.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        Path("/proc/self/comm").write_bytes(COMM)
    seen: dict[tuple[int, float], Seen] = {}
    stdin = sys.stdin.buffer
    while True:
        began = time.perf_counter()
        _scan(psutil, seen)
        cost = time.perf_counter() - began
        wait = max(interval_s, COST_SHARE * cost)
        readable, _, _ = select.select([stdin], [], [], wait)
        if readable:
            stdin.read()  # optlab closed it (or wrote, then closed): the phase has ended
            break
    _scan(psutil, seen)  # the last reading of the processes still alive
    rows = sorted(seen.values())
    sys.stdout.write(json.dumps(rows, separators=(",", ":")))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    _watch(float(sys.argv[1]) if len(sys.argv) > 1 else WATCH_INTERVAL_S)
