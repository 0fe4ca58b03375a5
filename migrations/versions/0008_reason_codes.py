"""Reason codes beside the reason texts; a sweep's capacity stored once.

- `runs.reason_codes_json`: each INVALID reason's code (`optlab.store.reasons`), in the order
  of `runs.reasons_json`, so the sweep and diagnose decide by code, never by the wording. The
  texts stay as they are. Runs stored before are given codes from their texts here, once,
  by the prefixes the validity rules wrote when this was written (a text none of them
  starts is `other`).
- `sweeps.capacity_qps` is dropped: the capacity is in `sweeps.result_json`, and two copies
  could disagree. The downgrade puts it back from there.

Neither table is rebuilt: a rebuild on SQLite drops the old table, and with foreign keys on
that deletes every measurement (and every sweep level) through ON DELETE CASCADE. Columns are
added and dropped in place (`ALTER TABLE ... DROP COLUMN`, SQLite 3.35 and later). This file
does its own JSON and prefix matching rather than import optlab's: a migration must keep
doing what it did when it was written.

Revision ID: 0008_reason_codes
Revises: 0007_sweeps
Create Date: 2026-12-02
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0008_reason_codes"
down_revision: str | Sequence[str] | None = "0007_sweeps"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BATCH = 500
# How each reason text began when this was written, and its code; the first match wins.
PREFIXES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), code)
    for pattern, code in (
        (r"^interrupted after ", "interrupted"),
        (r"^stopped after ", "stopped-early"),
        (r"^measured [0-9.]+ s, shorter than ", "short"),
        (r"^\d+ successful queries: ", "few-queries"),
        (r"^error rate ", "errors"),
        (r"^the target is saturated", "saturated"),
        (r"^the load generator fell behind its schedule", "generator-behind"),
        (r"^the load generator fell behind: ", "clients-held-up"),
        (r"^unstable: ", "unstable"),
        (r"^\d+ of \d+ clients were stuck in a call", "stuck-clients"),
        (r"^thermal throttling ", "throttled"),
        (r"^accuracy: ", "accuracy"),
        (r"^the run failed: ", "failed"),
    )
)

runs = sa.table(
    "runs",
    sa.column("id", sa.Integer),
    sa.column("reasons_json", sa.Text),
    sa.column("reason_codes_json", sa.Text),
)
sweeps = sa.table(
    "sweeps",
    sa.column("id", sa.Integer),
    sa.column("result_json", sa.Text),
    sa.column("capacity_qps", sa.Double),
)


def code_of(text: Any) -> str:
    if isinstance(text, str):
        for pattern, code in PREFIXES:
            if pattern.match(text):
                return code
    return "other"


def _dump(codes: list[str]) -> str:
    return json.dumps(codes, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _backfill_codes(connection: sa.Connection) -> None:
    query = sa.select(runs.c.id).where(runs.c.reasons_json != "[]").order_by(runs.c.id)
    ids = list(connection.execute(query).scalars())
    update = sa.update(runs).where(runs.c.id == sa.bindparam("run_id"))
    for start in range(0, len(ids), BATCH):
        chunk = ids[start : start + BATCH]
        rows = connection.execute(
            sa.select(runs.c.id, runs.c.reasons_json).where(runs.c.id.in_(chunk))
        )
        updates = []
        for run_id, reasons_json in rows:
            reasons = json.loads(reasons_json) if reasons_json else []
            codes = [code_of(text) for text in reasons] if isinstance(reasons, list) else []
            updates.append({"run_id": run_id, "reason_codes_json": _dump(codes)})
        if updates:
            connection.execute(update, updates)


def upgrade() -> None:
    op.add_column(
        "runs",
        sa.Column("reason_codes_json", sa.Text(), nullable=False, server_default="[]"),
    )
    _backfill_codes(op.get_bind())
    op.drop_column("sweeps", "capacity_qps")


def downgrade() -> None:
    op.add_column("sweeps", sa.Column("capacity_qps", sa.Double(), nullable=True))
    connection = op.get_bind()
    query = sa.select(sweeps.c.id, sweeps.c.result_json).where(sweeps.c.result_json.is_not(None))
    updates = []
    for sweep_id, result_json in connection.execute(query):
        result = json.loads(result_json)
        capacity = result.get("capacity_qps") if isinstance(result, dict) else None
        if capacity is not None:
            updates.append({"sweep_id": sweep_id, "capacity_qps": float(capacity)})
    if updates:
        update = sa.update(sweeps).where(sweeps.c.id == sa.bindparam("sweep_id"))
        connection.execute(update, updates)
    op.drop_column("runs", "reason_codes_json")
