"""A stable identity for every run across databases: runs.uid, backfilled for existing runs.

Revision ID: 0004_run_uid
Revises: 0003_service_resources
Create Date: 2026-12-01
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_run_uid"
down_revision: str | Sequence[str] | None = "0003_service_resources"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "ix_runs_uid"


def upgrade() -> None:
    # recreate="never": on SQLite, rebuilding `runs` means DROP TABLE runs, and with foreign
    # keys on (optlab's engines switch them on, and the pragma cannot change inside the
    # migration's transaction) that DROP deletes every measurement through ON DELETE
    # CASCADE. So the column is added in place (nullable: SQLite adds a NOT NULL column only
    # with a constant default) and uniqueness is a unique index, which needs no rebuild.
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.add_column(sa.Column("uid", sa.String(length=32), nullable=True))
    runs = sa.table("runs", sa.column("id", sa.Integer), sa.column("uid", sa.String))
    connection = op.get_bind()
    ids = connection.execute(sa.select(runs.c.id).where(runs.c.uid.is_(None))).scalars().all()
    if ids:
        connection.execute(
            sa.update(runs).where(runs.c.id == sa.bindparam("run_id")),
            [{"run_id": run_id, "uid": uuid.uuid4().hex} for run_id in ids],
        )
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.create_index(_INDEX, ["uid"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("runs", recreate="never") as batch:
        batch.drop_index(_INDEX)
        batch.drop_column("uid")
