"""The `optlab table --format json` document as pydantic models (docs/table-json.md).

These models are the output: `reports.stacked.StackedTable.to_document()` builds a
`TableDocument` and `reports.export.render_json` writes its dump; the JSON Schema in
docs/schemas/ is generated from them. Three serializers keep the bytes the document had when
it was a hand-built dict: the protocol is written as stored (its keys in the store's order,
only those it has), an environment without a `service` note has no `service` key, and a
table without an SLO has no `capacity` key in its entries. A chain entry also holds one
`<stage>_p50_ms` key per stage the runs recorded (`preprocess_p50_ms`, `server_total_p50_ms`,
...): the only keys the schema leaves open.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from optlab.config.slo import Slo

# A stage's P50 column: the table adds one per stage the chain's runs recorded.
STAGE_COLUMN_PATTERN = r"^[A-Za-z0-9_.-]+_p50_ms$"

Verdict = Literal[
    "baseline", "gain", "within noise", "regressed", "not judged", "missing", "missing parent"
]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Delta(_Closed):
    """Change in percent of QPS, P50 and P99, with the bounds of its interval (null when the
    step was not judged). Positive is higher: a P99 delta of -20 is 20% faster."""

    qps_pct: float | None
    qps_low_pct: float | None
    qps_high_pct: float | None
    p50_pct: float | None
    p50_low_pct: float | None
    p50_high_pct: float | None
    p99_pct: float | None
    p99_low_pct: float | None
    p99_high_pct: float | None


class LlmDelta(_Closed):
    """A streaming step's change in percent of TTFT P50/P99, TPOT P50/P99 and output
    tokens/s, with the bounds of each interval, judged from the runs' per-second windows as
    `Delta`'s are (null when the step was not judged, or a side has no such figure)."""

    ttft_p50_pct: float | None
    ttft_p50_low_pct: float | None
    ttft_p50_high_pct: float | None
    ttft_p99_pct: float | None
    ttft_p99_low_pct: float | None
    ttft_p99_high_pct: float | None
    tpot_p50_pct: float | None
    tpot_p50_low_pct: float | None
    tpot_p50_high_pct: float | None
    tpot_p99_pct: float | None
    tpot_p99_low_pct: float | None
    tpot_p99_high_pct: float | None
    output_tps_pct: float | None
    output_tps_low_pct: float | None
    output_tps_high_pct: float | None


class CapacityDelta(_Closed):
    """A change of capacity in percent, and its interval at the document's `confidence`
    (null where a side has no capacity, or a sweep gives no interval)."""

    pct: float | None
    low_pct: float | None
    high_pct: float | None


class Capacity(_Closed):
    """The step's capacity under the table's SLO, from its newest finished sweep of its
    current config under the chain's sweep protocol and environment; or why it has none."""

    qps: float | None = Field(description="requests/s that meet the SLO; null: none here")
    interval: list[float] | None = Field(
        min_length=2, max_length=2, description="[low, high] requests/s, the sweep's 95% interval"
    )
    knee_qps: float | None = Field(description="the knee of latency against throughput")
    slo: Slo
    sweep_id: int | None = Field(description="the sweep that stands for the step")
    step_delta: CapacityDelta = Field(description="against the parent step")
    cumulative_delta: CapacityDelta = Field(description="against the baseline")
    significant: bool | None = Field(
        description="Δ step beyond noise (z-test on the two sweeps' intervals); null: not judged"
    )
    cumulative_significant: bool | None = Field(description="Δ cum beyond noise")
    verdict: Literal["gain", "within noise", "regressed", "not judged"] | None = Field(
        description="capacity's own verdict on its Δ step (not the runs'); null: no Δ step"
    )
    loop: Literal["open", "closed"] | None = Field(
        description="the loop of the sweep that found it: open (a rate it sustains) or closed "
        "(the throughput of N clients); null: no sweep"
    )
    reason: str | None = Field(description="why the capacity or a Δ is missing")


