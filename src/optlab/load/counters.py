"""The threaded generator's bookkeeping: per-worker counters, the sweep that counts a call
hanging past its timeout as a timeout while it hangs, and the open loop's leadership.

A synchronous Python call cannot be cancelled, so without the sweep a request that never
returns would be neither an error nor a latency, and a run whose every call hangs would report
0 errors. The leadership is described in `optlab.load.generator`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from optlab.load.timerslack import SPIN_NS

if TYPE_CHECKING:
    from optlab.metrics.worker_log import WorkerLog

__all__ = [
    "ALARM_SLACK_NS",
    "HAND_OFF_NS",
    "Leadership",
    "WorkerCounters",
    "describe_error",
    "mark_returned",
    "sweep_timeouts",
]

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


# -- the open loop's leadership ---------------------------------------------------------------
# The open loop's deputy takes the leader's role once its call has run HAND_OFF_NS and a send is
# due, woken by an alarm that may ring up to ALARM_SLACK_NS later: the leader moves the alarm
# (a system call, ~2 µs here) once per that much schedule time, not per request. Far below
# LATE_NS; lower would hand the role over, waking threads, for calls of a few tens of µs.
# ALARM_SLACK_NS < SPIN_NS, so at low rates the deputy still wakes before the send it takes.
# Where there is no alarm (not Linux), the deputy polls every ALARM_SLACK_NS instead.
HAND_OFF_NS = 50_000
ALARM_SLACK_NS = 100_000


class Leadership:
    """The open loop's leadership: the next send (``due``, ``index``) and the leader's call.

    ``baton`` holds the leader's token (its WorkerCounters) while it is inside the target and
    nothing otherwise. Whoever takes it out leads on: the leader back from its call (``remove``
    of its own token, so it never takes the next leader's) or the deputy taking over (``pop``),
    never both: each is one C call, atomic under the GIL, and no lock is taken per request.
    """

    __slots__ = ("alarm_at", "baton", "busy_since", "due", "index", "patience")

    def __init__(self, due: int = 0, index: int = 0) -> None:
        self.due, self.index = due, index
        # No leader yet: a placeholder inside a call since forever, which the first deputy
        # replaces in time for the first send.
        self.busy_since = 1  # perf_counter_ns at the leader's call, 0 between calls
        self.baton: list[object] = [self]
        self.alarm_at = 0  # when the deputy's alarm rings; 0: disarmed
        # How long a call runs before the deputy may take over: HAND_OFF_NS while calls return
        # quickly; 0 after a slow one, so that when every call needs a thread of its own the
        # deputy is woken in time to spin to the next send, as a follower would be.
        self.patience = HAND_OFF_NS

    def take_at(self) -> int:
        """When the deputy takes over if the leader's call has not returned: when the next
        send's spin begins, once the call has run `patience`. (Inlined in the leader.)"""
        return max(self.due - SPIN_NS, self.busy_since + self.patience)
