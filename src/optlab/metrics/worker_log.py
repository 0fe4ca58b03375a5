"""What a load-generator thread records, and the buffers it hands to the collector.

Each generator thread owns a :class:`WorkerLog` and appends to flat ``array('q')`` buffers under
its own lock, so the hot path never allocates per request (beyond a user's stage dict) and never
contends with other generator threads. The collector (:mod:`optlab.metrics.log`) swaps a log's
:class:`Buffers` for empty ones about once a second; an :class:`InboxLog` holds whole buffers
recorded in another process or on another host.
"""

from __future__ import annotations

import dataclasses
import threading
from array import array

import numpy as np

from optlab.metrics.llm import StreamTiming
from optlab.metrics.stages import RequestTiming

__all__ = ["Buffers", "InboxLog", "WorkerLog", "merge_buffers"]


class Buffers:
    """One generation of a log's samples; swapped out whole so the collector never copies."""

    __slots__ = (
        "end",
        "errors",
        "send_lag",
        "stage_dicts",
        "stage_rows",
        "start_lag",
        "stream_rows",
        "streams",
        "total",
    )

    def __init__(self) -> None:
        self.end = array("q")
        self.total = array("q")
        self.send_lag = array("q")
        self.start_lag = array("q")
        # Row numbers into the arrays above, for the (usually few) requests that recorded stages.
        self.stage_rows = array("q")
        self.stage_dicts: list[dict[str, int]] = []
        # Row numbers of the requests whose responses were streamed, and their streams.
        self.stream_rows = array("q")
        self.streams: list[StreamTiming] = []
        # Errors are rare and carry strings, so a plain list is fine: (end_ns, type, message).
        self.errors: list[tuple[int, str, str | None]] = []

    def __len__(self) -> int:
        return len(self.end) + len(self.errors)

    def shift(self, delta_ns: int) -> None:
        """Move every instant by `delta_ns` (another host's clock into this one's); the
        durations (latency, lags) stay as they were measured."""
        if not delta_ns:
            return
        if self.end:
            self.end = array("q", (np.frombuffer(self.end, dtype=np.int64) + delta_ns).tobytes())
        self.errors = [(end + delta_ns, kind, text) for end, kind, text in self.errors]
        self.streams = [
            dataclasses.replace(
                s,
                intended_ns=s.intended_ns + delta_ns,
                sent_ns=s.sent_ns + delta_ns,
                events=tuple((t + delta_ns, n) for t, n in s.events),
                end_ns=s.end_ns + delta_ns,
            )
            for s in self.streams
        ]


def merge_buffers(taken: list[Buffers]) -> Buffers:
    """One generation holding every sample of `taken`, in order (row numbers re-based)."""
    if not taken:
        return Buffers()
    if len(taken) == 1:
        return taken[0]
    merged = Buffers()
    for buf in taken:
        offset = len(merged.end)
        merged.end += buf.end
        merged.total += buf.total
        merged.send_lag += buf.send_lag
        merged.start_lag += buf.start_lag
        merged.stage_rows.extend(row + offset for row in buf.stage_rows)
        merged.stage_dicts += buf.stage_dicts
        merged.stream_rows.extend(row + offset for row in buf.stream_rows)
        merged.streams += buf.streams
        merged.errors += buf.errors
    return merged


class WorkerLog:
    """One per load-generator thread: the thread records, the collector swaps buffers ~1/s."""

    __slots__ = ("_buf", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buf = Buffers()

    def record(
        self,
        end_ns: int,
        total_ns: int,
        send_lag_ns: int,
        start_lag_ns: int,
        timing: RequestTiming | None,
        error: str | None = None,
        message: str | None = None,
    ) -> None:
        """Record one completed request.

        ``end_ns`` is ``time.perf_counter_ns()`` at completion; ``total_ns`` the latency (from the
        intended send time under open loop); ``send_lag_ns`` intended -> dispatched;
        ``start_lag_ns`` intended -> target entered. ``error`` is None for success, else an error
        type name, with ``message`` an example text. Failed requests are counted but kept out of
        every latency series.
        """
        with self._lock:
            buf = self._buf
            if error is None:
                buf.end.append(end_ns)
                buf.total.append(total_ns)
                buf.send_lag.append(send_lag_ns)
                buf.start_lag.append(start_lag_ns)
                if timing is not None:
                    if timing.stages is not None:
                        buf.stage_rows.append(len(buf.end) - 1)
                        buf.stage_dicts.append(timing.stages)
                    if timing.stream is not None:
                        buf.stream_rows.append(len(buf.end) - 1)
                        buf.streams.append(timing.stream)
            else:
                buf.errors.append((end_ns, error, message))

    def swap(self) -> Buffers:
        fresh = Buffers()
        with self._lock:
            taken, self._buf = self._buf, fresh
        return taken

    def pending(self) -> int:
        """Samples recorded but not yet drained."""
        with self._lock:
            return len(self._buf)


class InboxLog(WorkerLog):
    """Samples recorded in another process (a load-generator worker), handed over as whole
    buffers: the collector folds them exactly as it folds its own threads' samples, so the
    run's histograms hold every request of every process."""

    __slots__ = ("_inbox",)

    def __init__(self) -> None:
        super().__init__()
        self._inbox: list[Buffers] = []

    def put(self, buffers: Buffers) -> None:
        with self._lock:
            self._inbox.append(buffers)

    def swap(self) -> Buffers:
        with self._lock:
            taken, self._inbox = self._inbox, []
        return merge_buffers(taken)

    def pending(self) -> int:
        with self._lock:
            return sum(len(b) for b in self._inbox)
