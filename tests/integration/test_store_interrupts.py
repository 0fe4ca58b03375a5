"""Ctrl-C in the middle of a store call, as `optlab tune` meets it: a real SIGINT (raised
through the C-level handler, so the Python handler runs as it would for a key press) at each
line SQLAlchemy runs while a write begins, runs and ends its transaction. Each must still end
the call with KeyboardInterrupt, and must leave no connection holding SQLite's write lock:
the interrupted command goes on to record that it stopped (`KnobSearch.run`'s
`_finish("KILLED")`, with the traceback alive), and a lock left held made that write wait
out the busy timeout and fail "database is locked" (exit 2 instead of 130)."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

from optlab.store import Store
from tests.support.storebuild import save_baseline, start_run

# Where a Session begins its transaction (`BEGIN IMMEDIATE`, store.database) on a pooled
# connection, runs the statements and ends it.
TRACED = ("sqlalchemy/orm/session.py", "sqlalchemy/engine/base.py", "sqlalchemy/pool/base.py")

Tracer = Callable[[FrameType, str, Any], Any]


class _SigintAt:
    """A trace function that raises SIGINT at the `at`-th line run in TRACED (0: never),
    counting them in `lines`."""

    def __init__(self, at: int) -> None:
        self.at, self.lines, self.where = at, 0, ""

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Tracer | None:
        if self.where or not frame.f_code.co_filename.endswith(TRACED):
            return None
        return self._line

    def _line(self, frame: FrameType, event: str, arg: Any) -> Tracer | None:
        if self.where:  # sent: trace no further
            return None
        if event == "line":
            self.lines += 1
            if self.lines == self.at:
                name = frame.f_code.co_filename.rsplit("site-packages/", 1)[-1]
                self.where = f"{name}:{frame.f_lineno} ({frame.f_code.co_name})"
                signal.raise_signal(signal.SIGINT)
        return self._line


@contextlib.contextmanager
def _traced(tracer: _SigintAt) -> Iterator[None]:
    previous = sys.gettrace()  # a coverage tracer, say: put back afterwards
    sys.settrace(tracer)
    try:
        yield
    finally:
        sys.settrace(previous)


@contextlib.contextmanager
def _ctrl_c_raises() -> Iterator[None]:
    """SIGINT at Python's own handler, which raises KeyboardInterrupt (as in a terminal)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _write_lock_free(path: Path) -> bool:
    """Whether another connection could begin writing now, without waiting."""
    with contextlib.closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as other:
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if "locked" in str(exc):
                return False
            raise
        other.execute("ROLLBACK")
    return True


def test_ctrl_c_anywhere_in_a_store_write_interrupts_it_and_leaves_no_write_lock(
    tmp_path: Path,
) -> None:
    path = tmp_path / "optlab.db"
    with _ctrl_c_raises(), Store.open(f"sqlite:///{path}") as store:
        save_baseline(store)
        run_id = start_run(store)
        store.heartbeat(run_id)  # SQLAlchemy's statement caches warm: each call runs alike
        counting = _SigintAt(0)
        with _traced(counting):
            store.heartbeat(run_id)
        assert counting.lines > 100, counting.lines  # the trace sees SQLAlchemy's lines
        interrupted = 0
        for at in range(1, counting.lines + 1):
            tracer = _SigintAt(at)
            try:
                with _traced(tracer):
                    store.heartbeat(run_id)
            except BaseException as exc:
                # What the interrupted command does next (`KnobSearch.run`): write, while the
                # exception's traceback keeps the interrupted call's frames alive.
                free = _write_lock_free(path)
                assert free and isinstance(exc, KeyboardInterrupt), (
                    f"a Ctrl-C at {tracer.where} (line {at} of {counting.lines}) raised "
                    f"{exc!r} and left the write lock {'free' if free else 'held'}"
                )
                store.heartbeat(run_id)
                interrupted += 1
            else:
                assert not tracer.where, f"a Ctrl-C at {tracer.where} was lost"
        # (A call may run a line or two fewer than the one counted, and get no Ctrl-C.)
        assert interrupted > counting.lines * 0.9, (interrupted, counting.lines)
