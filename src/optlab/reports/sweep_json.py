"""The `optlab sweep --json` document as pydantic models (docs/sweep-json.md).

`reports.sweep.sweep_json` builds the document from the stored sweep; these models describe
what it holds, so that the JSON Schema in docs/schemas/ is generated from them and the tests
check real output against it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SweepDocument", "SweepLevelEntry", "SweepSlo"]

Limit = Literal["slo", "saturation", "errors", "generator"]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SweepObjective(_Closed):
    metric: Literal["latency", "ttft", "tpot", "itl"]
    percentile: Literal["p50", "p95", "p99", "p99.9"]
    ms: float = Field(gt=0)


class SweepSlo(_Closed):
    """The first bound (`metric` P<percentile> at most `ms`) and every further one (`also`):
    a level meets the SLO when it meets them all (docs/sweep-json.md)."""

    percentile: Literal["p50", "p95", "p99", "p99.9"]
    ms: float = Field(gt=0)
    metric: Literal["latency", "ttft", "tpot", "itl"] = "latency"
    also: list[SweepObjective] = Field(default_factory=list)


class SweepLevelEntry(_Closed):
    """One level: a stored run of the experiment at the sweep's load."""

    run_id: int
    offered_qps: float | None = Field(description="the rate asked for; null for a closed level")
    concurrency: int | None = Field(description="closed-loop clients; null for an open level")
    achieved_qps: float | None
    p50_ms: float | None
    p99_ms: float | None
    error_rate: float
    valid: bool
    meets_slo: bool = Field(description="met the SLO, the target kept up, the level was VALID")
    limit: Literal["slo", "saturation", "errors", "generator", "invalid"] | None = Field(
        description="what the level hit when it did not meet the SLO"
    )
    purpose: str = Field(description="why the strategy measured it: one client, growth, ...")
    reused: bool = Field(description="measured by an earlier sweep and reused")


class SweepDocument(_Closed):
    """The last stdout line of `optlab sweep --json` (one line per sweep with --chain)."""

    schema_version: Literal[1]
    sweep_id: int
    experiment: str
    status: Literal["RUNNING", "FINISHED", "FAILED", "KILLED", "CRASHED"]
    slo: SweepSlo
    mode: Literal["open", "closed"]
    capacity_qps: float | None = Field(
        description="the highest rate meeting the SLO; null when no rate met it"
    )
    capacity_interval: tuple[float, float] | None
    knee_qps: float | None
    knee_clients: int | None
    limited_by: Limit | None = Field(description="null: no limit was reached up to --max-rate")
    message: str | None
    method: str | None
    notes: list[str]
    protocol: str
    levels: list[SweepLevelEntry]
    measured_s: float | None = Field(description="warmup + measurement of the levels measured")
    error: str | None
