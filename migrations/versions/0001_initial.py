"""Experiments, their stored configs, environments and runs.

Revision ID: 0001_initial
Revises:
Create Date: 2025-11-29
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision: str = "0001_initial"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_CURRENT_CONFIG_FK = "fk_experiments_current_config_id_experiment_configs"


def _timestamp(name: str, nullable: bool = False) -> sa.Column[datetime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    # experiments and experiment_configs point at each other. SQLite accepts the forward
    # reference inline (and cannot ALTER a constraint in); PostgreSQL needs it added after
    # both tables exist.
    sqlite = op.get_context().dialect.name == "sqlite"
    inline_fk = (
        [
            sa.ForeignKeyConstraint(
                ["current_config_id"], ["experiment_configs.id"], name=_CURRENT_CONFIG_FK
            )
        ]
        if sqlite
        else []
    )
    op.create_table(
        "experiments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("parent_id", sa.Integer(), nullable=True),
        sa.Column("current_config_id", sa.Integer(), nullable=True),
        sa.Column("description", sa.Text(), nullable=True),
        sa.Column("hypothesis", sa.Text(), nullable=True),
        _timestamp("created_at"),
        _timestamp("updated_at"),
        sa.CheckConstraint("kind IN ('baseline', 'step')", name=op.f("ck_experiments_kind")),
        sa.CheckConstraint(
            "(kind = 'baseline' AND parent_id IS NULL)"
            " OR (kind = 'step' AND parent_id IS NOT NULL)",
            name=op.f("ck_experiments_parent_matches_kind"),
        ),
        sa.ForeignKeyConstraint(
            ["parent_id"], ["experiments.id"], name=op.f("fk_experiments_parent_id_experiments")
        ),
        *inline_fk,
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiments")),
        sa.UniqueConstraint("name", name=op.f("uq_experiments_name")),
    )
    op.create_table(
        "experiment_configs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("config_hash", sa.String(length=64), nullable=False),
        sa.Column("change_json", sa.Text(), nullable=True),
        sa.Column("variable", sa.String(length=200), nullable=True),
        sa.Column("parent_config_hash", sa.String(length=64), nullable=True),
        sa.Column("source_path", sa.Text(), nullable=False),
        sa.Column("source_hash", sa.String(length=64), nullable=False),
        _timestamp("created_at"),
        sa.ForeignKeyConstraint(
            ["experiment_id"],
            ["experiments.id"],
            name=op.f("fk_experiment_configs_experiment_id_experiments"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_experiment_configs")),
        sa.UniqueConstraint(
            "experiment_id",
            "config_hash",
            name=op.f("uq_experiment_configs_experiment_id_config_hash"),
        ),
    )
    if not sqlite:
        op.create_foreign_key(
            op.f(_CURRENT_CONFIG_FK),
            "experiments",
            "experiment_configs",
            ["current_config_id"],
            ["id"],
        )
    op.create_table(
        "environments",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("fingerprint_hash", sa.String(length=64), nullable=False),
        sa.Column("material_hash", sa.String(length=64), nullable=False),
        sa.Column("fingerprint_json", sa.Text(), nullable=False),
        _timestamp("created_at"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_environments")),
        sa.UniqueConstraint("fingerprint_hash", name=op.f("uq_environments_fingerprint_hash")),
    )
    op.create_index(
        op.f("ix_environments_material_hash"), "environments", ["material_hash"], unique=False
    )
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("experiment_id", sa.Integer(), nullable=False),
        sa.Column("config_id", sa.Integer(), nullable=False),
        sa.Column("environment_id", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("protocol_name", sa.String(length=64), nullable=False),
        sa.Column("protocol_json", sa.Text(), nullable=False),
        sa.Column("provisional", sa.Boolean(), nullable=False),
        sa.Column("repeat", sa.Boolean(), nullable=False),
        sa.Column("code_identity_json", sa.Text(), nullable=False),
        sa.Column("git_commit", sa.String(length=64), nullable=True),
        sa.Column("git_dirty", sa.Boolean(), nullable=True),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        _timestamp("started_at"),
        _timestamp("heartbeat_at"),
        _timestamp("finished_at", nullable=True),
        sa.Column("warmup_s", sa.Double(), nullable=True),
        sa.Column("duration_s", sa.Double(), nullable=True),
        sa.Column("valid", sa.Boolean(), nullable=True),
        sa.Column("reasons_json", sa.Text(), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=True),
        sa.Column("errors", sa.BigInteger(), nullable=True),
        sa.Column("qps", sa.Double(), nullable=True),
        sa.Column("summary_json", sa.Text(), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "status IN ('RUNNING', 'FINISHED', 'FAILED', 'KILLED', 'CRASHED')",
            name=op.f("ck_runs_status"),
        ),
        sa.ForeignKeyConstraint(
            ["config_id"],
            ["experiment_configs.id"],
            name=op.f("fk_runs_config_id_experiment_configs"),
        ),
        sa.ForeignKeyConstraint(
            ["environment_id"],
            ["environments.id"],
            name=op.f("fk_runs_environment_id_environments"),
        ),
        sa.ForeignKeyConstraint(
            ["experiment_id"], ["experiments.id"], name=op.f("fk_runs_experiment_id_experiments")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
    )
    op.create_index(op.f("ix_runs_config_id"), "runs", ["config_id"], unique=False)
    op.create_index(
        op.f("ix_runs_experiment_id_status"), "runs", ["experiment_id", "status"], unique=False
    )


def downgrade() -> None:
    # Break the experiments <-> experiment_configs cycle so both tables can be dropped
    # even when they hold rows (SQLite checks foreign keys on DROP TABLE).
    op.execute(sa.text("UPDATE experiments SET current_config_id = NULL"))
    if op.get_context().dialect.name != "sqlite":
        op.drop_constraint(op.f(_CURRENT_CONFIG_FK), "experiments", type_="foreignkey")
    op.drop_index(op.f("ix_runs_experiment_id_status"), table_name="runs")
    op.drop_index(op.f("ix_runs_config_id"), table_name="runs")
    op.drop_table("runs")
    op.drop_index(op.f("ix_environments_material_hash"), table_name="environments")
    op.drop_table("environments")
    op.drop_table("experiment_configs")
    op.drop_table("experiments")
