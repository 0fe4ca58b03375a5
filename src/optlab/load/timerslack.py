"""Waking a thread on time: tight timer slack, sleeping to a deadline (load schedules, batch
deadlines, the synthetic target's service time), and an alarm one thread sleeps on while another
moves its deadline without waking it."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable

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


class Alarm:
    """A deadline one thread sleeps on (`wait`) and another moves (`arm`, `disarm`) for the
    price of one system call, without waking the sleeper: a blocking CLOCK_MONOTONIC timerfd.

    What it is for: a thread that must act only if something else is late (the open loop's
    deputy, watching the leader's call) sleeps through every deadline the other thread moves
    on time, where waking up to look would cost a GIL switch each time. Linux only; `open`
    returns None elsewhere and the caller polls instead.
    """

    def __init__(self, fd: int, settime: Callable[..., int]) -> None:
        import ctypes

        self._fd, self._settime = fd, settime
        self._spec = (ctypes.c_long * 4)()  # struct itimerspec: interval (0), then value
        self._pointer = ctypes.byref(self._spec)
        # A separate, never written value for fire(): the thread that stops the alarm's users
        # is not the one arming it.
        self._now = (ctypes.c_long * 4)(0, 0, 0, 1)  # 1 ns after the clock's zero: long past
        self._now_pointer = ctypes.byref(self._now)

    @classmethod
    def open(cls) -> Alarm | None:
        """A new alarm, or None where there is no timerfd on the `perf_counter_ns` clock."""
        clock = time.get_clock_info("perf_counter").implementation
        if not sys.platform.startswith("linux") or "CLOCK_MONOTONIC)" not in clock:
            return None  # deadlines are perf_counter_ns: it must be the timer's clock
        import ctypes

        try:
            # PyDLL keeps the GIL across the call: it is a few hundred ns, and releasing the
            # GIL there would let another thread take it from the caller on every arm.
            libc = ctypes.PyDLL(None, use_errno=True)
            fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_CLOEXEC)
            settime = libc.timerfd_settime
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        return cls(fd, settime)

    def arm(self, deadline_ns: int) -> None:
        """Ring at `deadline_ns` (`perf_counter_ns`; at once when past), replacing the last
        deadline and any ring not yet waited for."""
        spec = self._spec
        spec[2], spec[3] = divmod(max(deadline_ns, 1), 1_000_000_000)
        self._settime(self._fd, _TFD_TIMER_ABSTIME, self._pointer, None)

    def disarm(self) -> None:
        spec = self._spec
        spec[2] = spec[3] = 0
        self._settime(self._fd, _TFD_TIMER_ABSTIME, self._pointer, None)

    def fire(self) -> None:
        """Ring now (to wake the sleeper for good, say); safe from any thread."""
        self._settime(self._fd, _TFD_TIMER_ABSTIME, self._now_pointer, None)

    def wait(self) -> None:
        """Sleep, without the GIL, until the alarm rings."""
        with contextlib.suppress(InterruptedError):
            os.read(self._fd, 8)

    def close(self) -> None:
        """Close the timerfd; only once no thread can use the alarm any more. Idempotent."""
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


_CLOCK_MONOTONIC = 1  # Linux's values, the only ones used
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1
