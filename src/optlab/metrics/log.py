"""Hand-off of completed requests from load-generator threads to one aggregating collector.

Each generator thread owns a :class:`WorkerLog` (:mod:`optlab.metrics.worker_log`) and appends
to flat ``array('q')`` buffers under its own lock. About once a second the :class:`Collector`
swaps every log's buffers for empty ones and folds the samples into fixed-size histograms and
per-second windows; only the raw samples of still-open windows are kept, so memory does not
grow with the number of requests.
"""

from __future__ import annotations

import threading
from array import array

import numpy as np
import numpy.typing as npt

from optlab.metrics.histogram import LatencyHistogram
from optlab.metrics.llm import LlmTally, StreamTiming, fold_streams
from optlab.metrics.stages import SEND_LAG, START_LAG, TOTAL
from optlab.metrics.windows import (
    NS,
    ErrorStat,
    Int64Array,
    OpenWindow,
    PhaseLog,
    SourceTally,
    Window,
)
from optlab.metrics.worker_log import Buffers, InboxLog, WorkerLog, merge_buffers

__all__ = ["SEND_LAG", "START_LAG", "TOTAL", "Collector", "InboxLog", "Window", "WorkerLog"]


class Collector:
    """Aggregates every :class:`WorkerLog` into per-phase histograms and per-window statistics.

    ``drain`` is meant to be called about once a second from a single thread; the query methods
    may be called from any thread. A window is complete once a drain has seen a sample at least
    ``close_grace_s`` past its end, or the phase after it has begun, or :meth:`finish` was
    called. Sample times decide, not the drain's clock, so synthetic timestamps work and the
    empty windows of a stall appear once samples resume. The grace covers a generator thread
    that took its ``end_ns`` just before a drain but got the lock just after it (a GIL switch
    can sit in between); a sample that still arrives after its window was emitted counts in the
    phase's histograms and totals, and in ``late``.
    """

    def __init__(self, window_s: float = 1.0, *, close_grace_s: float = 0.25) -> None:
        if window_s <= 0:
            raise ValueError("window_s must be positive")
        if close_grace_s < 0:
            raise ValueError("close_grace_s must not be negative")
        self.window_s = window_s
        self._window_ns = int(round(window_s * NS))
        self._grace_ns = int(round(close_grace_s * NS))
        self._logs: list[WorkerLog] = []
        self._sources: dict[int, str] = {}  # id(log) -> the source it records for
        self._logs_lock = threading.Lock()
        # Serialises drain() against queries and set_phase(); never taken by WorkerLog.record.
        self._lock = threading.RLock()
        self._phases: list[PhaseLog] = []
        self._by_name: dict[str, PhaseLog] = {}
        self._horizon_ns: int | None = None  # latest end_ns seen
        self._new_windows: list[Window] = []
        self.unassigned = 0  # samples that ended before the first phase began
        self.late = 0  # samples whose window had already been emitted
        self.trimmed = 0  # samples in a sub-half-window sliver at the end of a phase

    def new_log(self, log: WorkerLog | None = None, *, source: str | None = None) -> WorkerLog:
        """A new log for a generator thread, or `log` (an InboxLog) registered as it is.
        With `source` (a node's name), its samples are also tallied apart
        (`source_tallies`)."""
        log = WorkerLog() if log is None else log
        with self._logs_lock:
            self._logs.append(log)
            if source is not None:
                self._sources[id(log)] = source
        return log

    def set_phase(self, phase: str, start_ns: int) -> None:
        """Start ``phase`` at ``start_ns``; it also ends the previous phase there.

        Samples are assigned to the latest phase whose start is <= their ``end_ns``. Call it no
        later than the next drain after ``start_ns``: samples already folded stay where they are.
        A closing phase such as ``"done"`` marks the true end of the last measured window.
        """
        with self._lock:
            if phase in self._by_name:
                raise ValueError(f"phase {phase!r} was already started")
            if self._phases and start_ns < self._phases[-1].start_ns:
                raise ValueError("phases must start in time order")
            if self._phases:
                self._phases[-1].end_ns = start_ns
            entry = PhaseLog(phase, start_ns)
            self._phases.append(entry)
            self._by_name[phase] = entry

    # -- folding -------------------------------------------------------------------------------

    def drain(self) -> None:
        """Swap every log's buffers and fold the samples in. Safe alongside ``record()``."""
        with self._logs_lock:
            logs = list(self._logs)
            sources = dict(self._sources)
        taken = [log.swap() for log in logs]
        with self._lock:
            # One numpy pass over every log's samples: each pass costs fixed work under the GIL,
            # and many small passes made the generator's threads late right after each drain.
            self._fold(merge_buffers(taken))
            for log, buf in zip(logs, taken, strict=True):
                source = sources.get(id(log))
                if source is not None and len(buf):
                    self._fold_source(source, buf)
            if self._horizon_ns is not None:
                self._advance(self._horizon_ns - self._grace_ns, final=False)

    def _phase_index(self, end_ns: Int64Array) -> npt.NDArray[np.intp]:
        starts = np.fromiter((p.start_ns for p in self._phases), dtype=np.int64)
        return np.searchsorted(starts, end_ns, side="right") - 1

    def _fold(self, buf: Buffers) -> None:
        if buf.end:
            self._fold_ok(buf)
        if buf.errors:
            self._fold_errors(buf.errors)

    def _fold_ok(self, buf: Buffers) -> None:
        end = np.frombuffer(buf.end, dtype=np.int64)
        total = np.frombuffer(buf.total, dtype=np.int64)
        send_lag = np.frombuffer(buf.send_lag, dtype=np.int64)
        start_lag = np.frombuffer(buf.start_lag, dtype=np.int64)
        self._see(int(end.max()))
        which = self._phase_index(end)
        self.unassigned += int(np.count_nonzero(which < 0))
        for index, phase in enumerate(self._phases):
            mask = which == index
            if not mask.any():
                continue
            p_end, p_total, p_send = end[mask], total[mask], send_lag[mask]
            phase.ok += int(p_end.size)
            phase.histogram(TOTAL).record_array(p_total)
            phase.histogram(SEND_LAG).record_array(p_send)
            phase.histogram(START_LAG).record_array(start_lag[mask])
            slots = (p_end - phase.start_ns) // self._window_ns
            # Sorting once groups the samples by window without a Python loop per sample.
            order = np.argsort(slots, kind="stable")
            slots, p_total, p_send = slots[order], p_total[order], p_send[order]
            keys, first = np.unique(slots, return_index=True)
            bounds = [*first.tolist(), int(slots.size)]
            for k, key in enumerate(keys.tolist()):
                if key < phase.next_window:
                    self.late += bounds[k + 1] - bounds[k]
                    continue
                window = phase.open_windows.setdefault(key, OpenWindow())
                window.totals.append(p_total[bounds[k] : bounds[k + 1]])
                window.send_lags.append(p_send[bounds[k] : bounds[k + 1]])
        if buf.stage_dicts:
            self._fold_stages(which, buf.stage_rows, buf.stage_dicts)
        if buf.streams:
            self._fold_streams(which, end, end - total, buf.stream_rows, buf.streams)

    def _fold_source(self, source: str, buf: Buffers) -> None:
        """A source's samples into its own tally of each phase (beside the merged fold)."""
        if buf.end:
            end = np.frombuffer(buf.end, dtype=np.int64)
            total = np.frombuffer(buf.total, dtype=np.int64)
            send_lag = np.frombuffer(buf.send_lag, dtype=np.int64)
            which = self._phase_index(end)
            for index, phase in enumerate(self._phases):
                mask = which == index
                if mask.any():
                    tally = phase.sources.setdefault(source, SourceTally())
                    tally.ok += int(np.count_nonzero(mask))
                    tally.total.record_array(total[mask])
                    tally.send_lag.record_array(send_lag[mask])
        if buf.errors:
            ends = np.fromiter((e[0] for e in buf.errors), dtype=np.int64)
            for index in self._phase_index(ends).tolist():
                if index >= 0:
                    self._phases[index].sources.setdefault(source, SourceTally()).errors += 1

    def _fold_streams(
        self,
        which: npt.NDArray[np.intp],
        ends: Int64Array,
        origins: Int64Array,
        rows: array[int],
        streams: list[StreamTiming],
    ) -> None:
        """Streamed responses into their phase's `llm.*` histograms, tally and windows (the
        window its request ended in); a request's origin is its end minus its total (the
        intended send in an open loop)."""
        picked = np.frombuffer(rows, dtype=np.int64)
        phase_of_row = which[picked].tolist()
        origin_of_row = origins[picked].tolist()
        end_of_row = ends[picked].tolist()
        by_phase: dict[int, tuple[list[StreamTiming], list[int], list[int]]] = {}
        for phase_index, origin, end, stream in zip(
            phase_of_row, origin_of_row, end_of_row, streams, strict=True
        ):
            if phase_index < 0:
                continue
            group = by_phase.setdefault(phase_index, ([], [], []))
            group[0].append(stream)
            group[1].append(origin)
            group[2].append(end)
        for phase_index, (found, starts, stream_ends) in by_phase.items():
            phase = self._phases[phase_index]
            each: list[tuple[int, int, int]] = []
            for name, values in fold_streams(found, starts, phase.llm, each).items():
                if values:
                    series = phase.histogram(name)
                    series.record_array(np.asarray(values, dtype=np.int64))
            for end, (ttft, tpot, tokens) in zip(stream_ends, each, strict=True):
                key = (end - phase.start_ns) // self._window_ns
                if key < phase.next_window:
                    continue  # its window has closed (counted late with its request)
                window = phase.open_windows.setdefault(key, OpenWindow())
                window.streams += 1
                window.output_tokens += tokens
                if ttft >= 0:
                    window.ttft.append(ttft)
                if tpot >= 0:
                    window.tpot.append(tpot)

    def _fold_stages(
        self, which: npt.NDArray[np.intp], rows: array[int], dicts: list[dict[str, int]]
    ) -> None:
        phase_of_row = which[np.frombuffer(rows, dtype=np.int64)].tolist()
        grouped: dict[tuple[int, str], list[int]] = {}
        for phase_index, stages in zip(phase_of_row, dicts, strict=True):
            if phase_index < 0:
                continue
            for name, ns in stages.items():
                key = (phase_index, name)
                values = grouped.get(key)
                if values is None:
                    grouped[key] = [ns]
                else:
                    values.append(ns)
        for (phase_index, name), values in grouped.items():
            series = self._phases[phase_index].histogram(name)
            series.record_array(np.fromiter(values, dtype=np.int64, count=len(values)))

    def _fold_errors(self, errors: list[tuple[int, str, str | None]]) -> None:
        end = np.fromiter((e[0] for e in errors), dtype=np.int64, count=len(errors))
        self._see(int(end.max()))
        which = self._phase_index(end).tolist()
        for phase_index, (end_ns, kind, message) in zip(which, errors, strict=True):
            if phase_index < 0:
                self.unassigned += 1
                continue
            phase = self._phases[phase_index]
            stat = phase.errors.get(kind)
            if stat is None:
                phase.errors[kind] = ErrorStat(1, message)
            else:
                stat.count += 1
                if stat.example is None:
                    stat.example = message
            key = (end_ns - phase.start_ns) // self._window_ns
            if key < phase.next_window:
                self.late += 1
            else:
                phase.open_windows.setdefault(key, OpenWindow()).errors += 1

    def _see(self, end_ns: int) -> None:
        if self._horizon_ns is None or end_ns > self._horizon_ns:
            self._horizon_ns = end_ns

    # -- windows -------------------------------------------------------------------------------

    def _advance(self, horizon_ns: int, *, final: bool) -> None:
        """Emit every window that ends at or before ``horizon_ns`` (all of them when final)."""
        for phase in self._phases:
            last = phase.last_closable(horizon_ns, final, self._window_ns)
            while phase.next_window <= last:
                window = phase.close(phase.next_window, final, self._window_ns)
                phase.next_window += 1
                if window.span_s < 0.5 * self._window_ns / NS:
                    # A sliver left when the phase ended a moment after a whole window: its
                    # QPS would be noise (0, or 1 request over 1 ms). Its requests stay in the
                    # histograms and totals; only the time series leaves it out.
                    self.trimmed += window.completed + window.errors
                    continue
                phase.windows.append(window)
                self._new_windows.append(window)

    def finish(self) -> None:
        """Final drain; closes every open window."""
        self.drain()
        with self._lock:
            self._advance(self._horizon_ns or 0, final=True)

    # -- queries -------------------------------------------------------------------------------

    def _phase(self, phase: str) -> PhaseLog | None:
        return self._by_name.get(phase)

    def windows(self, phase: str) -> list[Window]:
        with self._lock:
            entry = self._phase(phase)
            return [] if entry is None else list(entry.windows)

    def histograms(self, phase: str) -> dict[str, LatencyHistogram]:
        """Copies of the phase's histograms: "total", "send_lag", "start_lag" and user stages."""
        with self._lock:
            entry = self._phase(phase)
            if entry is None:
                return {}
            return {name: hist.copy() for name, hist in entry.histograms.items()}

    def source_tallies(self, phase: str) -> dict[str, SourceTally]:
        """Copies of each named source's tally of the phase (load from several hosts)."""
        with self._lock:
            entry = self._phase(phase)
            if entry is None:
                return {}
            return {name: tally.copy() for name, tally in entry.sources.items()}

    def llm_tally(self, phase: str) -> LlmTally | None:
        """A copy of the phase's streamed-response counts; None when it streamed none."""
        with self._lock:
            entry = self._phase(phase)
            if entry is None or not entry.llm.requests:
                return None
            return entry.llm.copy()

    def error_counts(self, phase: str) -> dict[str, tuple[int, str | None]]:
        with self._lock:
            entry = self._phase(phase)
            if entry is None:
                return {}
            return {kind: (stat.count, stat.example) for kind, stat in entry.errors.items()}

    def totals(self, phase: str) -> tuple[int, int]:
        """(completed ok, errors) of the phase."""
        with self._lock:
            entry = self._phase(phase)
            if entry is None:
                return (0, 0)
            return entry.ok, sum(stat.count for stat in entry.errors.values())

    def take_new_windows(self) -> list[Window]:
        with self._lock:
            taken, self._new_windows = self._new_windows, []
            return taken

    def held_samples(self) -> int:
        """Raw samples held anywhere (undrained logs plus open windows); bounded by ~2 windows."""
        with self._logs_lock:
            logs = list(self._logs)
        held = sum(log.pending() for log in logs)
        with self._lock:
            for phase in self._phases:
                for window in phase.open_windows.values():
                    held += sum(int(chunk.size) for chunk in window.totals)
        return held
