"""What every labelled fault target shares (`optlab.reference.faults` and `faults_extra`):
its knobs read as numbers with defaults, and a request counter for `metrics()`."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

__all__ = ["FaultTarget", "knob"]


def knob(knobs: Mapping[str, Any], name: str, default: float) -> float:
    """Knob `name` as a number >= 0 (`default` when absent)."""
    value = knobs.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ValueError(f"knob {name!r} must be a number >= 0, not {value!r}")
    return float(value)


class FaultTarget:
    """A fault target's shared part: its knobs and seed, the requests it served, `close()`."""

    fault = ""

    def __init__(self, knobs: Mapping[str, Any]) -> None:
        self.knobs = dict(knobs)
        self.seed = int(knob(knobs, "seed", 0))
        self._count_lock = threading.Lock()
        self.served = 0

    def _served(self) -> None:
        with self._count_lock:
            self.served += 1

    def metrics(self) -> dict[str, Any]:
        return {"fault": self.fault, "served": self.served}

    def reset_metrics(self) -> None:
        with self._count_lock:
            self.served = 0

    def close(self) -> None:
        return None
