"""CLOCK_MONOTONIC timerfds (Linux): one opener and one `itimerspec`, and the two timers built
on them.

- `TimerFd`: non-blocking, watched by an asyncio loop, so the event-loop generator wakes to the
  microsecond before an intended send instead of spinning for the last milliseconds.
- `Alarm`: blocking; one thread sleeps on it while another moves its deadline without waking it
  (the open loop's deputy in the threaded generator).

Both take absolute `perf_counter_ns` deadlines, so both exist only where `perf_counter` is
CLOCK_MONOTONIC; elsewhere `open` returns None and the caller spins or polls instead.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

__all__ = ["Alarm", "TimerFd"]

NS_PER_S = 1_000_000_000


def _open_timerfd(*, nonblocking: bool, keep_gil: bool) -> tuple[int, Callable[..., int]] | None:
    """A new timerfd on the `perf_counter_ns` clock and libc's `timerfd_settime`, or None where
    there is none. `keep_gil`: call libc through `PyDLL`, which keeps the GIL across the call."""
    clock = time.get_clock_info("perf_counter").implementation
    if not sys.platform.startswith("linux") or "CLOCK_MONOTONIC)" not in clock:
        return None  # the deadlines are perf_counter_ns: it must be the timer's clock
    import ctypes

    flags = _TFD_CLOEXEC | (_TFD_NONBLOCK if nonblocking else 0)
    try:
        libc = (ctypes.PyDLL if keep_gil else ctypes.CDLL)(None, use_errno=True)
        settime = libc.timerfd_settime
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, flags)
    except (OSError, AttributeError):
        return None
    if fd < 0:
        return None
    return fd, settime


def _itimerspec(at_ns: int = 0) -> tuple[Any, Any]:
    """A `struct itimerspec` (interval 0, then the value's seconds and nanoseconds) set to the
    absolute time `at_ns` (0: disarmed), and the pointer `timerfd_settime` takes. The timers
    write its last two fields in place on each arm: one system call, no allocation."""
    import ctypes

    spec = (ctypes.c_long * 4)(0, 0, *divmod(at_ns, NS_PER_S))
    return spec, ctypes.byref(spec)


class TimerFd:
    """A timerfd the event loop watches: one wake-up at an absolute `perf_counter_ns` deadline,
    to the microsecond, for the price of two system calls."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, fd: int, settime: Callable[..., int]
    ) -> None:
        self._loop, self._fd, self._settime = loop, fd, settime
        self._spec, self._pointer = _itimerspec()
        self._waiter: asyncio.Future[None] | None = None
        loop.add_reader(fd, self._fired)

    @classmethod
    def open(cls, loop: asyncio.AbstractEventLoop) -> TimerFd | None:
        """One for `loop`, or None where there is no timerfd (then the generator spins)."""
        opened = _open_timerfd(nonblocking=True, keep_gil=False)
        if opened is None:
            return None
        fd, settime = opened
        try:
            return cls(loop, fd, settime)
        except (OSError, AttributeError, NotImplementedError):
            os.close(fd)
            return None

    def arm(self, deadline_ns: int, waiter: asyncio.Future[None]) -> None:
        self._waiter = waiter
        spec = self._spec
        spec[2], spec[3] = divmod(deadline_ns, NS_PER_S)
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


class Alarm:
    """A deadline one thread sleeps on (`wait`) and another moves (`arm`, `disarm`) for the
    price of one system call, without waking the sleeper: a blocking timerfd.

    What it is for: a thread that must act only if something else is late (the open loop's
    deputy, watching the leader's call) sleeps through every deadline the other thread moves
    on time, where waking up to look would cost a GIL switch each time. Linux only; `open`
    returns None elsewhere and the caller polls instead.
    """

    def __init__(self, fd: int, settime: Callable[..., int]) -> None:
        self._fd, self._settime = fd, settime
        self._spec, self._pointer = _itimerspec()
        # A separate, never written value for fire(): the thread that stops the alarm's users
        # is not the one arming it.
        self._now, self._now_pointer = _itimerspec(1)  # 1 ns after the clock's zero: long past

    @classmethod
    def open(cls) -> Alarm | None:
        """A new alarm, or None where there is no timerfd on the `perf_counter_ns` clock."""
        # The GIL is kept across arm's call: it is a few hundred ns, and releasing the GIL
        # there would let another thread take it from the caller on every arm.
        opened = _open_timerfd(nonblocking=False, keep_gil=True)
        return None if opened is None else cls(*opened)

    def arm(self, deadline_ns: int) -> None:
        """Ring at `deadline_ns` (`perf_counter_ns`; at once when past), replacing the last
        deadline and any ring not yet waited for."""
        spec = self._spec
        spec[2], spec[3] = divmod(max(deadline_ns, 1), NS_PER_S)
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


_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = getattr(os, "O_NONBLOCK", 0o4000)  # Linux's values, the only ones used
_TFD_CLOEXEC = getattr(os, "O_CLOEXEC", 0o2000000)
_TFD_TIMER_ABSTIME = 1
