"""Sweeps: `optlab sweep`'s record (experiment, stored config, SLO, strategy, result, status)
and its levels, each a run of its own.

New tables only; `runs` is not touched (on SQLite a rebuild of `runs` would delete every
measurement through ON DELETE CASCADE). A run is a sweep level when a `sweep_levels` row
names it; readers of ordinary runs leave those out.

Revision ID: 0007_sweeps
Revises: 0006_versioned_summary
Create Date: 2026-11-30
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_sweeps"
down_revision: str | Sequence[str] | None = "0006_versioned_summary"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES = "status IN ('RUNNING', 'FINISHED', 'FAILED', 'KILLED', 'CRASHED')"
_MODES = "mode IN ('open', 'closed')"


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("uid", sa.String(length=32), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("config_id", sa.Integer(), nullable=False),
        sa.Column("environment_id", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("slo_percentile", sa.String(length=16), nullable=False),
        sa.Column("slo_ms", sa.Double(), nullable=False),
        sa.Column("protocol_json", sa.Text(), nullable=False),
        sa.Column("strategy_json", sa.Text(), nullable=False),
        sa.Column("code_identity_json", sa.Text(), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("capacity_qps", sa.Double(), nullable=True),
        sa.Column("result_json", sa.Text(), nullable=True),
        sa.Column("measured_s", sa.Double(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.CheckConstraint(_STATUSES, name=op.f("ck_sweeps_status")),
        sa.CheckConstraint(_MODES, name=op.f("ck_sweeps_mode")),
        sa.ForeignKeyConstraint(
            ["experiment_id"], ["experiments.id"], name=op.f("fk_sweeps_experiment_id_experiments")
        ),
        sa.ForeignKeyConstraint(
            ["config_id"],
            ["experiment_configs.id"],
            name=op.f("fk_sweeps_config_id_experiment_configs"),
        ),
        sa.ForeignKeyConstraint(
            ["environment_id"],
            ["environments.id"],
            name=op.f("fk_sweeps_environment_id_environments"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
        sa.UniqueConstraint("uid", name=op.f("uq_sweeps_uid")),
    )
    op.create_index(op.f("ix_sweeps_experiment_id_status"), "sweeps", ["experiment_id", "status"])
    op.create_table(
        "sweep_levels",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sweep_id", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("load", sa.Double(), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("reused", sa.Boolean(), nullable=False),
        sa.CheckConstraint(_MODES, name=op.f("ck_sweep_levels_mode")),
        sa.ForeignKeyConstraint(
            ["sweep_id"],
            ["sweeps.id"],
            name=op.f("fk_sweep_levels_sweep_id_sweeps"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"], ["runs.id"], name=op.f("fk_sweep_levels_run_id_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweep_levels")),
        sa.UniqueConstraint("sweep_id", "position", name=op.f("uq_sweep_levels_sweep_id_position")),
    )
    op.create_index(op.f("ix_sweep_levels_run_id"), "sweep_levels", ["run_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_sweep_levels_run_id"), table_name="sweep_levels")
    op.drop_table("sweep_levels")
    op.drop_index(op.f("ix_sweeps_experiment_id_status"), table_name="sweeps")
    op.drop_table("sweeps")
