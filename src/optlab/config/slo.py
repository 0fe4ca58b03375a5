"""The latency objective a sweep judges each level by, and a capacity is read against:
`--slo p99=60ms` (docs/sweep-json.md).

The one SLO type: the sweep, the store's sweep records and the reports' capacity column all
use it, and it is also its own JSON shape (`{"percentile": "p99", "ms": 60.0}`). The file's
`slo:` section (`config.models`) is a different thing, the limits a run's verdict checks.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from optlab.errors import OptlabError

__all__ = ["PERCENTILES", "Percentile", "Slo", "parse_slo"]

# The percentiles every run stores (`LatencyStats`), by the name a user writes.
PERCENTILES = {"p50": "p50", "p95": "p95", "p99": "p99", "p99.9": "p999", "p999": "p999"}
Percentile = Literal["p50", "p95", "p99", "p99.9"]
_UNITS = {"ms": 1.0, "s": 1000.0, "us": 0.001}
_FORMS = "p50|p95|p99|p99.9 = a time: `p99=60ms`, `p95=0.2s`, `p99=60` (milliseconds)"
_PATTERN = re.compile(r"^\s*([a-z0-9.]+)\s*=\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]*)\s*$")
# Two SLOs are the same when their bounds agree to this (a bound read back from a float
# column, or from JSON, may differ in its last bits).
SAME_MS_REL = 1e-9


class Slo(BaseModel):
    """P<percentile> of the end-to-end latency at most `ms`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    percentile: Percentile  # as written in docs and JSON: p50, p95, p99, p99.9
    ms: float = Field(gt=0)

    def __init__(
        self, percentile: str | None = None, ms: float | None = None, **data: Any
    ) -> None:
        # Positional too (`Slo("p99", 60.0)`), as the dataclass it replaces was built.
        if percentile is not None:
            data["percentile"] = percentile
        if ms is not None:
            data["ms"] = ms
        super().__init__(**data)

    @property
    def field(self) -> str:
        """The `LatencyStats` attribute that holds this percentile."""
        return PERCENTILES[self.percentile]

    @property
    def label(self) -> str:
        """`P99 ≤ 60 ms`: how tables and messages name it."""
        return f"{self.percentile.upper()} ≤ {self.ms:g} ms"

    @property
    def key(self) -> str:
        """`p99=60ms`: the canonical spelling, stored with every sweep."""
        return f"{self.percentile}={self.ms:g}ms"

    def same_as(self, other: Slo) -> bool:
        """The same objective: the same percentile, and bounds equal but for float noise.
        The one rule for whether a capacity (or a sweep's level) answers this SLO."""
        return self.percentile == other.percentile and math.isclose(
            self.ms, other.ms, rel_tol=SAME_MS_REL
        )


def parse_slo(text: str) -> Slo:
    """`p99=60ms` → Slo("p99", 60.0); anything else is refused with the accepted forms."""
    found = _PATTERN.match(text.lower())
    if found is None:
        raise OptlabError(
            f"--slo {text!r} is not a latency objective",
            hint=f"accepted forms: {_FORMS}",
        )
    name, number, unit = found.groups()
    if name not in PERCENTILES:
        raise OptlabError(
            f"--slo {text!r}: {name!r} is not a percentile optlab records",
            hint=f"accepted forms: {_FORMS}",
        )
    if unit not in _UNITS and unit != "":
        raise OptlabError(
            f"--slo {text!r}: unknown unit {unit!r}",
            hint=f"accepted forms: {_FORMS}",
        )
    ms = float(number) * _UNITS.get(unit, 1.0)
    if not math.isfinite(ms) or ms <= 0:
        raise OptlabError(
            f"--slo {text!r}: the latency must be a positive time",
            hint=f"accepted forms: {_FORMS}",
        )
    canonical = "p99.9" if name in ("p99.9", "p999") else name
    return Slo(canonical, ms)
