"""A progress display that breaks (a closed terminal, a broken pipe) is ignored after its first
failure: the measurement goes on (no run, no process)."""

from __future__ import annotations

import threading


def test_a_thread_safe_progress_that_breaks_is_ignored() -> None:
    from optlab.run.measurement import GuardedProgress, LiveStatus

    class Broken:
        calls = 0

        def update(self, status: LiveStatus) -> None:
            self.calls += 1
            raise BrokenPipeError(32, "Broken pipe")

        def note(self, text: str) -> None:
            self.calls += 1
            raise OSError(5, "Input/output error")  # a terminal gone after SIGHUP

    inner = Broken()
    guarded = GuardedProgress(inner)
    status = LiveStatus("x", "measure", 1.0, 2.0, None, None, None, None, None)
    guarded.update(status)
    guarded.note("still here")
    guarded.update(status)
    assert inner.calls == 1 and isinstance(guarded.broken, BrokenPipeError)
    assert threading.current_thread() is threading.main_thread()
