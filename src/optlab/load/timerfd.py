"""A CLOCK_MONOTONIC timerfd (Linux) an asyncio loop watches, so the event-loop generator wakes
to the microsecond before an intended send instead of spinning for the last milliseconds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable

__all__ = ["TimerFd"]


class TimerFd:
    """A CLOCK_MONOTONIC timerfd (Linux) the event loop watches: one wake-up at an absolute
    `perf_counter_ns` deadline, to the microsecond, for the price of two system calls."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, fd: int, settime: Callable[..., int]
    ) -> None:
        import ctypes

        self._loop, self._fd, self._settime = loop, fd, settime
        self._spec = (ctypes.c_long * 4)()  # struct itimerspec: interval (0), then value
        self._pointer = ctypes.byref(self._spec)
        self._waiter: asyncio.Future[None] | None = None
        loop.add_reader(fd, self._fired)

    @classmethod
    def open(cls, loop: asyncio.AbstractEventLoop) -> TimerFd | None:
        """One for `loop`, or None where there is no timerfd (then the generator spins)."""
        clock = time.get_clock_info("perf_counter").implementation
        if not sys.platform.startswith("linux") or "CLOCK_MONOTONIC)" not in clock:
            return None  # the deadlines are perf_counter_ns: it must be the timer's clock
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        except (OSError, AttributeError):
            return None
        if fd < 0:
            return None
        try:
            return cls(loop, fd, libc.timerfd_settime)
        except (OSError, AttributeError, NotImplementedError):
            os.close(fd)
            return None

    def arm(self, deadline_ns: int, waiter: asyncio.Future[None]) -> None:
        self._waiter = waiter
        spec = self._spec
        spec[2], spec[3] = divmod(deadline_ns, 1_000_000_000)
        if self._settime(self._fd, _TFD_TIMER_ABSTIME, self._pointer, None) != 0:
            waiter.set_result(None)  # cannot arm: the caller spins to the deadline instead

    def _fired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:
            return
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._fd)
        os.close(self._fd)


_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = getattr(os, "O_NONBLOCK", 0o4000)  # Linux's values, the only ones used
_TFD_CLOEXEC = getattr(os, "O_CLOEXEC", 0o2000000)
_TFD_TIMER_ABSTIME = 1
