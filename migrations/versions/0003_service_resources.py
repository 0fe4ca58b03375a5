"""Resource samples of a service optlab started: its process tree's CPU and memory.

Revision ID: 0003_service_resources
Revises: 0002_measurements
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_service_resources"
down_revision: str | Sequence[str] | None = "0002_measurements"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("resource_samples") as batch:
        batch.add_column(sa.Column("service_cpu_pct", sa.Double(), nullable=True))
        batch.add_column(sa.Column("service_rss_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("resource_samples") as batch:
        batch.drop_column("service_rss_bytes")
        batch.drop_column("service_cpu_pct")
