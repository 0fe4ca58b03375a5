"""The closed loop: N clients, each sending its next request when its last one returns."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from optlab.config.modes.base import MAX_CONCURRENCY, LoadCommon, LoadMode

__all__ = ["Closed", "ClosedLoad"]


class ClosedLoad(LoadCommon):
    """N clients, each sending its next request as soon as the last one returns."""

    mode: Literal["closed"]
    concurrency: int = Field(ge=1, le=MAX_CONCURRENCY)


class Closed(LoadMode[ClosedLoad]):
    name = "closed"
    model = ClosedLoad
    open_loop = False

    def in_flight_limit(self, load: ClosedLoad) -> int:
        return load.concurrency

    def in_flight_per_process(self, load: ClosedLoad) -> int:
        # The clients are dealt out to the processes (load/aio.py: every n-th one each).
        return math.ceil(load.concurrency / load.generators)

    def in_flight_field(self, load: ClosedLoad) -> str:
        return "concurrency"

    def clients(self, load: ClosedLoad) -> int:
        return load.concurrency

    def at_level(self, level: float, like: LoadCommon) -> ClosedLoad:
        return ClosedLoad(
            mode="closed", concurrency=int(level), processes=like.processes, hosts=like.hosts
        )
