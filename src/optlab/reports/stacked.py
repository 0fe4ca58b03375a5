"""The stacked-gains table as one frozen typed document: a `TableHeader` (what the chain was
measured under) and one `TableRow` per step, baseline first.

`reports.table.stacked_table` builds it; the terminal, markdown, HTML, CSV and JSON renderers,
`optlab check` (`reports.gate`), `optlab audit` and `reports.data.collect_report` read its
fields. The JSON of `optlab table --format json` is `StackedTable.to_document()`, the
`reports.table_json` models (docs/table-json.md). pandas appears only at the edge:
`to_frame()` gives the DataFrame that `optlab.api.chain_table` returns to notebooks (with
today's `attrs`) and that the CSV is written from.

A row's cells keep the table's column names (`COLUMNS`, `<stage>_p50_ms`, and, in a table that
judges capacity, `CAPACITY_COLUMNS`), so `row.get(column)` reads any of them by name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator

from optlab.config.slo import Slo
from optlab.reports.columns import (
    CAPACITY_COLUMNS,
    COLUMNS,
    LLM_COLUMNS,
    LLM_DELTA_COLUMNS,
    LLM_DELTA_METRICS,
    LLM_DELTA_PARTS,
    stage_column,
    stage_of,
)
from optlab.reports.table_json import (
    Capacity,
    CapacityDelta,
    ChainEntry,
    Delta,
    EnvironmentInfo,
    LlmDelta,
    TableDocument,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "CAPACITY_COLUMNS",
    "COLUMNS",
    "TABLE_SCHEMA_VERSION",
    "CapacitySlo",
    "StackedTable",
    "StepCapacityRow",
    "TableHeader",
    "LLM_COLUMNS",
    "LLM_DELTA_COLUMNS",
    "LLM_DELTA_METRICS",
    "TableRow",
    "stage_column",
    "stage_of",
]

TABLE_SCHEMA_VERSION: Literal[1] = 1

_LISTS = ("decided_by", "flags", "slo_failures", "reasons")


def _finite(value: Any) -> Any:
    """NaN and infinities are no figure: None, as the JSON writes them."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Figures(_Frozen):
    """A row of figures: a NaN or infinity given to any field (or a dict field's values) is
    stored as None."""

    @field_validator("*", mode="before")
    @classmethod
    def no_figure_is_nan(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: _finite(v) for k, v in value.items()}
        return _finite(value)


class StepCapacityRow(_Figures):
    """One step's capacity under the table's SLO (`reports.capacity`), or why it has none."""

    capacity_qps: float | None = None
    capacity_low_qps: float | None = None
    capacity_high_qps: float | None = None
    capacity_knee_qps: float | None = None
    capacity_sweep_id: int | None = None
    capacity_step_pct: float | None = None
    capacity_step_low_pct: float | None = None
    capacity_step_high_pct: float | None = None
    capacity_cumulative_pct: float | None = None
    capacity_cumulative_low_pct: float | None = None
    capacity_cumulative_high_pct: float | None = None
    capacity_significant: bool | None = None
    capacity_cumulative_significant: bool | None = None
    capacity_reason: str | None = None
    capacity_verdict: Literal["gain", "within noise", "regressed", "not judged"] | None = None
    capacity_loop: Literal["open", "closed"] | None = None

    def document(self, slo: Slo) -> Capacity:
        """The JSON's `capacity` object of the step."""

        def delta(kind: str) -> CapacityDelta:
            return CapacityDelta(
                pct=getattr(self, f"capacity_{kind}_pct"),
                low_pct=getattr(self, f"capacity_{kind}_low_pct"),
                high_pct=getattr(self, f"capacity_{kind}_high_pct"),
            )

        low, high = self.capacity_low_qps, self.capacity_high_qps
        return Capacity(
            qps=self.capacity_qps,
            interval=[low, high] if low is not None and high is not None else None,
            knee_qps=self.capacity_knee_qps,
            slo=slo,
            sweep_id=self.capacity_sweep_id,
            step_delta=delta("step"),
            cumulative_delta=delta("cumulative"),
            significant=self.capacity_significant,
            cumulative_significant=self.capacity_cumulative_significant,
            verdict=self.capacity_verdict,
            loop=self.capacity_loop,
            reason=self.capacity_reason,
        )


