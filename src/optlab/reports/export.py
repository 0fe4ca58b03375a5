"""The stacked-gains table as CSV and as JSON (docs/table-json.md), for scripts and CI.

Both take the DataFrame of `reports.table.stacked_table` and nothing else: every number was
computed there. A column the frame lacks is simply absent (CSV) or null (JSON's fixed keys).
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

TABLE_SCHEMA_VERSION = 1

# Metric name in the JSON `*_delta` objects -> its column prefix in the frame.
_DELTA_METRICS = (("qps", "qps"), ("p50", "p50"), ("p99", "p99"))
_LEADING = ("experiment", "variable", "change", "p50_ms", "p95_ms", "p99_ms", "qps")
_TRAILING = ("significant", "verdict", "decided_by")


def plain(value: Any) -> Any:
    """A JSON-ready Python value: numpy scalars unwrapped, NaN/NaT/pd.NA -> None, containers
    converted element by element."""
    if value is None:
        return None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        return plain(value.tolist())  # numpy scalar or array
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, (bool, int, str)):
        return value
    if hasattr(value, "isoformat"):
        return str(value.isoformat())
    try:
        import pandas as pd  # lazy: `import optlab.cli.main` loads this module

        if pd.isna(value):
            return None
    except (TypeError, ValueError):
        pass
    return str(value)


def present(value: Any) -> bool:
    """True for a value worth showing (not None, NaN or an empty list)."""
    value = plain(value)
    return value is not None and value != [] and value != ""


def as_list(value: Any) -> list[str]:
    """A list column's cell as a list of strings; a "; "-joined string is split back."""
    value = plain(value)
    if value is None or value == "":
        return []
    if isinstance(value, list):
        return [str(v) for v in value if v is not None and str(v) != ""]
    return [part for part in str(value).split("; ") if part]


def records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The frame's rows as plain dicts (column order kept)."""
    columns = list(frame.columns)
    return [
        {column: plain(value) for column, value in zip(columns, row, strict=True)}
        for row in frame.itertuples(index=False, name=None)
    ]


def render_csv(frame: pd.DataFrame) -> str:
    """One row per step, every column; list cells joined by "; ", missing values empty."""
    out = frame.copy()
    for column in out.columns:
        if out[column].map(lambda v: isinstance(v, (list, tuple))).any():
            out[column] = out[column].map(
                lambda v: "; ".join(str(x) for x in v) if isinstance(v, (list, tuple)) else v
            )
    text: str = out.to_csv(index=False, lineterminator="\n")
    return text


def _delta(row: dict[str, Any], kind: str) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    for name, prefix in _DELTA_METRICS:
        delta[f"{name}_pct"] = row.get(f"{prefix}_{kind}_pct")
        delta[f"{name}_low_pct"] = row.get(f"{prefix}_{kind}_low_pct")
        delta[f"{name}_high_pct"] = row.get(f"{prefix}_{kind}_high_pct")
    return delta


def _capacity(row: dict[str, Any], slo: dict[str, Any]) -> dict[str, Any]:
    """A step's `capacity` object: the capacity under the table's SLO, or why it has none."""

    def delta(kind: str) -> dict[str, Any]:
        return {
            "pct": row.get(f"capacity_{kind}_pct"),
            "low_pct": row.get(f"capacity_{kind}_low_pct"),
            "high_pct": row.get(f"capacity_{kind}_high_pct"),
        }

    low, high = row.get("capacity_low_qps"), row.get("capacity_high_qps")
    sweep_id = row.get("capacity_sweep_id")
    return {
        "qps": row.get("capacity_qps"),
        "interval": [low, high] if low is not None and high is not None else None,
        "knee_qps": row.get("capacity_knee_qps"),
        "slo": {"percentile": slo.get("percentile"), "ms": slo.get("ms")},
        "sweep_id": None if sweep_id is None else int(sweep_id),
        "step_delta": delta("step"),
        "cumulative_delta": delta("cumulative"),
        "significant": row.get("capacity_significant"),
        "cumulative_significant": row.get("capacity_cumulative_significant"),
        "verdict": row.get("capacity_verdict"),
        "loop": row.get("capacity_loop"),
        "reason": row.get("capacity_reason"),
    }


def chain_entries(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The `chain` list of the JSON document (docs/table-json.md): its headline keys first, then
    a `capacity` object where the table judges capacity, then every other column."""
    slo = frame.attrs.get("capacity_slo")
    with_capacity = bool(slo) and "capacity_qps" in frame.columns
    consumed = set(_LEADING) | set(_TRAILING)
    consumed |= {
        str(c)
        for c in frame.columns
        if str(c).startswith("capacity_") and not str(c).endswith("_p50_ms")  # not a stage's
    }
    for _, prefix in _DELTA_METRICS:
        consumed |= {
            f"{prefix}_{kind}_{part}"
            for kind in ("step", "cumulative")
            for part in ("pct", "low_pct", "high_pct")
        }
    entries = []
    for row in records(frame):
        entry: dict[str, Any] = {key: row.get(key) for key in _LEADING}
        entry["step_delta"] = _delta(row, "step")
        entry["cumulative_delta"] = _delta(row, "cumulative")
        for key in _TRAILING:
            entry[key] = row.get(key)
        if with_capacity:
            entry["capacity"] = _capacity(row, slo)
        for key, value in row.items():
            if key not in consumed:
                entry[key] = value
        entries.append(entry)
    return entries


def document(frame: pd.DataFrame) -> dict[str, Any]:
    """The JSON document as a dict (what `render_json` serialises); `reports.table_json`
    describes it, and docs/schemas/table.schema.json is generated from that."""
    attrs = frame.attrs
    return {
        "schema_version": plain(attrs.get("schema_version", TABLE_SCHEMA_VERSION)),
        "head": plain(attrs.get("head")),
        "protocol": plain(attrs.get("protocol")),
        "protocol_label": plain(attrs.get("protocol_label")),
        "environment": plain(attrs.get("environment")),
        "confidence": plain(attrs.get("confidence")),
        "chain": chain_entries(frame),
    }


def render_json(frame: pd.DataFrame) -> str:
    """docs/table-json.md: `{"schema_version", "protocol", "environment", "chain": [...]}`;
    NaN is null, keys keep a stable order."""
    return json.dumps(document(frame), indent=2, allow_nan=False, ensure_ascii=False) + "\n"
