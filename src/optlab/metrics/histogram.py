"""Latency histograms: HdrHistogram storage with numpy-vectorised recording and statistics.

The counts live in the ``hdrh.histogram.HdrHistogram`` object so ``encode``/``decode`` produce the
standard HdrHistogram V2 wire format, but recording and statistics are done with numpy over a view
of the same counts array: the pure-Python ``record_value`` loop manages roughly 1M values/s, far
short of the harness's 200k requests/s with several series per request, and hdrh's
mean/percentile iterators walk every bucket in Python.
"""

from __future__ import annotations

import ctypes
import sys
from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt
from hdrh.histogram import HdrHistogram

__all__ = [
    "HIGHEST_NS",
    "LOWEST_NS",
    "SIGNIFICANT_DIGITS",
    "SUMMARY_KEYS",
    "LatencyHistogram",
]

LOWEST_NS = 1_000  # 1 µs resolution floor
HIGHEST_NS = 3_600 * 10**9  # one hour
SIGNIFICANT_DIGITS = 3

SUMMARY_KEYS = ("count", "min", "mean", "stddev", "p50", "p90", "p95", "p99", "p999", "max")
_PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p95", 95.0), ("p99", 99.0), ("p999", 99.9))
_NS_PER_MS = 1e6

Int64Array = npt.NDArray[np.int64]


class _Layout:
    """Bucket geometry shared by every histogram (they all use the same three settings)."""

    def __init__(self, proto: HdrHistogram) -> None:
        self.unit_magnitude: int = proto.unit_magnitude
        self.half_count_magnitude: int = proto.sub_bucket_half_count_magnitude
        self.half_count: int = proto.sub_bucket_half_count
        self.sub_bucket_mask: int = proto.sub_bucket_mask
        self.counts_len: int = proto.counts_len
        index = np.arange(self.counts_len, dtype=np.int64)
        # Mirrors hdrh get_value_from_index / get_highest_equivalent_value, vectorised once.
        bucket = (index >> self.half_count_magnitude) - 1
        sub = (index & (self.half_count - 1)) + self.half_count
        first = bucket < 0
        sub = np.where(first, sub - self.half_count, sub)
        bucket = np.where(first, 0, bucket)
        self.lowest: Int64Array = sub << (bucket + self.unit_magnitude)
        # Index 0 maps to value 0, whose equivalent range lies in bucket 0 like its neighbours.
        value_bucket = self.bucket_index(np.maximum(self.lowest, 0))
        size = np.left_shift(np.int64(1), value_bucket + self.unit_magnitude)
        self.highest: Int64Array = self.lowest + size - 1
        self.median: Int64Array = self.lowest + (size >> 1)

    def bucket_index(self, values: Int64Array) -> Int64Array:
        # Bit length via frexp is exact: every value is clamped to <= HIGHEST_NS < 2**53.
        _, exponent = np.frexp((values | self.sub_bucket_mask).astype(np.float64))
        result: Int64Array = exponent.astype(np.int64) - (
            self.unit_magnitude + self.half_count_magnitude + 1
        )
        return result

    def counts_index(self, values: Int64Array) -> Int64Array:
        """hdrh's ``_counts_index_for`` over an array."""
        bucket = self.bucket_index(values)
        sub = values >> (bucket + self.unit_magnitude)
        result: Int64Array = ((bucket + 1) << self.half_count_magnitude) + sub - self.half_count
        return result


@lru_cache(maxsize=1)
def _layout() -> _Layout:
    return _Layout(_new_hdr())


def _new_hdr() -> HdrHistogram:
    return HdrHistogram(LOWEST_NS, HIGHEST_NS, SIGNIFICANT_DIGITS)


def _counts_view(hdr: HdrHistogram) -> npt.NDArray[np.uint64]:
    counts: Any = hdr.counts
    if ctypes.sizeof(counts) != hdr.counts_len * 8:
        raise ValueError("histogram counts must be 64-bit words")
    view: npt.NDArray[np.uint64] = np.ctypeslib.as_array(counts)
    return view


