"""A change between two measurements, in percent, and how it is written: one definition for
the run's own summary, the stacked table, the gate, the statistics' flags and every report.
Kept apart from `metrics.stats` so that the reports can write a change without numpy."""

from __future__ import annotations


def percent_change(old: float | None, new: float | None) -> float | None:
    """`new` against `old` in percent of `old`; None when either is unknown or `old` is 0."""
    if old is None or new is None or old == 0:
        return None
    return (float(new) - float(old)) / float(old) * 100.0


def signed_pct(delta: float, digits: int | None = None) -> str:
    """`+50%`, `-2.5%`: with `digits` None, whole percents from 10% up, one decimal below
    (a verdict's or a flag's figure, short enough to read in a sentence)."""
    if digits is None:
        digits = 0 if abs(delta) >= 10 else 1
    return f"{delta:+.{digits}f}%"
