"""The open loop: requests at a fixed rate (constant or Poisson arrivals) whatever the target
does, latency measured from each request's intended send time (wrk2's correction for
coordinated omission)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Annotated, Any, Literal

from pydantic import Field

from optlab.config.modes.base import (
    MAX_RATE,
    NS_PER_S,
    IndexedTrace,
    LoadCommon,
    LoadMode,
    Schedule,
)

__all__ = [
    "CONSTANT_CHUNK",
    "POISSON_CHUNK",
    "MaxInFlight",
    "Open",
    "OpenLoad",
    "SendingPool",
    "constant_offsets",
    "poisson_offsets",
]

POISSON_CHUNK = 4096  # its draws depend on it: changing it changes every seed's arrivals
# Constant offsets computed per numpy call (~20 µs here, a hiccup the leader absorbs).
CONSTANT_CHUNK = 1024


# The open-loop modes' sending pool (open, ramp): one definition of the field and its limits.
MaxInFlight = Annotated[
    int,
    Field(
        ge=1,
        le=100_000,
        description="threads available to the open loop; when all are busy, requests leave "
        "late and the generator reports that it fell behind",
    ),
]


class SendingPool:
    """For a mode whose load has `max_in_flight` (open, ramp): its sending pool is the limit."""

    def in_flight_limit(self, load: Any) -> int:
        return int(load.max_in_flight)

    def in_flight_field(self, load: Any) -> str:
        return "max_in_flight"


class OpenLoad(LoadCommon):
    """Requests at a fixed rate whatever the service does; latency from the intended send time."""

    mode: Literal["open"]
    rate: float = Field(gt=0, le=MAX_RATE, description="requests per second")
    arrival: Literal["constant", "poisson"] = "poisson"
    max_in_flight: MaxInFlight = 512


class Open(SendingPool, LoadMode[OpenLoad]):
    name = "open"
    model = OpenLoad
    open_loop = True

    def peak_rate(self, load: OpenLoad) -> tuple[float, str]:
        return load.rate, "rate"

    def schedule(self, load: OpenLoad, n: int, seed: int, trace: IndexedTrace | None) -> Schedule:
        if load.arrival == "constant":
            offsets = constant_offsets(load.rate)
        else:
            offsets = poisson_offsets(load.rate, seed)
        return zip(offsets, itertools.cycle(range(n)), strict=False)

    def offered_qps(self, load: OpenLoad) -> float:
        return load.rate

    def at_level(self, level: float, like: LoadCommon) -> OpenLoad:
        # An open loop keeps its arrival process and sending pool at every level.
        if isinstance(like, OpenLoad):
            return OpenLoad(
                mode="open",
                rate=level,
                processes=like.processes,
                hosts=like.hosts,
                arrival=like.arrival,
                max_in_flight=like.max_in_flight,
            )
        return OpenLoad(mode="open", rate=level, processes=like.processes, hosts=like.hosts)


def constant_offsets(rate: float) -> Iterator[int]:
    """0, 1/rate, 2/rate, ... in ns: each offset from its index, so rounding never drifts."""
    import numpy as np

    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    period = NS_PER_S / rate

    def chunks() -> Iterator[list[int]]:
        for first in itertools.count(0, CONSTANT_CHUNK):
            # rint rounds half to even, as round() does, of the same float product.
            yield (
                np.rint(np.arange(first, first + CONSTANT_CHUNK) * period).astype(np.int64).tolist()
            )

    # Offsets are taken from each chunk's list in C, a Python frame resumed per chunk only: the
    # open loop's leader draws one per request.
    return itertools.chain.from_iterable(chunks())


def poisson_offsets(rate: float, seed: int) -> Iterator[int]:
    """Arrivals of a Poisson process: exponential gaps with mean 1/rate, reproducible by seed.

    Gaps are drawn in chunks (one numpy call per POISSON_CHUNK arrivals) and accumulated in
    float ns, then rounded per arrival, so long runs do not accumulate rounding error.
    """
    import numpy as np

    if not rate > 0:
        raise ValueError(f"rate must be positive, got {rate}")
    rng = np.random.default_rng(seed)
    scale = NS_PER_S / rate

    def chunks() -> Iterator[list[int]]:
        last = 0.0
        while True:
            times = np.cumsum(rng.exponential(scale, POISSON_CHUNK)) + last
            last = float(times[-1])
            # tolist() turns the chunk into Python ints once, not one numpy scalar per arrival.
            yield np.rint(times).astype(np.int64).tolist()

    return itertools.chain.from_iterable(chunks())
