"""A sweep's result: what `optlab sweep` found, typed and versioned (docs/sweep-json.md).

The sweep's driver builds it, `Store.finish_sweep` stores it (`stored_form`, in
`sweeps.result_json`), and every reader gets it back parsed once as `SweepRecord.result`:
capacity, its interval, the knee, what limited it, the one-sentence answer, the method and
notes. The capacity is stored here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["LIMITS", "SWEEP_RESULT_VERSION", "Limit", "SweepResult"]

# What set a sweep's capacity: the SLO, the target's saturation, errors, or the load generator.
Limit = Literal["slo", "saturation", "errors", "generator"]
LIMITS: tuple[Limit, ...] = ("slo", "saturation", "errors", "generator")

# 1: the only version so far (a result stored before it had a version reads as 1).
SWEEP_RESULT_VERSION: Final = 1


class SweepResult(BaseModel):
    """What one sweep came to."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    schema_version: Literal[1] = SWEEP_RESULT_VERSION
    capacity_qps: float | None = None  # None: no level met the SLO, or no answer yet
    capacity_interval: tuple[float, float] | None = None
    knee_qps: float | None = None
    knee_clients: int | None = None
    limited_by: Limit | None = None
    message: str  # one sentence: what the sweep found
    method: str  # how the capacity was estimated
    notes: tuple[str, ...] = ()

    @classmethod
    def from_stored(cls, value: Mapping[str, Any] | None) -> SweepResult | None:
        """The result as `sweeps.result_json` holds it (None: a sweep not finished)."""
        if value is None:
            return None
        return cls.model_validate({"schema_version": SWEEP_RESULT_VERSION, **value})

    def stored_form(self) -> dict[str, Any]:
        """What `sweeps.result_json` holds."""
        return self.model_dump(mode="json")
