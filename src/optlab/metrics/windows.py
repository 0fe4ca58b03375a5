"""One phase of a run as the collector folds it: its histograms, its error counts, and its
per-second windows, open ones holding raw samples until they close into a :class:`Window`.

Which window a sample falls in, and when a window may close, is decided here from sample times
alone; the collector (`optlab.metrics.log`) decides when to ask.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from optlab.metrics.histogram import LatencyHistogram
from optlab.metrics.llm import LlmTally

__all__ = ["ErrorStat", "Int64Array", "OpenWindow", "PhaseLog", "SourceTally", "Window"]

NS = 1_000_000_000
_NS_PER_MS = 1e6

Int64Array = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Window:
    """One window (one second by default) of a phase, keyed by its offset from the phase start.

    ``t_s`` is the window index: the whole seconds since the phase start with the default 1 s
    windows. Percentiles are exact over the window's successful requests.
    """

    phase: str
    t_s: int
    completed: int
    errors: int
    qps: float
    p50_ms: float | None
    p99_ms: float | None
    send_lag_p99_ms: float | None
    span_s: float = 1.0  # shorter only for the last window of a phase
    # A streaming target's streams that ended in the window (None: none did): what the
    # table's intervals on TTFT, TPOT and tokens/s are built from, as P50's are from p50_ms.
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    output_tps: float | None = None


@dataclass
class SourceTally:
    """What one source of samples (a load-generating node) sent in a phase: its own latency
    and send-lag histograms beside the phase's merged ones, so each node can be judged alone."""

    ok: int = 0
    errors: int = 0
    total: LatencyHistogram = field(default_factory=LatencyHistogram)
    send_lag: LatencyHistogram = field(default_factory=LatencyHistogram)

    def copy(self) -> SourceTally:
        return SourceTally(self.ok, self.errors, self.total.copy(), self.send_lag.copy())


@dataclass
class OpenWindow:
    totals: list[Int64Array] = field(default_factory=list)
    send_lags: list[Int64Array] = field(default_factory=list)
    errors: int = 0
    streams: int = 0  # streamed responses that ended in it
    ttft: list[int] = field(default_factory=list)  # ns, from each request's origin
    tpot: list[int] = field(default_factory=list)  # ns, answers of two tokens or more
    output_tokens: int = 0


@dataclass
class ErrorStat:
    count: int
    example: str | None


@dataclass
class PhaseLog:
    name: str
    start_ns: int
    end_ns: int | None = None  # the next phase's start; None while it is the latest phase
    histograms: dict[str, LatencyHistogram] = field(default_factory=dict)
    ok: int = 0
    errors: dict[str, ErrorStat] = field(default_factory=dict)
    open_windows: dict[int, OpenWindow] = field(default_factory=dict)
    next_window: int = 0  # index of the first window not yet emitted
    windows: list[Window] = field(default_factory=list)
    llm: LlmTally = field(default_factory=LlmTally)  # a streaming target's counts
    sources: dict[str, SourceTally] = field(default_factory=dict)  # per node, where named

    def histogram(self, series: str) -> LatencyHistogram:
        hist = self.histograms.get(series)
        if hist is None:
            hist = self.histograms[series] = LatencyHistogram()
        return hist

    def last_closable(self, horizon_ns: int, final: bool, window_ns: int) -> int:
        """Index of the last window that may close once samples reach ``horizon_ns``."""
        if self.end_ns is not None and (final or horizon_ns >= self.end_ns):
            # The phase is over: its last window is the one holding the instant before its end.
            return max(self.end_ns - 1 - self.start_ns, -1) // window_ns
        if final:
            return max(self.open_windows, default=self.next_window - 1)
        return (horizon_ns - self.start_ns) // window_ns - 1

    def close(self, key: int, final: bool, window_ns: int) -> Window:
        """Window ``key``'s figures; its raw samples are let go."""
        data = self.open_windows.pop(key, None) or OpenWindow()
        start = self.start_ns + key * window_ns
        span_ns = window_ns
        if self.end_ns is not None:
            span_ns = min(span_ns, self.end_ns - start)
        elif final:
            # Without a closing phase the best end estimate for the last window is "now".
            now = time.perf_counter_ns()
            if start < now < start + span_ns:
                span_ns = now - start
        totals = np.concatenate(data.totals) if data.totals else None
        send_lags = np.concatenate(data.send_lags) if data.send_lags else None
        completed = 0 if totals is None else int(totals.size)
        ttft = np.asarray(data.ttft, dtype=np.int64) if data.ttft else None
        tpot = np.asarray(data.tpot, dtype=np.int64) if data.tpot else None
        seconds = span_ns / NS
        return Window(
            phase=self.name,
            t_s=key,
            completed=completed,
            errors=data.errors,
            qps=completed / (span_ns / NS) if span_ns > 0 else 0.0,
            p50_ms=_percentile_ms(totals, 50.0),
            p99_ms=_percentile_ms(totals, 99.0),
            send_lag_p99_ms=_percentile_ms(send_lags, 99.0),
            span_s=seconds,
            ttft_p50_ms=_percentile_ms(ttft, 50.0),
            ttft_p99_ms=_percentile_ms(ttft, 99.0),
            tpot_p50_ms=_percentile_ms(tpot, 50.0),
            tpot_p99_ms=_percentile_ms(tpot, 99.0),
            output_tps=data.output_tokens / seconds if data.streams and seconds > 0 else None,
        )


def _percentile_ms(values: Int64Array | None, q: float) -> float | None:
    if values is None or values.size == 0:
        return None
    return float(np.percentile(values, q, method="linear")) / _NS_PER_MS
