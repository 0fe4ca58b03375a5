"""Python's garbage-collector pauses in optlab's process, timed through `gc.callbacks`
(docs/run-json.md "evidence").

The callback runs inside every collection, on whichever thread triggered it, with the GIL
held and collections never nested: one clock read and one append per phase, no lock.
"""

from __future__ import annotations

import gc
import time
from array import array
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["GcPauses", "PauseFigures", "P99_LEAST_PAUSES", "pause_figures"]

# Below this many pauses the 99th percentile is only the largest one or two: not reported.
P99_LEAST_PAUSES = 100


class GcPauses:
    """Records the duration of every collection while `recording()` is entered."""

    def __init__(self) -> None:
        self._started = 0
        self._pauses = array("q")
        self._callback = self._on_gc  # one bound method, so remove() finds what append() put

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        elif self._started:
            self._pauses.append(time.perf_counter_ns() - self._started)
            self._started = 0

    @contextmanager
    def recording(self) -> Iterator[None]:
        """Time collections inside the block; the callback is removed however it ends."""
        gc.callbacks.append(self._callback)
        try:
            yield
        finally:
            self._started = 0
            with suppress(ValueError):  # someone cleared gc.callbacks meanwhile
                gc.callbacks.remove(self._callback)

    def pauses_ns(self) -> list[int]:
        return list(self._pauses)


@dataclass(frozen=True)
class PauseFigures:
    collections: int
    total_ms: float
    max_ms: float
    p99_ms: float | None  # None under P99_LEAST_PAUSES pauses
    share_pct: float  # total over `wall_s`, in percent


def pause_figures(pauses_ns: Sequence[int], wall_s: float) -> PauseFigures | None:
    """The pauses' count, total, largest, P99 and share of `wall_s`; None without a span."""
    if wall_s <= 0:
        return None
    values = np.asarray(pauses_ns, dtype=np.float64) / 1e6
    total = float(values.sum()) if values.size else 0.0
    p99 = None
    if values.size >= P99_LEAST_PAUSES:
        p99 = float(np.percentile(values, 99.0, method="linear"))
    return PauseFigures(
        collections=int(values.size),
        total_ms=total,
        max_ms=float(values.max()) if values.size else 0.0,
        p99_ms=p99,
        share_pct=100.0 * total / 1e3 / wall_s,
    )
