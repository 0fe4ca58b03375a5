"""The stacked-gains table as CSV and as JSON (docs/table-json.md), for scripts and CI; and
the reports' shared cell helpers (`plain`, `present`).

Both renderers take the `reports.stacked.StackedTable` of `reports.table.stacked_table` and
nothing else: every number was computed there. The JSON is its `to_document()`; the CSV is
written by pandas from its `to_frame()`, as it always was.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from optlab.reports.stacked import StackedTable


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


def render_csv(table: StackedTable) -> str:
    """One row per step, every column (`StackedTable.columns()`); list cells joined by "; ",
    missing values empty. Written by pandas from `to_frame()`, as it always was."""
    out = table.to_frame()
    for column in out.columns:
        if out[column].map(lambda v: isinstance(v, (list, tuple))).any():
            out[column] = out[column].map(
                lambda v: "; ".join(str(x) for x in v) if isinstance(v, (list, tuple)) else v
            )
    text: str = out.to_csv(index=False, lineterminator="\n")
    return text


def document(table: StackedTable) -> dict[str, Any]:
    """The JSON document as a dict: the dump of `StackedTable.to_document()`, the
    `reports.table_json` models (docs/schemas/table.schema.json is generated from them)."""
    dumped: dict[str, Any] = table.to_document().model_dump(mode="json")
    return dumped


def render_json(table: StackedTable) -> str:
    """docs/table-json.md: `{"schema_version", "protocol", "environment", "chain": [...]}`;
    a missing figure is null, keys keep a stable order."""
    return json.dumps(document(table), indent=2, allow_nan=False, ensure_ascii=False) + "\n"