class TableRow(_Figures):
    """One step of the chain: what it is, its run's figures, its change against its parent
    (`*_step_*`) and the baseline (`*_cumulative_*`) with their intervals, its verdict; its
    stages' P50s by stage name; its capacity in a table that judges capacity."""

    experiment: str
    variable: str | None = None
    change: str | None = None
    hypothesis: str | None = None
    knob_sweep: int | None = None  # the `optlab sweep-knob` whose runs stand for the step
    run_id: int | None = None
    runs: int = 0
    status: str | None = None
    valid: bool | None = None
    provisional: bool | None = None
    missing: str | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    p999_ms: float | None = None
    qps: float | None = None
    error_rate: float | None = None
    cpu_pct: float | None = None
    service_cpu_pct: float | None = None
    gpu_util_pct: float | None = None
    gpu_mem_peak_mib: float | None = None
    accuracy_top1: float | None = None
    infer_ms_per_request: float | None = None
    mean_batch_size: float | None = None
    cache_hit_rate: float | None = None
    qps_step_pct: float | None = None
    qps_step_low_pct: float | None = None
    qps_step_high_pct: float | None = None
    qps_cumulative_pct: float | None = None
    p50_step_pct: float | None = None
    p50_step_low_pct: float | None = None
    p50_step_high_pct: float | None = None
    p50_cumulative_pct: float | None = None
    p99_step_pct: float | None = None
    p99_step_low_pct: float | None = None
    p99_step_high_pct: float | None = None
    p99_cumulative_pct: float | None = None
    significant: bool | None = None
    verdict: str | None = None
    decided_by: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()
    slo_pass: bool | None = None
    slo_failures: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    git_commit: str | None = None
    started_at: str | None = None
    who: str | None = None
    qps_cumulative_low_pct: float | None = None
    qps_cumulative_high_pct: float | None = None
    p50_cumulative_low_pct: float | None = None
    p50_cumulative_high_pct: float | None = None
    p99_cumulative_low_pct: float | None = None
    p99_cumulative_high_pct: float | None = None
    step_confidence: float | None = None
    cumulative_confidence: float | None = None
    step_method: str | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    output_tps: float | None = None
    goodput: float | None = None
    goodput_low: float | None = None
    goodput_high: float | None = None
    stages: dict[str, float | None] = {}
    capacity: StepCapacityRow | None = None
    llm_deltas: dict[str, float | None] = {}  # LLM_DELTA_COLUMNS that hold a value

    @classmethod
    def from_cells(cls, cells: dict[str, Any]) -> TableRow:
        """A row from its cells by column name (`COLUMNS`, `<stage>_p50_ms`, and the
        capacity columns when any is there)."""
        fields: dict[str, Any] = {}
        stages: dict[str, Any] = {}
        capacity: dict[str, Any] = {}
        llm: dict[str, Any] = {}
        for column, value in cells.items():
            if (stage := stage_of(column)) is not None:
                stages[stage] = _finite(value)
            elif column in CAPACITY_COLUMNS:
                capacity[column] = value
            elif column in LLM_DELTA_COLUMNS:
                if value is not None:
                    llm[column] = _finite(value)
            else:
                fields[column] = value
        return cls(
            **fields,
            stages=stages,
            capacity=StepCapacityRow(**capacity) if capacity else None,
            llm_deltas=llm,
        )

    @property
    def measured(self) -> bool:
        """Whether a run stands for the step."""
        return self.run_id is not None

    def get(self, column: str, default: Any = None) -> Any:
        """The cell of `column` (`COLUMNS`, `<stage>_p50_ms`, a capacity column), lists as
        lists; `default` for a column the row lacks or holds no value in."""
        value: Any = None
        if (stage := stage_of(column)) is not None:
            value = self.stages.get(stage)
        elif column in CAPACITY_COLUMNS:
            value = getattr(self.capacity, column) if self.capacity is not None else None
        elif column in LLM_DELTA_COLUMNS:
            value = self.llm_deltas.get(column)
        elif column in type(self).model_fields and column not in (
            "stages",
            "capacity",
            "llm_deltas",
        ):
            value = getattr(self, column)
            if column in _LISTS:
                value = list(value)
        return default if value is None else value

    def __getitem__(self, column: str) -> Any:
        return self.get(column)

    def __contains__(self, column: object) -> bool:
        return isinstance(column, str) and (
            column in COLUMNS
            or column in LLM_DELTA_COLUMNS
            or (stage_of(column) or "") in self.stages
            or (column in CAPACITY_COLUMNS and self.capacity is not None)
        )

    def cells(self, stages: Sequence[str], capacity: bool, llm: bool = False) -> dict[str, Any]:
        """The row's cells in the table's column order: `COLUMNS`, then `stages`' columns,
        then the capacity columns when `capacity`, then the LLM deltas' when `llm`."""
        out = {column: self.get(column) for column in COLUMNS}
        for column in _LISTS:
            out[column] = list(getattr(self, column))
        out |= {stage_column(stage): self.stages.get(stage) for stage in stages}
        if capacity:
            out |= {column: self.get(column) for column in CAPACITY_COLUMNS}
        if llm:
            out |= {column: self.llm_deltas.get(column) for column in LLM_DELTA_COLUMNS}
        return out

    def _llm_delta(self, kind: str) -> LlmDelta:
        return LlmDelta(
            **{
                f"{metric}_{part}": self.llm_deltas.get(f"{metric}_{kind}_{part}")
                for metric in LLM_DELTA_METRICS
                for part in LLM_DELTA_PARTS
            }
        )

    def _delta(self, kind: str) -> Delta:
        return Delta(
            **{
                f"{metric}_{part}": getattr(self, f"{metric}_{kind}_{part}")
                for metric in ("qps", "p50", "p99")
                for part in ("pct", "low_pct", "high_pct")
            }
        )

    def document(self, stages: Sequence[str], slo: Slo | None, llm: bool = False) -> ChainEntry:
        """The JSON's entry of the step (`reports.table_json.ChainEntry`); `llm`: the table
        has a streaming step, so every entry carries its LLM deltas."""
        derived = ("step_delta", "cumulative_delta", "capacity", "llm_step_delta")
        plain = {
            key: getattr(self, key)
            for key in ChainEntry.model_fields
            if key not in (*derived, "llm_cumulative_delta")
        }
        return ChainEntry(
            **plain,
            step_delta=self._delta("step"),
            cumulative_delta=self._delta("cumulative"),
            llm_step_delta=self._llm_delta("step") if llm else None,
            llm_cumulative_delta=self._llm_delta("cumulative") if llm else None,
            capacity=(
                (self.capacity or StepCapacityRow()).document(slo) if slo is not None else None
            ),
            **{stage_column(stage): self.stages.get(stage) for stage in stages},
        )


