"""What a sweep probes and how a measured level is judged: the strategy's vocabulary.

A `Probe` is a load to measure (requests/s, or clients); a `Level` is what it came to; `judge`
says whether a level met the SLO with the target keeping up, or which limit it hit. The
strategy (`optlab.sweep.strategy`) is built from these.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from optlab.config.slo import Slo
from optlab.run.pace import saturated_by
from optlab.store.sweep_result import LIMITS, Limit

Mode = Literal["open", "closed"]

REFINE_DURATION_FACTOR = 4.0

# Levels that narrow the bracket, measured 4x longer; a rate measured again ("again") is too:
# a short retry that passed narrowly would not vouch for its rate, and bisection would come
# back to it.
REFINING = (
    "model",
    "bisection",
    "confirm",
    "again",
)


@dataclass(frozen=True)
class Settings:
    mode: Mode
    slo: Slo
    min_rate: float | None = None  # requests/s (open) or clients (closed)
    max_rate: float | None = None
    tolerance: float = 0.05  # the bracket's relative width at which the search stops
    budget_s: float | None = None  # measured seconds (warmup included) the sweep may spend
    max_error_rate: float = 0.01


@dataclass(frozen=True)
class Probe:
    """One level to measure: `clients` closed-loop clients, or `rate` requests/s."""

    mode: Mode
    load: float  # requests/s (open) or clients (closed)
    purpose: str  # "one client", "growth", "model", "bisection": said in the progress line

    @property
    def duration_factor(self) -> float:
        """Levels that narrow the bracket measure longer: their percentile decides the
        capacity, and a tail percentile's noise falls only as the square root of time."""
        return REFINE_DURATION_FACTOR if self.purpose in REFINING else 1.0


@dataclass(frozen=True)
class Level:
    """What one measured level came to."""

    mode: Mode
    load: float  # requests/s offered (open) or clients (closed)
    achieved_qps: float | None
    p50_ms: float | None
    value_ms: float | None  # the SLO's percentile of the end-to-end latency
    value_se_ms: float | None  # its standard error (batch means of the level's seconds)
    error_rate: float
    valid: bool
    reasons: tuple[str, ...] = ()
    generator: str | None = None  # why the load generator, not the target, set the limit
    failed: str | None = None  # the run FAILED: its error
    measured_s: float = 0.0  # warmup + measurement
    duration_s: float = 0.0  # the measured phase alone
    run_id: int | None = None
    p99_ms: float | None = None
    purpose: str = ""  # why it was measured (`Probe.purpose`)
    qps_se: float | None = None  # the achieved rate's standard error (its seconds' batch means)
    # INVALID reasons that did not decide this level's verdict (a generator that fell behind
    # by less than the SLO's margin: its lag is inside the latency measured)
    excused: tuple[str, ...] = ()
    # Open loop: the run's verdict on saturation (its `saturated` reason code: the one rule,
    # `run.pace.saturated_by`, on the run's in-flight backlog); None where no verdict judged
    # the level (a simulated one), which is then judged by its figures alone.
    saturated: bool | None = None

    @property
    def counts_as_valid(self) -> bool:
        """VALID, or INVALID only for reasons that did not decide its verdict."""
        return self.valid or bool(self.reasons) and set(self.reasons) <= set(self.excused)

    @property
    def offered_qps(self) -> float | None:
        return self.load if self.mode == "open" else None


def judge(level: Level, settings: Settings) -> Limit | Literal["invalid"] | None:
    """None when the level meets the SLO and the target kept up; else the limit it hit."""
    if level.failed is not None:
        return "errors"
    if level.error_rate > settings.max_error_rate:
        return "errors"
    if level.generator is not None:
        return "generator"
    if level.mode == "open" and _saturated(level):
        return "saturation"
    if level.value_ms is None or level.value_ms > settings.slo.ms:
        return "slo"
    if not level.counts_as_valid:
        return "invalid"
    return None


def _saturated(level: Level) -> bool:
    """The target could not sustain the offered rate: the verdict's own judgement where the
    level has one, else the one rule (`run.pace.saturated_by`) on its figures alone
    (completions more than 5% and 3 sigma of Poisson arrivals short of the rate)."""
    if level.saturated is not None:
        return level.saturated
    return saturated_by(
        level.load, level.achieved_qps, level.duration_s, backlog_grew=None, limit_reached=None
    )


def open_levels(levels: Sequence[Level]) -> list[Level]:
    return [level for level in levels if level.mode == "open"]


MEASURES_PER_RATE = 2  # an inconclusive rate is measured once more before it counts as a limit
AGAIN = REFINING[-1]  # the purpose of that second measurement


def inconclusive(level: Level, settings: Settings) -> bool:
    """An open level whose verdict is not the target's: the load generator decided it, or it
    met the SLO but was INVALID (unstable halves, too few queries). One such level is noise as
    often as not (send lag moves 0.2-3.6 ms between identical quiet runs): measured again."""
    return level.mode == "open" and judge(level, settings) in ("generator", "invalid")


def settled(levels: Sequence[Level], settings: Settings) -> list[Level]:
    """The open levels that stand: an inconclusive level no longer counts once its rate was
    measured again and came out conclusive."""
    opened = open_levels(levels)
    decided = {round(lv.load, 6) for lv in opened if not inconclusive(lv, settings)}
    return [
        lv for lv in opened if round(lv.load, 6) not in decided or not inconclusive(lv, settings)
    ]


def remeasure(levels: Sequence[Level], settings: Settings, hi: float | None) -> Probe | None:
    """The lowest inconclusive rate at or below `hi` (the bracket's failing end) that was
    measured fewer than MEASURES_PER_RATE times: measured again, with its own seed."""
    opened = open_levels(levels)
    for level in sorted(settled(levels, settings), key=lambda lv: lv.load):
        if hi is not None and level.load > hi * (1 + 1e-9):
            break
        if not inconclusive(level, settings):
            continue
        same = sum(1 for lv in opened if round(lv.load, 6) == round(level.load, 6))
        if same < MEASURES_PER_RATE:
            return Probe("open", level.load, AGAIN)
    return None


def contract_limit(limit: str | None) -> Limit | None:
    """`invalid` (unstable, too short) is reported as saturation: the target did not hold
    steady at that load."""
    if limit == "invalid":
        return "saturation"
    return limit if limit in LIMITS else None


def refining(level: Level) -> bool:
    """Measured at the refining length, to narrow the bracket."""
    return level.purpose in REFINING
