"""Ctrl-C (and the SIGTERM and SIGHUP a run turns into exceptions) waits for the end of a store
transaction before it raises.

A signal's Python handler raises at whatever bytecode the main thread has reached. Raised
inside SQLAlchemy after SQLite has begun a transaction (`BEGIN IMMEDIATE`: the write lock) -
just after the statement returns, which is where a Ctrl-C pressed while SQLite runs it lands,
or before the Session has recorded the connection - it leaves that connection in its
transaction, kept alive by the exception's traceback. The interrupted command then goes on
to record that it was stopped, and its own `BEGIN IMMEDIATE` waits out the whole busy
timeout and fails "database is locked" (exit 2 where Ctrl-C means 130). Raised elsewhere in
SQLAlchemy's bookkeeping, it can also come out as another error (InvalidRequestError: "This
session is provisioning a new connection"), so that Ctrl-C is not even seen as one.

So while a transaction is open, the handlers that would raise are swapped for one that notes
the signal, and the first signal noted is handed to its own handler once the transaction has
ended, committed or rolled back. The delay is the transaction's own length: SQLite's calls,
a busy wait included, never let a handler run before they return anyway.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

__all__ = ["DEFERRED_SIGNALS", "signals_deferred"]

# Those whose handlers optlab makes raise (SIGINT's default handler raises KeyboardInterrupt;
# a run makes SIGTERM and SIGHUP raise too). A signal left at SIG_DFL or SIG_IGN is not
# touched: it either ends the process, and SQLite rolls back, or does nothing.
DEFERRED_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name)
)

_Handler = Callable[[int, FrameType | None], Any]


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold DEFERRED_SIGNALS' Python handlers until the block has ended, then run the first
    signal's handler (which raises as it would have, after the block's own exception if
    any). Only the main thread gets signals; elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[tuple[int, FrameType | None]] = []

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append((signum, frame))

    previous: dict[int, _Handler] = {}
    try:
        for signum in DEFERRED_SIGNALS:
            handler = signal.getsignal(signum)
            if callable(handler):
                previous[signum] = handler  # first: a signal in between finds it restored
                signal.signal(signum, note)
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if noted:
            signum, frame = noted[0]
            previous[signum](signum, frame)
