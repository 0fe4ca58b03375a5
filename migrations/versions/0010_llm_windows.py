"""A streaming LLM target's per-second figures.

`run_windows` gains `ttft_p50_ms`, `ttft_p99_ms`, `tpot_p50_ms`, `tpot_p99_ms` and
`output_tps` (nullable doubles) over the streams that ended in each second: the stacked table's
intervals on TTFT, TPOT and output tokens/s are built from them, as those on P50 and P99 are
from `p50_ms` and `p99_ms`. NULL for every window before, and for a second where no stream
ended. Added in place (no table rebuild).

Revision ID: 0010_llm_windows
Revises: 0009_sweep_slo_json
Create Date: 2026-12-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_llm_windows"
down_revision: str | Sequence[str] | None = "0009_sweep_slo_json"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "output_tps")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column("run_windows", sa.Column(name, sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("run_windows") as batch:
        for name in reversed(COLUMNS):
            batch.drop_column(name)
