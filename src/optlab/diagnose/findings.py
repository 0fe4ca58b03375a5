"""The vocabulary of a diagnosis rule's outcome: the numbers it read against its thresholds
(`Measure`), and whether it fired (`Fired`), found nothing (`Passed`) or lacked the evidence
(`Unevaluable`); with the confidence scale every rule uses (docs/diagnose.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Fired",
    "Measure",
    "NOT_APPLICABLE",
    "Outcome",
    "Params",
    "Passed",
    "Resource",
    "Unevaluable",
    "confidence",
    "past",
    "ramp",
]

Resource = Literal[
    "cpu",
    "gil",
    "gpu",
    "memory",
    "io",
    "lock",
    "queue",
    "generator",
    "network",
    "stall",
    "errors",
    "neighbour",
]


@dataclass(frozen=True)
class Measure:
    """One number a rule read, against the threshold it was judged by (`op`: how)."""

    metric: str
    value: float
    threshold: float | None
    op: Literal[">=", "<="] = ">="  # the direction that counts as a symptom
    unit: str = ""

    @property
    def met(self) -> bool:
        if self.threshold is None:
            return True
        return self.value >= self.threshold if self.op == ">=" else self.value <= self.threshold

    def describe(self) -> str:
        value = _fmt(self.value, self.unit)
        if self.threshold is None:
            return f"{self.metric} {value}"
        mark = self.op if self.met else {">=": "<", "<=": ">"}[self.op]
        return f"{self.metric} {value} {mark} {_fmt(self.threshold, self.unit)}"


def _fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:.0f}%" if abs(value) >= 10 else f"{value:.1f}%"
    if unit == "x":
        return f"{value:.2f}x" if abs(value) < 10 else f"{value:.0f}x"
    text = f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"{text} {unit}".rstrip()


@dataclass(frozen=True)
class Fired:
    stage: str | None
    confidence: float
    evidence: tuple[Measure, ...]
    summary: str  # one sentence: what is wrong, in the run's numbers


@dataclass(frozen=True)
class Passed:
    evidence: tuple[Measure, ...] = ()
    # False where the rule has nothing to read on this kind of target (a streaming target's
    # rules on a python one): passed, and left out of the text's "checked, nothing found".
    applies: bool = True


NOT_APPLICABLE = Passed((), applies=False)


@dataclass(frozen=True)
class Unevaluable:
    missing: str  # what evidence the run lacks, and how to get it


Outcome = Fired | Passed | Unevaluable
Params = Mapping[str, float]


def ramp(value: float, start: float, full: float) -> float:
    """0 at `start`, 1 at `full` (either direction), clamped."""
    if full == start:
        return 1.0 if value >= full else 0.0
    return min(1.0, max(0.0, (value - start) / (full - start)))


def confidence(*strengths: float, base: float = 0.55, span: float = 0.4) -> float:
    """base + span x the mean strength: a rule that just fires has `base`."""
    mean = sum(strengths) / len(strengths) if strengths else 1.0
    return round(min(1.0, base + span * mean), 3)


def past(
    m: Measure,
    stage: str | None,
    full: float,
    summary: str,
    *,
    base: float = 0.55,
    span: float = 0.4,
    context: tuple[Measure, ...] = (),
) -> Outcome:
    """A rule one threshold decides: Passed short of it; past it, Fired with a confidence from
    `base` at the threshold to `base + span` at `full`."""
    measures = (m, *context)
    if not m.met or m.threshold is None:
        return Passed(measures)
    strength = ramp(m.value, m.threshold, full)
    return Fired(stage, confidence(strength, base=base, span=span), measures, summary)
