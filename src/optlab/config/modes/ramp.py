"""The ramp: an open loop whose rate rises (or falls) linearly from `start_rate` to `rate` over
`ramp_s` seconds, then holds `rate`. The ramp is the warm-up: the measured phase starts once
it is over, at `rate`, latency measured from each intended send like the open loop.

The intended rate is lambda(t) = start + (rate - start) * t / ramp_s until ramp_s, then rate;
its integral, the expected sends by t, is

    Lambda(t) = start * t + (rate - start) * t^2 / (2 * ramp_s)        t <= ramp_s
    Lambda(t) = Lambda(ramp_s) + rate * (t - ramp_s)                   after.

Send k is at Lambda^-1(s_k): s_k = 0, 1, 2, ... for constant arrivals, the running sum of
Exp(1) draws for Poisson arrivals (a Poisson process of rate lambda(t) is a unit-rate one with
time rescaled by Lambda). The ramp's inverse is taken in the form that never divides by a
difference, t = 2s / (start + sqrt(start^2 + 2 (rate - start) s / ramp_s)), exact for a ramp
up or down and for start 0.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import Field, model_validator

from optlab.config.modes.base import (
    MAX_RATE,
    NS_PER_S,
    IndexedTrace,
    LoadCommon,
    LoadMode,
    Schedule,
)
from optlab.config.modes.open import CONSTANT_CHUNK, POISSON_CHUNK, MaxInFlight, SendingPool

__all__ = ["MAX_RAMP_S", "Ramp", "RampLoad", "ramp_offsets", "ramp_seconds"]

MAX_RAMP_S = 3600.0
START_FRACTION = 0.1  # `start_rate` when the file leaves it out: a tenth of `rate`


class RampLoad(LoadCommon):
    """An open loop whose rate rises linearly to `rate` over `ramp_s`, then holds it; measured
    once the ramp is over, latency from the intended send time."""

    mode: Literal["ramp"]
    rate: float = Field(
        gt=0, le=MAX_RATE, description="requests per second at the end of the ramp and after"
    )
    start_rate: float | None = Field(
        None,
        ge=0,
        le=MAX_RATE,
        description="requests per second at time zero; left out: a tenth of `rate`",
    )
    ramp_s: float = Field(
        gt=0,
        le=MAX_RAMP_S,
        description="seconds from `start_rate` to `rate`: the least warm-up, measured after it",
    )
    arrival: Literal["constant", "poisson"] = "poisson"
    max_in_flight: MaxInFlight = 512

    @model_validator(mode="before")
    @classmethod
    def _default_start(cls, data: Any) -> Any:
        # The file's load says what it ran at: a left-out start rate is stored as the number.
        if isinstance(data, dict) and data.get("start_rate") is None:
            rate = data.get("rate")
            if isinstance(rate, int | float) and not isinstance(rate, bool):
                return {**data, "start_rate": rate * START_FRACTION}
        return data

    @property
    def first_rate(self) -> float:
        """The rate at time zero."""
        return self.rate * START_FRACTION if self.start_rate is None else self.start_rate


class Ramp(SendingPool, LoadMode[RampLoad]):
    name = "ramp"
    model = RampLoad
    open_loop = True

    def peak_rate(self, load: RampLoad) -> tuple[float, str]:
        # A ramp down starts at its peak.
        if load.first_rate > load.rate:
            return load.first_rate, "start_rate"
        return load.rate, "rate"

    def schedule(self, load: RampLoad, n: int, seed: int, trace: IndexedTrace | None) -> Schedule:
        offsets = ramp_offsets(load.first_rate, load.rate, load.ramp_s, load.arrival, seed)
        return zip(offsets, itertools.cycle(range(n)), strict=False)

    def offered_qps(self, load: RampLoad) -> float:
        return load.rate  # the measured phase is after the ramp

    def min_warmup_s(self, load: RampLoad) -> float:
        return load.ramp_s

    def step(self, load: RampLoad, axis: LoadMode[Any], level: float) -> LoadCommon:
        # An open sweep's level keeps the ramp's shape: the same length, from the same
        # fraction of its rate (each level warms up linearly to its own rate).
        if axis.open_loop and axis.name == "open":
            # (A ramp down starts above its rate: kept within the open loop's most.)
            start = min(load.first_rate * level / load.rate, MAX_RATE)
            shape = {"rate": level, "start_rate": start}
            return RampLoad.model_validate({**load.model_dump(), **shape})
        return super().step(load, axis, level)


def ramp_seconds(expected: Any, start_rate: float, rate: float, ramp_s: float) -> Any:
    """Lambda^-1: the times (s) by which `expected` sends are due (numpy arrays in and out)."""
    import numpy as np

    s = np.asarray(expected, dtype=np.float64)
    at_end = (start_rate + rate) * ramp_s / 2  # Lambda(ramp_s)
    on_ramp = np.minimum(s, at_end)
    root = np.sqrt(np.maximum(start_rate**2 + 2 * (rate - start_rate) * on_ramp / ramp_s, 0.0))
    denominator = start_rate + root
    ramp = np.divide(2 * on_ramp, denominator, out=np.zeros_like(on_ramp), where=denominator > 0)
    return np.where(s <= at_end, ramp, ramp_s + (s - at_end) / rate)


def ramp_offsets(
    start_rate: float,
    rate: float,
    ramp_s: float,
    arrival: Literal["constant", "poisson"],
    seed: int,
) -> Iterator[int]:
    """The intended sends in ns from time zero, endless: constant arrivals at 0, 1, 2, ...
    expected sends, Poisson ones at the running sum of Exp(1) draws, each mapped through
    Lambda^-1 and rounded once (so rounding never drifts). Poisson draws come POISSON_CHUNK
    per numpy call, as the open loop's do; reproducible by seed."""
    import numpy as np

    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if not start_rate >= 0:
        raise ValueError(f"start_rate must be 0 or more, got {start_rate}")
    if not ramp_s > 0:
        raise ValueError(f"ramp_s must be positive, got {ramp_s}")

    def ns(expected: Any) -> list[int]:
        seconds = ramp_seconds(expected, start_rate, rate, ramp_s)
        return np.rint(seconds * NS_PER_S).astype(np.int64).tolist()  # type: ignore[no-any-return]

    def constant() -> Iterator[list[int]]:
        for first in itertools.count(0, CONSTANT_CHUNK):
            yield ns(np.arange(first, first + CONSTANT_CHUNK, dtype=np.float64))

    def poisson() -> Iterator[list[int]]:
        rng = np.random.default_rng(seed)
        last = 0.0
        while True:
            expected = np.cumsum(rng.exponential(1.0, POISSON_CHUNK)) + last
            last = float(expected[-1])
            yield ns(expected)

    return itertools.chain.from_iterable(constant() if arrival == "constant" else poisson())
