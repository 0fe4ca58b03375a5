"""Measurements of a run: stage latency, per-second windows, resources, errors.

Revision ID: 0002_measurements
Revises: 0001_initial
Create Date: 2025-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_measurements"
down_revision: str | Sequence[str] | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PHASES = "phase IN ('warmup', 'measure')"
_STATISTICS = ("min", "mean", "stddev", "p50", "p90", "p95", "p99", "p999", "max")


def _run_fk(table: str) -> sa.ForeignKeyConstraint:
    # Measurements belong to their run and go with it.
    return sa.ForeignKeyConstraint(
        ["run_id"], ["runs.id"], name=op.f(f"fk_{table}_run_id_runs"), ondelete="CASCADE"
    )


def _ms(name: str) -> sa.Column[float]:
    return sa.Column(name, sa.Double(), nullable=True)


def upgrade() -> None:
    op.create_table(
        "stage_stats",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("stage", sa.String(length=64), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        *(_ms(f"{name}_ms") for name in _STATISTICS),
        sa.Column("histogram", sa.Text(), nullable=False),
        sa.CheckConstraint(_PHASES, name=op.f("ck_stage_stats_phase")),
        _run_fk("stage_stats"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_stage_stats")),
        sa.UniqueConstraint(
            "run_id", "stage", "phase", name=op.f("uq_stage_stats_run_id_stage_phase")
        ),
    )
    op.create_table(
        "run_windows",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("t_s", sa.Integer(), nullable=False),
        sa.Column("completed", sa.BigInteger(), nullable=False),
        sa.Column("errors", sa.BigInteger(), nullable=False),
        sa.Column("qps", sa.Double(), nullable=False),
        _ms("p50_ms"),
        _ms("p99_ms"),
        _ms("send_lag_p99_ms"),
        sa.CheckConstraint(_PHASES, name=op.f("ck_run_windows_phase")),
        _run_fk("run_windows"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_windows")),
        sa.UniqueConstraint("run_id", "phase", "t_s", name=op.f("uq_run_windows_run_id_phase_t_s")),
    )
    op.create_table(
        "resource_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("t_s", sa.Double(), nullable=False),
        sa.Column("cpu_process_pct", sa.Double(), nullable=True),
        sa.Column("cpu_system_pct", sa.Double(), nullable=True),
        sa.Column("cpu_per_core_json", sa.Text(), nullable=True),
        sa.Column("rss_bytes", sa.BigInteger(), nullable=True),
        sa.Column("mem_used_bytes", sa.BigInteger(), nullable=True),
        sa.Column("mem_total_bytes", sa.BigInteger(), nullable=True),
        sa.Column("iowait_pct", sa.Double(), nullable=True),
        sa.Column("gpu_json", sa.Text(), nullable=True),
        sa.CheckConstraint(_PHASES, name=op.f("ck_resource_samples_phase")),
        _run_fk("resource_samples"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_resource_samples")),
    )
    op.create_index(
        op.f("ix_resource_samples_run_id_phase_t_s"),
        "resource_samples",
        ["run_id", "phase", "t_s"],
        unique=False,
    )
    op.create_table(
        "run_errors",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("error_type", sa.String(length=200), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("example", sa.Text(), nullable=True),
        _run_fk("run_errors"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_errors")),
        sa.UniqueConstraint("run_id", "error_type", name=op.f("uq_run_errors_run_id_error_type")),
    )


def downgrade() -> None:
    op.drop_table("run_errors")
    op.drop_index(op.f("ix_resource_samples_run_id_phase_t_s"), table_name="resource_samples")
    op.drop_table("resource_samples")
    op.drop_table("run_windows")
    op.drop_table("stage_stats")
