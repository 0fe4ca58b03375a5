"""A sweep's whole SLO where it is more than one latency percentile.

`sweeps.slo_json` (nullable text): a streaming target's sweep judges its levels by bounds on
its token series (`--slo ttft_p99=500ms,tpot_p99=50ms`); the whole SLO is kept here, its first
bound still in `slo_percentile` and `slo_ms`. Null for every sweep before, which judged the
request latency alone. Added in place (no table rebuild: on SQLite that would cascade-delete
the levels).

Revision ID: 0009_sweep_slo_json
Revises: 0008_reason_codes
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_sweep_slo_json"
down_revision: str | Sequence[str] | None = "0008_reason_codes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sweeps", sa.Column("slo_json", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("sweeps", "slo_json")
