"""The stacked table's columns, in order (docs/table-json.md): the headline and target figures
(`COLUMNS`), a streaming target's (`LLM_COLUMNS`, and the judged changes of some of them,
`LLM_DELTA_COLUMNS`), a step's capacity (`CAPACITY_COLUMNS`) and the stage columns named by
`stage_column`. `optlab.reports.stacked` builds its rows on them.
"""

from __future__ import annotations

__all__ = [
    "CAPACITY_COLUMNS",
    "COLUMNS",
    "LLM_COLUMNS",
    "LLM_DELTA_COLUMNS",
    "LLM_DELTA_METRICS",
    "LLM_DELTA_PARTS",
    "stage_column",
    "stage_of",
]

# A streaming LLM target's figures (its run's `llm` section, docs/run-json.md), (column,
# header): shown where a step has them, after the target's other figures.
LLM_COLUMNS = (
    ("ttft_p50_ms", "TTFT P50"),
    ("ttft_p99_ms", "TTFT P99"),
    ("tpot_p50_ms", "TPOT P50"),
    ("tpot_p99_ms", "TPOT P99"),
    ("itl_p99_ms", "ITL P99"),
    ("output_tps", "tok/s"),
    ("goodput", "goodput"),
)
# Those of them judged like the headline metrics, from the runs' windows: each one's change
# against the previous step and the baseline, with its interval (`<metric>_step_pct`,
# `_step_low_pct`, `_step_high_pct`, `_cumulative_...`), in a table with a streaming step.
LLM_DELTA_METRICS = ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "output_tps")
LLM_DELTA_PARTS = ("pct", "low_pct", "high_pct")
LLM_DELTA_COLUMNS = tuple(
    f"{metric}_{kind}_{part}"
    for kind in ("step", "cumulative")
    for metric in LLM_DELTA_METRICS
    for part in LLM_DELTA_PARTS
)

# The table's columns in order (docs/table-json.md); the stage columns follow them, then, in a
# table that judges capacity, `CAPACITY_COLUMNS`.
COLUMNS = (
    "experiment", "variable", "change", "hypothesis", "run_id", "runs", "status", "valid",
    "provisional", "missing", "p50_ms", "p95_ms", "p99_ms", "p999_ms", "qps", "error_rate",
    "cpu_pct", "service_cpu_pct", "gpu_util_pct", "gpu_mem_peak_mib", "accuracy_top1",
    "infer_ms_per_request",
    "mean_batch_size", "cache_hit_rate", "qps_step_pct", "qps_step_low_pct",
    "qps_step_high_pct", "qps_cumulative_pct", "p50_step_pct", "p50_step_low_pct",
    "p50_step_high_pct", "p50_cumulative_pct", "p99_step_pct", "p99_step_low_pct",
    "p99_step_high_pct", "p99_cumulative_pct", "significant", "verdict", "decided_by", "flags",
    "slo_pass", "slo_failures", "reasons", "git_commit", "started_at", "who",
    "qps_cumulative_low_pct", "qps_cumulative_high_pct", "p50_cumulative_low_pct",
    "p50_cumulative_high_pct", "p99_cumulative_low_pct", "p99_cumulative_high_pct",
    "step_confidence", "cumulative_confidence", "step_method",
    *(column for column, _ in LLM_COLUMNS), "goodput_low", "goodput_high", "knob_sweep",
)  # fmt: skip

# A step's capacity columns (`reports.capacity`), after the stage columns.
CAPACITY_COLUMNS = (
    "capacity_qps", "capacity_low_qps", "capacity_high_qps", "capacity_knee_qps",
    "capacity_sweep_id", "capacity_step_pct", "capacity_step_low_pct", "capacity_step_high_pct",
    "capacity_cumulative_pct", "capacity_cumulative_low_pct", "capacity_cumulative_high_pct",
    "capacity_significant", "capacity_cumulative_significant", "capacity_reason",
    "capacity_verdict", "capacity_loop",
)  # fmt: skip

_STAGE_SUFFIX = "_p50_ms"


def stage_column(stage: str) -> str:
    """`infer` -> `infer_p50_ms`: a stage's column."""
    return f"{stage}{_STAGE_SUFFIX}"


def stage_of(column: str) -> str | None:
    """`infer_p50_ms` -> `infer`; None for a column that is no stage's."""
    if column.endswith(_STAGE_SUFFIX) and column not in COLUMNS:
        return column.removesuffix(_STAGE_SUFFIX)
    return None