class CapacitySlo(_Frozen):
    """The SLO a table judges capacity by, and what the chosen sweeps share."""

    slo: Slo
    protocol_label: str | None = None  # the sweeps' base protocol, which may differ from the runs'
    loop: Literal["open", "closed"] | None = None  # the sweeps' loop

    @property
    def label(self) -> str:
        """`P99 ≤ 60 ms, open loop`: the SLO and the loop of the sweeps that found the
        capacities (an open loop's is a rate it sustains, a closed loop's the throughput of N
        clients)."""
        return f"{self.slo.label}, {self.loop} loop" if self.loop else self.slo.label

    def as_dict(self) -> dict[str, Any]:
        """The frame's `capacity_slo` header entry, as notebooks read it (`to_frame`)."""
        return {
            "percentile": self.slo.percentile,
            "ms": self.slo.ms,
            "label": self.slo.label,
            "key": self.slo.key,
            "protocol_label": self.protocol_label,
            "loop": self.loop,
        }


class TableHeader(_Frozen):
    """What every row was measured under: the chain's head, the protocol and environment of
    its reference run, the confidence of a one-run-a-side interval, the stages the rows
    recorded (in the table's order), and the SLO capacity is judged by, if any."""

    schema_version: Literal[1] = TABLE_SCHEMA_VERSION
    head: str
    protocol: dict[str, Any] | None = None  # as stored (key order kept: the JSON writes it)
    protocol_label: str
    environment: EnvironmentInfo
    confidence: float
    stages: tuple[str, ...] = ()
    capacity: CapacitySlo | None = None

    @property
    def provisional(self) -> bool:
        """Whether the reference run's protocol is a provisional (short) one."""
        return bool((self.protocol or {}).get("provisional"))


