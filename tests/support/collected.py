"""A run as the measurement collects it, built by hand: `summarize()`'s input without a
target, a clock or a store (tests/test_summarize.py, tests/test_reasons.py)."""

from __future__ import annotations

from typing import Any

from optlab.config.models import ClosedLoad
from optlab.config.protocol import EffectiveProtocol
from optlab.metrics.histogram import LatencyHistogram
from optlab.metrics.stages import TOTAL
from optlab.run.summarize import Collected

PROTOCOL = EffectiveProtocol(
    name="full",
    warmup="fixed",
    warmup_s=30.0,
    warmup_max_s=30.0,
    duration_s=10.0,
    max_error_rate=0.01,
    stability_tolerance=0.10,
)
CLOSED = ClosedLoad(mode="closed", concurrency=4)
STEADY = (100.0,) * 10  # ten measured seconds at 100 QPS: both halves agree


def histogram(values_ms: list[float]) -> LatencyHistogram:
    h = LatencyHistogram()
    for value in values_ms:
        h.record_ns(round(value * 1e6))
    return h


def collected(**changes: Any) -> Collected:
    """A finished closed-loop run of 1,000 requests over 10 s: 1..1000 ms, one each."""
    fields: dict[str, Any] = {
        "run_id": 7,
        "experiment": "baseline",
        "status": "FINISHED",
        "protocol": PROTOCOL,
        "load": CLOSED,
        "histograms": {TOTAL: histogram([float(i) for i in range(1, 1001)])},
        "completed": 1000,
        "failed": 0,
        "measured_s": 10.0,
        "warmup_s": 30.0,
        "window_qps": STEADY,
    }
    return Collected(**(fields | changes))
