"""Knob sweeps: `optlab sweep-knob` records, and the runs (or capacity sweeps) of their cells.

Two new tables; nothing existing changes.

Revision ID: 0011_knob_sweeps
Revises: 0010_llm_windows
Create Date: 2026-12-03
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_knob_sweeps"
down_revision: str | Sequence[str] | None = "0010_llm_windows"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_STATUSES = "status IN ('RUNNING', 'FINISHED', 'FAILED', 'KILLED', 'CRASHED')"


def upgrade() -> None:
    op.create_table(
        "knob_sweeps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("uid", sa.String(length=32), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("config_id", sa.Integer(), nullable=False),
        sa.Column("knob", sa.String(length=255), nullable=False),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("spec_json", sa.Text(), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("result_json", sa.Text(), nullable=True),
        sa.Column("measured_s", sa.Double(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.CheckConstraint(_STATUSES, name=op.f("ck_knob_sweeps_status")),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_knob_sweeps_experiment_id_experiments"),
        ),
        sa.ForeignKeyConstraint(
            ["config_id"],
            ["experiment_configs.id"],
            name=op.f("fk_knob_sweeps_config_id_experiment_configs"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_knob_sweeps")),
        sa.UniqueConstraint("uid", name=op.f("uq_knob_sweeps_uid")),
    )
    op.create_index(
        op.f("ix_knob_sweeps_experiment_id_status"), "knob_sweeps", ["experiment_id", "status"]
    )
    op.create_table(
        "knob_sweep_cells",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("knob_sweep_id", sa.Integer(), nullable=False),
        sa.Column("block", sa.Integer(), nullable=False),
        sa.Column("arm", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("sweep_id", sa.Integer(), nullable=True),
        sa.Column("measured_s", sa.Double(), nullable=False),
        sa.ForeignKeyConstraint(
            ["knob_sweep_id"],
            ["knob_sweeps.id"],
            name=op.f("fk_knob_sweep_cells_knob_sweep_id_knob_sweeps"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_knob_sweep_cells_run_id_runs"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["sweep_id"],
            ["sweeps.id"],
            name=op.f("fk_knob_sweep_cells_sweep_id_sweeps"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_knob_sweep_cells")),
        sa.UniqueConstraint(
            "knob_sweep_id",
            "block",
            "arm",
            name=op.f("uq_knob_sweep_cells_knob_sweep_id_block_arm"),
        ),
    )
    op.create_index(op.f("ix_knob_sweep_cells_run_id"), "knob_sweep_cells", ["run_id"])


def downgrade() -> None:
    op.drop_index(op.f("ix_knob_sweep_cells_run_id"), table_name="knob_sweep_cells")
    op.drop_table("knob_sweep_cells")
    op.drop_index(op.f("ix_knob_sweeps_experiment_id_status"), table_name="knob_sweeps")
    op.drop_table("knob_sweeps")