class StackedTable(_Frozen):
    """The stacked-gains table: header and rows, baseline first."""

    header: TableHeader
    rows: tuple[TableRow, ...]

    @property
    def has_capacity(self) -> bool:
        """Whether the table judges capacity (it has an SLO to judge it by)."""
        return self.header.capacity is not None

    def stage_columns(self, *, with_values: bool = False) -> list[str]:
        """The `<stage>_p50_ms` columns in the table's order; with `with_values`, only those
        that hold a value in some row."""
        stages = self.header.stages
        if with_values:
            stages = tuple(s for s in stages if any(r.stages.get(s) is not None for r in self.rows))
        return [stage_column(stage) for stage in stages]

    @property
    def has_llm(self) -> bool:
        """Whether a step was measured on a streaming LLM target."""
        return self.any_value("ttft_p50_ms") or self.any_value("output_tps")

    def columns(self) -> list[str]:
        """Every column, in order: `COLUMNS`, the stages', the capacity ones if judged, the
        LLM deltas' in a table with a streaming step."""
        stages = [stage_column(stage) for stage in self.header.stages]
        return [
            *COLUMNS,
            *stages,
            *(CAPACITY_COLUMNS if self.has_capacity else ()),
            *(LLM_DELTA_COLUMNS if self.has_llm else ()),
        ]

    def any_value(self, column: str) -> bool:
        """Whether some row holds a value (not None, not an empty list) in `column`."""
        return any(row.get(column) not in (None, [], "") for row in self.rows)

    def cells(self) -> list[dict[str, Any]]:
        """Each row's cells by column name, in `columns()` order."""
        llm = self.has_llm
        return [row.cells(self.header.stages, self.has_capacity, llm) for row in self.rows]

    def to_document(self) -> TableDocument:
        """`optlab table --format json` (docs/table-json.md)."""
        header = self.header
        slo = header.capacity.slo if header.capacity is not None else None
        return TableDocument(
            schema_version=header.schema_version,
            head=header.head,
            protocol=header.protocol,  # validated as ProtocolInfo, written as stored
            protocol_label=header.protocol_label,
            environment=header.environment,
            confidence=header.confidence,
            chain=[row.document(header.stages, slo, self.has_llm) for row in self.rows],
        )

    def to_frame(self) -> pd.DataFrame:
        """The table as a pandas DataFrame (one row per step, `columns()`), its header in
        `attrs` as notebooks read it: for `optlab.api.chain_table` and the CSV only."""
        import pandas as pd  # lazy: slow to import, and only the edge needs it

        frame = pd.DataFrame(self.cells(), columns=self.columns())
        header = self.header
        environment = header.environment.model_dump(exclude_none=False)
        if environment.get("service") is None:
            environment.pop("service", None)
        frame.attrs.update(
            {
                "schema_version": header.schema_version,
                "head": header.head,
                "protocol": header.protocol,
                "protocol_label": header.protocol_label,
                "environment": environment,
                "confidence": header.confidence,
            }
        )
        if header.capacity is not None:
            frame.attrs["capacity_slo"] = header.capacity.as_dict()
        return frame