class LatencyHistogram:
    """An HdrHistogram of nanosecond latencies, 1 µs to 1 h at 3 significant digits.

    Not thread-safe: one owner records (the collector's drain thread); readers take copies.
    """

    __slots__ = ("_clamped", "_counts", "_hdr")

    def __init__(self) -> None:
        self._init_from(_new_hdr())
        self._clamped = 0

    def _init_from(self, hdr: HdrHistogram) -> None:
        layout = _layout()
        if (
            hdr.counts_len != layout.counts_len
            or hdr.unit_magnitude != layout.unit_magnitude
            or hdr.sub_bucket_half_count_magnitude != layout.half_count_magnitude
        ):
            raise ValueError(
                "encoded histogram uses different settings than "
                f"{LOWEST_NS}..{HIGHEST_NS} ns at {SIGNIFICANT_DIGITS} digits"
            )
        self._hdr = hdr
        self._counts = _counts_view(hdr)

    # -- recording -----------------------------------------------------------------------------

    def record_ns(self, value_ns: int) -> None:
        value = int(value_ns)
        if value < LOWEST_NS:
            value = LOWEST_NS
            self._clamped += 1
        elif value > HIGHEST_NS:
            value = HIGHEST_NS
            self._clamped += 1
        self._hdr.record_value(value)

    def record_array(self, values_ns: npt.NDArray[Any]) -> None:
        """Record many values at once; the result is identical to ``record_ns`` in a loop."""
        values = np.asarray(values_ns).astype(np.int64, copy=False).ravel()
        if values.size == 0:
            return
        low = int(values.min())
        high = int(values.max())
        if low < LOWEST_NS or high > HIGHEST_NS:
            self._clamped += int(np.count_nonzero((values < LOWEST_NS) | (values > HIGHEST_NS)))
            values = np.clip(values, LOWEST_NS, HIGHEST_NS)
            low = max(min(low, HIGHEST_NS), LOWEST_NS)
            high = min(max(high, LOWEST_NS), HIGHEST_NS)
        layout = _layout()
        added = np.bincount(layout.counts_index(values), minlength=layout.counts_len)
        counts = self._counts
        counts += added.astype(np.uint64, copy=False)
        hdr = self._hdr
        hdr.total_count += int(values.size)
        hdr.min_value = min(hdr.min_value, low)
        hdr.max_value = max(hdr.max_value, high)

    def merge(self, other: LatencyHistogram) -> None:
        # hdrh's add() resets min to 0 when this side is empty; tracking it here avoids that.
        if other is self:
            other = other.copy()
        if other.count == 0:
            self._clamped += other._clamped
            return
        self._counts += other._counts
        hdr, src = self._hdr, other._hdr
        hdr.total_count += src.total_count
        hdr.min_value = min(hdr.min_value, src.min_value)
        hdr.max_value = max(hdr.max_value, src.max_value)
        self._clamped += other._clamped

    def copy(self) -> LatencyHistogram:
        clone = LatencyHistogram()
        clone.merge(self)
        return clone

    # -- wire format ---------------------------------------------------------------------------

    def encode(self) -> str:
        encoded: bytes = self._hdr.encode()
        return encoded.decode("ascii")

    @classmethod
    def decode(cls, encoded: str) -> LatencyHistogram:
        """Inverse of :meth:`encode`. The clamped count is not part of the wire format."""
        hdr = HdrHistogram.decode(encoded.encode("ascii"))
        hist = cls.__new__(cls)
        hist._init_from(hdr)
        hist._clamped = 0
        if hdr.total_count == 0:
            hdr.min_value = sys.maxsize
            hdr.max_value = 0
        return hist

    # -- statistics ----------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return int(self._hdr.total_count)

    @property
    def clamped(self) -> int:
        """Values recorded outside LOWEST_NS..HIGHEST_NS and stored at the nearest bound."""
        return self._clamped

    @property
    def counts(self) -> npt.NDArray[np.uint64]:
        """Read-only view of the raw HdrHistogram counts array (for tests and diagnostics)."""
        view = self._counts.view()
        view.flags.writeable = False
        return view

    def value_at_percentile_ns(self, percentile: float) -> int | None:
        return self._percentiles_ns([percentile])[0]

    def _percentiles_ns(self, percentiles: list[float]) -> list[int | None]:
        total = self.count
        if total == 0:
            return [None] * len(percentiles)
        layout = _layout()
        cumulative = np.cumsum(self._counts, dtype=np.uint64)
        out: list[int | None] = []
        for percentile in percentiles:
            # Same rank rule as hdrh get_value_at_percentile, so stored blobs re-read identically.
            requested = min(percentile, 100.0)
            target = max(int(requested * total / 100 + 0.5), 1)
            index = int(np.searchsorted(cumulative, np.uint64(target), side="left"))
            index = min(index, layout.counts_len - 1)
            table = layout.highest if percentile else layout.lowest
            out.append(int(table[index]))
        return out

    def min_ns(self) -> int | None:
        nonzero = np.flatnonzero(self._counts)
        return int(_layout().lowest[nonzero[0]]) if nonzero.size else None

    def max_ns(self) -> int | None:
        nonzero = np.flatnonzero(self._counts)
        return int(_layout().highest[nonzero[-1]]) if nonzero.size else None

    def mean_ns(self) -> float | None:
        if self.count == 0:
            return None
        weights = self._counts.astype(np.float64)
        return float(np.dot(weights, _layout().median) / self.count)

    def stddev_ns(self) -> float | None:
        mean = self.mean_ns()
        if mean is None:
            return None
        deviation = _layout().median.astype(np.float64) - mean
        weights = self._counts.astype(np.float64)
        return float(np.sqrt(np.dot(weights, deviation * deviation) / self.count))

    def summary_ms(self) -> dict[str, float | int | None]:
        """Count and latency statistics in milliseconds; values are None for an empty histogram.

        min/max/percentiles are bucket bounds (as HdrHistogram reports them) so a summary of a
        decoded blob equals the summary of the histogram that was encoded.
        """
        summary: dict[str, float | int | None] = {"count": self.count}
        if self.count == 0:
            summary.update({key: None for key in SUMMARY_KEYS[1:]})
            return summary
        summary["min"] = _ms(self.min_ns())
        summary["mean"] = _ms(self.mean_ns())
        summary["stddev"] = _ms(self.stddev_ns())
        values = self._percentiles_ns([p for _, p in _PERCENTILES])
        for (key, _), value in zip(_PERCENTILES, values, strict=True):
            summary[key] = _ms(value)
        summary["max"] = _ms(self.max_ns())
        return summary

    def __repr__(self) -> str:
        return f"LatencyHistogram(count={self.count}, clamped={self._clamped})"


def _ms(value_ns: float | None) -> float | None:
    return None if value_ns is None else float(value_ns) / _NS_PER_MS
