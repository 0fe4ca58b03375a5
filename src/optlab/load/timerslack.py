"""Waking a thread on time: tight timer slack and sleeping to a deadline (load schedules, batch
deadlines, the synthetic target's service time). The timerfds a thread or an event loop sleeps
on are in `optlab.load.timerfd`."""

from __future__ import annotations

import sys
import time

PR_SET_TIMERSLACK = 29  # linux/prctl.h
# Sleeping is only accurate to ~50-100 µs on Linux (timer slack, wake-up), so a thread sleeps
# until this long before its deadline and spins the rest. The spin calls sleep(0), which
# releases the GIL, so a spinning thread never keeps others from it for a switch interval.
SPIN_NS = 200_000


def sleep_until(deadline_ns: int) -> None:
    """Sleep for the bulk, then spin the last SPIN_NS (`perf_counter_ns` clock): a 1 ms wait
    lands within ~50 µs."""
    clock = time.perf_counter_ns
    remaining = deadline_ns - clock()
    if remaining > SPIN_NS:
        time.sleep((remaining - SPIN_NS) / 1e9)
    while clock() < deadline_ns:
        time.sleep(0)


def tighten_timer_slack() -> None:
    """Ask Linux to wake the CALLING thread within 1 µs of its deadline, not the default 50 µs.

    Timer slack is per thread; on a VM the default made timed waits overshoot by ~100 µs at the
    median and over 1 ms at P99: send lag in the open loop, extra wait for a lone request in a
    batch. Elsewhere this does nothing.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)
    except (OSError, AttributeError):
        return  # an exotic libc: keep the default slack