class ChainEntry(BaseModel):
    """One step of the chain, baseline first, in the order the document writes its keys."""

    model_config = ConfigDict(
        extra="allow",
        frozen=True,
        json_schema_extra={
            "additionalProperties": False,
            "patternProperties": {STAGE_COLUMN_PATTERN: {"type": ["number", "null"]}},
        },
    )

    experiment: str
    variable: str | None = Field(description="the knob this step changed; null for the baseline")
    change: str | None = Field(description="`old -> new`, as the table shows it")
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    qps: float | None
    step_delta: Delta = Field(description="against the previous measured step")
    cumulative_delta: Delta = Field(description="against the baseline")
    significant: bool | None = Field(
        description="a headline metric changed beyond noise; null when not judged"
    )
    verdict: Verdict
    decided_by: list[str] = Field(description="the metrics that decided the verdict")
    capacity: Capacity | None = Field(
        None, description="only in a table with an SLO to judge capacity by (a swept chain)"
    )
    hypothesis: str | None
    run_id: int | None = Field(description="the run that stands for the step; null if missing")
    runs: int = Field(ge=0, description="runs of the step under the chain's protocol")
    status: Literal["RUNNING", "FINISHED", "FAILED", "KILLED", "CRASHED"] | None
    valid: bool | None
    provisional: bool | None
    missing: str | None = Field(description="why the step has no comparable run")
    p999_ms: float | None
    error_rate: float | None = Field(description="errors / (requests + errors), 0..1")
    cpu_pct: float | None = Field(description="optlab's process CPU, mean, % of one core")
    service_cpu_pct: float | None = Field(description="a started service's CPU, mean, %")
    gpu_util_pct: float | None
    gpu_mem_peak_mib: float | None
    accuracy_top1: float | None
    infer_ms_per_request: float | None
    mean_batch_size: float | None
    cache_hit_rate: float | None
    ttft_p50_ms: float | None = Field(None, description="a streaming LLM target's TTFT P50")
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = Field(None, description="(E2E − TTFT)/(tokens − 1), P50")
    tpot_p99_ms: float | None = None
    itl_p99_ms: float | None = Field(None, description="per-event gap, P99")
    output_tps: float | None = Field(None, description="output tokens per second")
    goodput: float | None = Field(None, description="share of requests within slo.ttft_ms/tpot_ms")
    goodput_low: float | None = Field(None, description="its 99% interval's lower bound")
    goodput_high: float | None = Field(None, description="its 99% interval's upper bound")
    llm_step_delta: LlmDelta | None = Field(
        None, description="in a table with a streaming step: the token figures' step changes"
    )
    llm_cumulative_delta: LlmDelta | None = Field(
        None, description="... and their changes against the baseline"
    )
    flags: list[str] = Field(description="trade-offs: a metric gained while another broke")
    slo_pass: bool | None = Field(description="null when the SLO sets no latency or QPS bound")
    slo_failures: list[str]
    reasons: list[str] = Field(description="why the run is INVALID")
    git_commit: str | None
    started_at: str | None = Field(description="ISO 8601, UTC")
    who: str | None = Field(description="user@host that measured the run")
    step_confidence: float | None = Field(
        description="the level of step_delta's intervals: the document's `confidence` for one "
        "run a side, 1 - 0.01/3 where pairs or repeats measure the run-to-run spread; null "
        "when not judged",
    )
    cumulative_confidence: float | None = Field(
        description="the level of cumulative_delta's intervals; null when not judged"
    )
    step_method: str | None = Field(
        description="the statistic that judged the step (paired t on log-ratios, Welch t ...)"
    )
    knob_sweep: int | None = Field(
        None,
        description="the `optlab sweep-knob` this step was promoted from (its runs are the "
        "sweep's blocks, compared with the parent block by block); null otherwise",
    )

    @model_serializer(mode="wrap")
    def _capacity_only_when_judged(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("capacity", 0) is None:
            del data["capacity"]
        return data


class ProtocolInfo(BaseModel):
    """The protocol of the head's newest run: every step shown was measured under it."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: Literal["full", "quick"]
    duration_s: float
    provisional: bool
    warmup: Literal["stable", "fixed"] | None = None
    warmup_s: float | None = None
    warmup_max_s: float | None = None
    max_error_rate: float | None = None
    max_send_lag_p99_ms: float | None = None
    stability_window_s: float | None = None
    stability_tolerance: float | None = None

    # The protocol as stored: the JSON writes its keys in the store's order, only those it
    # has, each as stored (a whole number of seconds stays one).
    _stored: dict[str, Any] | None = PrivateAttr(default=None)

    @model_validator(mode="wrap")
    @classmethod
    def _keep_stored(cls, data: Any, handler: Any) -> Any:
        model = handler(data)
        if isinstance(data, Mapping):
            model._stored = dict(data)
        return model

    @model_serializer(mode="wrap")
    def _as_stored(self, handler: SerializerFunctionWrapHandler) -> Any:
        if self._stored is None:
            return handler(self)
        return dict(self._stored)  # validated above; written as the store holds it


class EnvironmentInfo(_Closed):
    summary: str = Field(description="one line: CPU, memory, GPU, Python, engines")
    material_hash: str | None = Field(description="hash of what makes two machines comparable")
    fingerprint: dict[str, Any] = Field(description="the full fingerprint (`optlab env --json`)")
    service: str | None = Field(
        None, description="whether a service's own environment was checked (command/http)"
    )

    @model_serializer(mode="wrap")
    def _service_only_when_noted(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict) and data.get("service", 0) is None:
            del data["service"]
        return data


class TableDocument(_Closed):
    """`optlab table --format json`."""

    schema_version: Literal[1] = Field(description="raised when a key changes meaning or goes")
    head: str
    protocol: ProtocolInfo | None = Field(description="null when the head's chain has no run")
    protocol_label: str
    environment: EnvironmentInfo
    confidence: float = Field(
        gt=0,
        lt=1,
        description="the level of an interval from one run a side; a step judged on pairs or "
        "repeats gives its own (`step_confidence`, `cumulative_confidence`)",
    )
    chain: list[ChainEntry]


__all__ = ["Capacity", "CapacityDelta", "ChainEntry", "Delta", "LlmDelta", "TableDocument"]
