"""The latency objective a sweep judges each level by, and a capacity is read against:
`--slo p99=60ms` (docs/sweep-json.md); for a streaming LLM target, objectives on its token
series, all of which a level must meet: `--slo ttft_p99=500ms,tpot_p99=50ms`.

The one SLO type: the sweep, the store's sweep records and the reports' capacity column all
use it, and it is also its own JSON shape (`{"percentile": "p99", "ms": 60.0}`). The file's
`slo:` section (`config.models`) is a different thing, the limits a run's verdict checks.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from optlab.errors import OptlabError

__all__ = ["METRICS", "PERCENTILES", "Metric", "Objective", "Percentile", "Slo", "parse_slo"]

# The percentiles every run stores (`LatencyStats`), by the name a user writes.
PERCENTILES = {"p50": "p50", "p95": "p95", "p99": "p99", "p99.9": "p999", "p999": "p999"}
Percentile = Literal["p50", "p95", "p99", "p99.9"]
_UNITS = {"ms": 1.0, "s": 1000.0, "us": 0.001}
# What an objective bounds: the request's latency (E2E), or a streaming target's token series
# (docs/run-json.md "llm": TTFT from the intended send, TPOT, per-event ITL).
Metric = Literal["latency", "ttft", "tpot", "itl"]
METRICS: tuple[Metric, ...] = ("latency", "ttft", "tpot", "itl")
_FORMS = (
    "p50|p95|p99|p99.9 = a time: `p99=60ms`, `p95=0.2s`, `p99=60` (milliseconds); a streaming "
    "target's token series by name, several joined by commas: `ttft_p99=500ms,tpot_p99=50ms` "
    "(ttft, tpot, itl)"
)
_PATTERN = re.compile(
    r"^\s*(?:([a-z]+)_)?([a-z0-9.]+)\s*=\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-z]*)\s*$"
)
# Two SLOs are the same when their bounds agree to this (a bound read back from a float
# column, or from JSON, may differ in its last bits).
SAME_MS_REL = 1e-9


class Objective(BaseModel):
    """One more bound of an SLO: P<percentile> of `metric` at most `ms`."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    metric: Metric
    percentile: Percentile
    ms: float = Field(gt=0)

    @property
    def key(self) -> str:
        prefix = "" if self.metric == "latency" else f"{self.metric}_"
        return f"{prefix}{self.percentile}={self.ms:g}ms"

    @property
    def label(self) -> str:
        name = "" if self.metric == "latency" else f"{self.metric.upper()} "
        return f"{name}{self.percentile.upper()} ≤ {self.ms:g} ms"

    def observed(self, summary: Any) -> float | None:
        """This objective's figure in a run summary (`RunSummary`), ms; None without one."""
        field = PERCENTILES[self.percentile]
        if self.metric == "latency":
            series = summary.total
        else:
            llm = getattr(summary, "llm", None)
            series = getattr(llm, f"{self.metric}_ms", None) if llm is not None else None
        value = getattr(series, field, None) if series is not None else None
        return None if value is None else float(value)


class Slo(BaseModel):
    """P<percentile> of the end-to-end latency at most `ms` (of `metric`, for a streaming
    target's token series), and every objective in `also`: a level meets the SLO when it
    meets them all."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    percentile: Percentile  # as written in docs and JSON: p50, p95, p99, p99.9
    ms: float = Field(gt=0)
    metric: Metric = "latency"
    also: tuple[Objective, ...] = ()

    @model_serializer(mode="wrap")
    def _plain_as_before(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A latency percentile alone is `{"percentile", "ms"}`, as every sweep and table wrote
        # it before token series could be bounded.
        data: dict[str, Any] = handler(self)
        if self.metric == "latency":
            data.pop("metric", None)
        if not self.also:
            data.pop("also", None)
        return data

    def __init__(self, percentile: str | None = None, ms: float | None = None, **data: Any) -> None:
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
    def objectives(self) -> tuple[Objective, ...]:
        """Every bound, the first one first."""
        first = Objective(metric=self.metric, percentile=self.percentile, ms=self.ms)
        return (first, *self.also)

    @property
    def label(self) -> str:
        """`P99 ≤ 60 ms` (`TTFT P99 ≤ 500 ms and TPOT P99 ≤ 50 ms`): how tables and messages
        name it."""
        return " and ".join(o.label for o in self.objectives)

    @property
    def key(self) -> str:
        """`p99=60ms` (`ttft_p99=500ms,tpot_p99=50ms`): the canonical spelling, stored with
        every sweep."""
        return ",".join(o.key for o in self.objectives)

    @property
    def plain(self) -> bool:
        """One bound on the request latency: what a sweep's percentile and ms columns hold."""
        return self.metric == "latency" and not self.also

    def value_of(self, summary: Any) -> float | None:
        """What a run measured against this SLO, in ms on the first bound's scale: the first
        objective's figure, or, with several, the first bound times the largest share of its
        bound any objective used (so `value <= ms` exactly when every one is met). None when
        the run lacks a figure."""
        shares = []
        for objective in self.objectives:
            value = objective.observed(summary) if summary is not None else None
            if value is None:
                return None
            shares.append(value / objective.ms)
        if len(shares) == 1:
            return shares[0] * self.ms
        return max(shares) * self.ms

    def same_as(self, other: Slo) -> bool:
        """The same objectives: the same series and percentiles, and bounds equal but for
        float noise. The one rule for whether a capacity (or a sweep's level) answers this
        SLO."""
        mine, theirs = self.objectives, other.objectives
        return len(mine) == len(theirs) and all(
            a.metric == b.metric
            and a.percentile == b.percentile
            and math.isclose(a.ms, b.ms, rel_tol=SAME_MS_REL)
            for a, b in zip(mine, theirs, strict=True)
        )


def parse_slo(text: str) -> Slo:
    """`p99=60ms` → Slo("p99", 60.0); `ttft_p99=500ms,tpot_p99=50ms` → both bounds, the first
    first; anything else is refused with the accepted forms."""
    parts = [_objective(part, text) for part in text.split(",")]
    first, *rest = parts
    metrics = [o.metric for o in parts]
    if len(set(metrics)) < len(metrics):
        raise OptlabError(
            f"--slo {text!r} bounds one series twice", hint=f"accepted forms: {_FORMS}"
        )
    return Slo(first.percentile, first.ms, metric=first.metric, also=tuple(rest))


def _objective(part: str, text: str) -> Objective:
    found = _PATTERN.match(part.lower())
    if found is None:
        raise OptlabError(
            f"--slo {text!r} is not a latency objective",
            hint=f"accepted forms: {_FORMS}",
        )
    metric, name, number, unit = found.groups()
    metric = metric or "latency"
    if metric not in METRICS:
        raise OptlabError(
            f"--slo {text!r}: {metric!r} is not a series optlab bounds",
            hint=f"accepted forms: {_FORMS}",
        )
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
    return Objective(metric=metric, percentile=canonical, ms=ms)
