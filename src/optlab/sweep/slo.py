"""The latency objective a sweep judges each level by: `--slo p99=60ms`."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from optlab.errors import OptlabError

__all__ = ["PERCENTILES", "Slo", "parse_slo"]

# The percentiles every run stores (`LatencyStats`), by the name a user writes.
PERCENTILES = {"p50": "p50", "p95": "p95", "p99": "p99", "p99.9": "p999", "p999": "p999"}
_UNITS = {"ms": 1.0, "s": 1000.0, "us": 0.001}
_FORMS = "p50|p95|p99|p99.9 = a time: `p99=60ms`, `p95=0.2s`, `p99=60` (milliseconds)"
_PATTERN = re.compile(r"^\s*([a-z0-9.]+)\s*=\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]*)\s*$")


@dataclass(frozen=True)
class Slo:
    """P<percentile> of the end-to-end latency at most `ms`."""

    percentile: str  # as written in docs and JSON: p50, p95, p99, p99.9
    ms: float

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
