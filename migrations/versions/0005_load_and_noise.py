"""Per-second load (requests offered, in flight) and the machine taken away (CPU steal, CPU
of processes outside the run), so a verdict can tell a saturated target from a load
generator that fell behind, and an unstable run from a noisy neighbour.

Revision ID: 0005_load_and_noise
Revises: 0004_run_uid
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_load_and_noise"
down_revision: str | Sequence[str] | None = "0004_run_uid"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ADD COLUMN (nullable, no default): no table rebuild, on SQLite too.
    op.add_column("run_windows", sa.Column("offered", sa.BigInteger(), nullable=True))
    op.add_column("run_windows", sa.Column("in_flight", sa.BigInteger(), nullable=True))
    op.add_column("resource_samples", sa.Column("steal_pct", sa.Double(), nullable=True))
    op.add_column("resource_samples", sa.Column("other_cpu_pct", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("resource_samples") as batch:
        batch.drop_column("other_cpu_pct")
        batch.drop_column("steal_pct")
    with op.batch_alter_table("run_windows") as batch:
        batch.drop_column("in_flight")
        batch.drop_column("offered")
