"""The threaded generator's per-worker counters, and the sweep that counts a call hanging past
its timeout as a timeout while it hangs.

A synchronous Python call cannot be cancelled, so without the sweep a request that never
returns would be neither an error nor a latency, and a run whose every call hangs would report
0 errors.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from optlab.metrics.log import WorkerLog

__all__ = ["WorkerCounters", "describe_error", "mark_returned", "sweep_timeouts"]

MESSAGE_CHARS = 200


class WorkerCounters:
    """Per-worker counts. Only the owning thread writes the counts, so they need no lock;
    readers sum them and may be a request behind, which is all `in_flight` promises.

    ``call_start`` / ``origin`` describe the call in progress (0 when idle), so the watchdog
    can count a call that never returns as a timeout; ``swept`` is the `issued` number of
    the last call the watchdog recorded, and ``lock`` decides who records a call that ends
    just as the watchdog looks at it: the worker or the watchdog, never both.
    """

    __slots__ = ("call_start", "completed", "issued", "late", "lock", "log", "origin", "swept")

    def __init__(self, log: WorkerLog) -> None:
        self.issued = 0
        self.completed = 0
        self.late = 0
        self.call_start = 0
        self.origin = 0
        self.swept = 0
        self.lock = threading.Lock()
        self.log = log


def describe_error(exc: BaseException) -> str:
    try:
        return str(exc)[:MESSAGE_CHARS]
    except Exception:  # a broken __str__ must not kill the worker
        return f"<{type(exc).__name__} with an unprintable message>"


def sweep_timeouts(workers: Iterable[WorkerCounters], timeout_ns: int) -> None:
    """Record every call in progress for longer than `timeout_ns` as a timeout, once."""
    now = time.perf_counter_ns()
    for counters in workers:
        started = counters.call_start
        if not started or now - started <= timeout_ns:
            continue
        with counters.lock:
            # Still the same call, and not already recorded by its worker or by us.
            if counters.call_start != started or counters.swept == counters.issued:
                continue
            counters.swept = counters.issued
            counters.log.record(
                now,
                now - counters.origin,
                0,
                0,
                None,
                "timeout",
                f"no reply after {(now - started) / 1e6:.1f} ms (the call is still "
                f"running), over the {timeout_ns / 1e6:g} ms timeout",
            )


def mark_returned(counters: WorkerCounters) -> bool:
    """Mark the worker's call as returned; False when the sweep already counted it."""
    with counters.lock:
        counters.call_start = 0
        return counters.swept != counters.issued
