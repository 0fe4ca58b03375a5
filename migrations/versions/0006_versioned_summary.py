"""Run summaries versioned (schema_version 2), each figure stored once.

Until now `runs.summary_json` held a copy of what other places already hold, and readers
trusted whichever copy they happened to read. The canonical copy is the one a query can use:

- the run's id, experiment, status, validity, provisional flag, reasons, protocol, request and
  error counts, QPS and phase lengths are `runs` columns (indexed and filtered on; the
  summary's phase lengths were those columns rounded to 1 ms, and its run_id was the id in
  the database it was first stored in, wrong after an import);
- the latency of every series over the measured phase is that series' `stage_stats` row,
  which also holds what the summary never did (p90, min, stddev, the histogram) and the
  warmup; the summary keeps only which rows are `latency_ms` and which `harness_ms`, in order;
- the errors by type are the `run_errors` rows.

What stays in the JSON exists nowhere else: notes, load mode, the resource means and peaks,
who ran it, what the target reported (accuracy, its metrics, the service), the paired tag and
the step against the parent as judged then. A summary whose latency or errors the rows do
not reproduce (a run stored before they were written in one transaction) keeps them in the
JSON instead, so no number is lost.

Data only, in place: `runs` is never rebuilt (on SQLite, with foreign keys on, a rebuild
drops the table and deletes every measurement through ON DELETE CASCADE). The downgrade
puts every copy back. This file does its own JSON and escaping rather than import optlab's:
a migration must keep doing what it did when it was written.

Revision ID: 0006_versioned_summary
Revises: 0005_load_and_noise
Create Date: 2026-12-01
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0006_versioned_summary"
down_revision: str | Sequence[str] | None = "0005_load_and_noise"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VERSION = 2
BATCH = 500
STATS = ("p50", "p95", "p99", "p999", "max", "mean")
# Summary key -> runs column, for the copies the columns now hold alone.
FACTS = {
    "status": "status",
    "valid": "valid",
    "provisional": "provisional",
    "reasons": "reasons_json",
    "protocol": "protocol_name",
    "requests": "requests",
    "errors": "errors",
    "qps": "qps",
}
ROUNDED = {"warmup_s": "warmup_s", "duration_s": "duration_s"}
SERIES = (("latency_ms", "latency_stages"), ("harness_ms", "harness_stages"))

runs = sa.table(
    "runs",
    sa.column("id", sa.Integer),
    sa.column("experiment_id", sa.Integer),
    sa.column("summary_json", sa.Text),
    *(sa.column(name) for name in (*FACTS.values(), *ROUNDED.values())),
)
experiments = sa.table("experiments", sa.column("id", sa.Integer), sa.column("name", sa.Text))
stage_stats = sa.table(
    "stage_stats",
    sa.column("run_id", sa.Integer),
    sa.column("stage", sa.Text),
    sa.column("phase", sa.Text),
    sa.column("count", sa.BigInteger),
    *(sa.column(f"{stat}_ms", sa.Double) for stat in STATS),
)
run_errors = sa.table(
    "run_errors",
    sa.column("run_id", sa.Integer),
    sa.column("error_type", sa.Text),
    sa.column("count", sa.BigInteger),
)

# What the JSON column's type did to text when this was written: C0 controls other than
# tab/newline/CR, and lone surrogates, spelled as Python escapes.
_UNSTORABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _dump(value: dict[str, Any]) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return _UNSTORABLE.sub(_escape, text)


def _chunks(connection: sa.Connection) -> Iterator[list[int]]:
    query = sa.select(runs.c.id).where(runs.c.summary_json.is_not(None)).order_by(runs.c.id)
    ids = list(connection.execute(query).scalars())
    for start in range(0, len(ids), BATCH):
        yield ids[start : start + BATCH]


def _series(connection: sa.Connection, ids: list[int]) -> dict[int, dict[str, dict[str, Any]]]:
    found: dict[int, dict[str, dict[str, Any]]] = {run_id: {} for run_id in ids}
    columns = [stage_stats.c[f"{stat}_ms"] for stat in STATS]
    query = sa.select(stage_stats.c.run_id, stage_stats.c.stage, stage_stats.c["count"], *columns)
    query = query.where(stage_stats.c.run_id.in_(ids), stage_stats.c.phase == "measure")
    for run_id, stage, count, *values in connection.execute(query):
        found[run_id][stage] = {**dict(zip(STATS, values, strict=True)), "count": count}
    return found


def _errors(connection: sa.Connection, ids: list[int]) -> dict[int, dict[str, int]]:
    found: dict[int, dict[str, int]] = {run_id: {} for run_id in ids}
    query = sa.select(run_errors.c.run_id, run_errors.c.error_type, run_errors.c["count"])
    for run_id, error_type, count in connection.execute(query.where(run_errors.c.run_id.in_(ids))):
        found[run_id][error_type] = count
    return found


def _rewrite(convert: Callable[[dict[str, Any], Any, dict[str, Any], dict[str, int]], Any]) -> None:
    """Apply `convert(summary, run row, series, errors)` to every stored summary, in batches;
    it returns the new summary, or None to leave one as it is."""
    connection = op.get_bind()
    for ids in _chunks(connection):
        series, errors = _series(connection, ids), _errors(connection, ids)
        query = (
            sa.select(runs, experiments.c.name.label("experiment"))
            .join(experiments, experiments.c.id == runs.c.experiment_id)
            .where(runs.c.id.in_(ids))
        )
        updates = []
        for row in connection.execute(query):
            new = convert(json.loads(row.summary_json), row, series[row.id], errors[row.id])
            if new is not None:
                updates.append({"run_id": row.id, "summary_json": _dump(new)})
        if updates:
            connection.execute(sa.update(runs).where(runs.c.id == sa.bindparam("run_id")), updates)


def _to_v2(
    old: dict[str, Any], row: Any, series: dict[str, dict[str, Any]], errors: dict[str, int]
) -> dict[str, Any] | None:
    if not isinstance(old, dict) or "schema_version" in old:
        return None
    dropped = {"run_id", "experiment", *FACTS, *ROUNDED}
    new = {key: value for key, value in old.items() if key not in dropped}
    latency, harness = old.get("latency_ms") or {}, old.get("harness_ms") or {}
    if {**latency, **harness} == series and not latency.keys() & harness.keys():
        for field, names in SERIES:
            new[names] = list(new.pop(field, None) or {})
    if (old.get("errors_by_type") or {}) == errors:
        new.pop("errors_by_type", None)
    new["schema_version"] = VERSION
    return new


def _to_v1(
    new: dict[str, Any], row: Any, series: dict[str, dict[str, Any]], errors: dict[str, int]
) -> dict[str, Any] | None:
    if not isinstance(new, dict) or new.get("schema_version") != VERSION:
        return None
    old = {key: value for key, value in new.items() if key != "schema_version"}
    for field, names in SERIES:
        if names in old:
            old[field] = {name: series[name] for name in old.pop(names) if name in series}
    old.setdefault("errors_by_type", errors)
    old["run_id"], old["experiment"] = row.id, row.experiment
    for key, column in FACTS.items():
        old[key] = row._mapping[column]
    for key, column in ROUNDED.items():
        seconds = row._mapping[column]
        old[key] = None if seconds is None else round(seconds, 3)
    old["valid"] = None if old["valid"] is None else bool(old["valid"])
    old["provisional"] = bool(old["provisional"])
    old["reasons"] = json.loads(old["reasons"])
    return old


def upgrade() -> None:
    _rewrite(_to_v2)


def downgrade() -> None:
    _rewrite(_to_v1)
