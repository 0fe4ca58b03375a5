"""A straight line through (x, y) points, and the requests a run had served at given moments:
what the RSS-against-requests trend of docs/run-json.md "evidence" is fitted from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Fit", "least_squares", "served_by"]


@dataclass(frozen=True)
class Fit:
    slope: float
    intercept: float
    # 0 when y does not vary: no trend to explain (scipy's linregress says NaN, 0/0, which
    # strict JSON cannot hold)
    r2: float


def least_squares(xs: Sequence[float], ys: Sequence[float]) -> Fit | None:
    """Ordinary least squares of y on x; None with fewer than 2 points or x all equal."""
    n = len(xs)
    if n != len(ys):
        raise ValueError(f"{n} x values but {len(ys)} y values")
    if n < 2:
        return None
    mean_x, mean_y = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mean_x) ** 2 for x in xs)
    syy = sum((y - mean_y) ** 2 for y in ys)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    if sxx <= 0:
        return None
    slope = sxy / sxx
    r2 = 0.0 if syy <= 0 else min(1.0, sxy * sxy / (sxx * syy))
    return Fit(slope, mean_y - slope * mean_x, r2)


def served_by(
    offsets_s: Sequence[float], windows: Sequence[tuple[float, float, int]]
) -> list[float]:
    """Requests completed by each offset (seconds into the phase), given the phase's windows
    as (start s, span s, completed): the windows before it whole, the one it falls in pro
    rata (requests spread evenly over a window)."""
    found = []
    for at in offsets_s:
        total = 0.0
        for start, span, completed in windows:
            if span <= 0 or at <= start:
                continue
            total += completed * min(1.0, (at - start) / span)
        found.append(total)
    return found
