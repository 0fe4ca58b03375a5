"""SQLAlchemy models: the database schema as Python. Rows never leave `optlab.store`.

The migrations in the top-level `migrations/` folder must create exactly this schema; a test
compares the two with Alembic's `compare_metadata`.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedColumn, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from optlab.config.canonical import canonical_json

# Every constraint and index gets a predictable name, so a later migration can drop or alter
# it by name on every backend (SQLite batch mode needs names to find constraints again).
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

RUN_STATUSES = ("RUNNING", "FINISHED", "FAILED", "KILLED", "CRASHED")
PHASES = ("warmup", "measure")
EXPERIMENT_KINDS = ("baseline", "step")


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_uid() -> str:
    """A run's identity: uuid4 hex, unique across every database the run is copied to."""
    return uuid.uuid4().hex


def _in_list(column: str, values: tuple[str, ...]) -> str:
    quoted = ", ".join(f"'{value}'" for value in values)
    return f"{column} IN ({quoted})"


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp that is always timezone-aware UTC in Python.

    SQLite has no timezone type and hands back naive values; PostgreSQL hands back the
    session's zone. Normalising here means callers compare timestamps from either backend
    safely, and SQLite's text comparison of timestamps stays correct because every stored
    value is in the same zone.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError(f"naive datetime {value!r}: optlab stores timezone-aware UTC only")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# What some backend refuses or mangles in text: C0 control characters other than tab, newline
# and carriage return (PostgreSQL rejects NUL outright), and lone surrogates, which are not
# UTF-8 (Python makes them when it decodes bytes with errors="surrogateescape").
_UNSTORABLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def storable_text(value: str) -> str:
    """`value` with what some backend cannot store spelled as a Python escape (NUL as the
    four characters `\\x00`): a target's error message or a binary response body quoted as
    an error example must not cost the run it belongs to.

    One way only: the escape is for people reading the text, and a literal `\\x00` typed in
    a description reads back the same as an escaped NUL.
    """
    return _UNSTORABLE.sub(_escape, value)


class StorableText(TypeDecorator[str]):
    """Text that every backend stores (see `storable_text`); every Text column uses it.

    Applied to bound values, so a lookup by a name holding a NUL finds the row stored
    under the same name.
    """

    impl: type[String] = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else storable_text(value)


class StorableString(StorableText):
    """`StorableText` for String(length) columns."""

    impl = String
    cache_ok = True


class JSONText(TypeDecorator[Any]):
    """JSON stored as canonical text (sorted keys, compact).

    Text rather than a native JSON type: the stored bytes are identical on SQLite and
    PostgreSQL, hashes recomputed from them are stable, and any SQL client can read them.
    """

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> str | None:
        if value is None:
            return None
        # json.dumps already escapes control characters; this catches lone surrogates.
        return storable_text(canonical_json(value))

    def process_result_value(self, value: str | None, dialect: Dialect) -> Any:
        if value is None:
            return None
        return json.loads(value)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


metadata = Base.metadata


class SqlExperiment(Base):
    __tablename__ = "experiments"
    __table_args__ = (
        CheckConstraint(_in_list("kind", EXPERIMENT_KINDS), name="kind"),
        # A baseline stands alone; every step resolves against a parent's stored config.
        CheckConstraint(
            "(kind = 'baseline' AND parent_id IS NULL)"
            " OR (kind = 'step' AND parent_id IS NOT NULL)",
            name="parent_matches_kind",
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(StorableString(200), unique=True)
    kind: Mapped[str] = mapped_column(StorableString(16))
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("experiments.id"))
    # use_alter: experiments and experiment_configs reference each other, so this key is
    # added after both tables exist (PostgreSQL refuses a forward reference at CREATE).
    current_config_id: Mapped[int | None] = mapped_column(
        ForeignKey("experiment_configs.id", use_alter=True)
    )
    description: Mapped[str | None] = mapped_column(StorableText)
    hypothesis: Mapped[str | None] = mapped_column(StorableText)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    parent: Mapped[SqlExperiment | None] = relationship(remote_side=[id])
    # post_update: the experiment row is inserted first, its config next, and the pointer
    # is filled in by a second UPDATE - the only order the foreign keys allow.
    current_config: Mapped[SqlConfig | None] = relationship(
        foreign_keys=[current_config_id], post_update=True
    )


class SqlConfig(Base):
    """A resolved config as it was stored; immutable once a run references it."""

    __tablename__ = "experiment_configs"
    __table_args__ = (UniqueConstraint("experiment_id", "config_hash"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"))
    config_json: Mapped[dict[str, Any]] = mapped_column(JSONText)
    config_hash: Mapped[str] = mapped_column(StorableString(64))
    change_json: Mapped[dict[str, Any] | None] = mapped_column(JSONText)
    variable: Mapped[str | None] = mapped_column(StorableString(200))
    parent_config_hash: Mapped[str | None] = mapped_column(StorableString(64))
    source_path: Mapped[str] = mapped_column(StorableText)
    source_hash: Mapped[str] = mapped_column(StorableString(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)

    experiment: Mapped[SqlExperiment] = relationship(foreign_keys=[experiment_id])


class SqlEnvironment(Base):
    __tablename__ = "environments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    fingerprint_hash: Mapped[str] = mapped_column(StorableString(64), unique=True)
    # The hash of only the parts that change performance; runs are comparable when it matches.
    material_hash: Mapped[str] = mapped_column(StorableString(64), index=True)
    fingerprint_json: Mapped[dict[str, Any]] = mapped_column(JSONText)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class SqlRun(Base):
    __tablename__ = "runs"
    __table_args__ = (
        CheckConstraint(_in_list("status", RUN_STATUSES), name="status"),
        Index(None, "experiment_id", "status"),
        # A unique index rather than a constraint, and nullable: migration 0004 says why.
        Index(None, "uid", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The run's identity in every database it is copied to (ids differ between databases).
    uid: Mapped[str] = mapped_column(StorableString(32), nullable=True, default=new_uid)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"))
    config_id: Mapped[int] = mapped_column(ForeignKey("experiment_configs.id"), index=True)
    environment_id: Mapped[int | None] = mapped_column(ForeignKey("environments.id"))
    status: Mapped[str] = mapped_column(StorableString(16))
    protocol_name: Mapped[str] = mapped_column(StorableString(64))
    protocol_json: Mapped[dict[str, Any]] = mapped_column(JSONText)
    provisional: Mapped[bool] = mapped_column(Boolean)
    repeat: Mapped[bool] = mapped_column(Boolean)
    code_identity_json: Mapped[dict[str, Any]] = mapped_column(JSONText)
    git_commit: Mapped[str | None] = mapped_column(StorableString(64))
    git_dirty: Mapped[bool | None] = mapped_column(Boolean)
    hostname: Mapped[str] = mapped_column(StorableString(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    warmup_s: Mapped[float | None] = mapped_column(Double)
    duration_s: Mapped[float | None] = mapped_column(Double)
    valid: Mapped[bool | None] = mapped_column(Boolean)
    reasons_json: Mapped[list[str]] = mapped_column(JSONText)
    # Each reason's code, in the same order (store.reasons; migration 0008).
    reason_codes_json: Mapped[list[str]] = mapped_column(JSONText, server_default="[]")
    requests: Mapped[int | None] = mapped_column(BigInteger)
    errors: Mapped[int | None] = mapped_column(BigInteger)
    qps: Mapped[float | None] = mapped_column(Double)
    summary_json: Mapped[dict[str, Any] | None] = mapped_column(JSONText)
    error_message: Mapped[str | None] = mapped_column(StorableText)

    experiment: Mapped[SqlExperiment] = relationship()
    config: Mapped[SqlConfig] = relationship()


def _run_fk() -> MappedColumn[int]:
    # Measurements belong to their run and go with it.
    return mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))


def _phase_check() -> CheckConstraint:
    return CheckConstraint(_in_list("phase", PHASES), name="phase")


class SqlStageStats(Base):
    __tablename__ = "stage_stats"
    __table_args__ = (UniqueConstraint("run_id", "stage", "phase"), _phase_check())

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = _run_fk()
    stage: Mapped[str] = mapped_column(StorableString(64))
    phase: Mapped[str] = mapped_column(StorableString(16))
    count: Mapped[int] = mapped_column(BigInteger)
    min_ms: Mapped[float | None] = mapped_column(Double)
    mean_ms: Mapped[float | None] = mapped_column(Double)
    stddev_ms: Mapped[float | None] = mapped_column(Double)
    p50_ms: Mapped[float | None] = mapped_column(Double)
    p90_ms: Mapped[float | None] = mapped_column(Double)
    p95_ms: Mapped[float | None] = mapped_column(Double)
    p99_ms: Mapped[float | None] = mapped_column(Double)
    p999_ms: Mapped[float | None] = mapped_column(Double)
    max_ms: Mapped[float | None] = mapped_column(Double)
    # HdrHistogram encode() output: lossless, and mergeable across runs and processes.
    histogram: Mapped[str] = mapped_column(StorableText)


class SqlWindow(Base):
    __tablename__ = "run_windows"
    __table_args__ = (UniqueConstraint("run_id", "phase", "t_s"), _phase_check())

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = _run_fk()
    phase: Mapped[str] = mapped_column(StorableString(16))
    t_s: Mapped[int] = mapped_column(Integer)
    completed: Mapped[int] = mapped_column(BigInteger)
    errors: Mapped[int] = mapped_column(BigInteger)
    qps: Mapped[float] = mapped_column(Double)
    # NULL in a second where nothing completed: there is no percentile to record.
    p50_ms: Mapped[float | None] = mapped_column(Double)
    p99_ms: Mapped[float | None] = mapped_column(Double)
    send_lag_p99_ms: Mapped[float | None] = mapped_column(Double)
    # Requests the generator sent in this second, and those in flight at its end (NULL in
    # runs measured before optlab recorded them).
    offered: Mapped[int | None] = mapped_column(BigInteger)
    in_flight: Mapped[int | None] = mapped_column(BigInteger)
    # A streaming target's streams that ended in this second (NULL: none, or a run
    # measured before optlab recorded them).
    ttft_p50_ms: Mapped[float | None] = mapped_column(Double)
    ttft_p99_ms: Mapped[float | None] = mapped_column(Double)
    tpot_p50_ms: Mapped[float | None] = mapped_column(Double)
    tpot_p99_ms: Mapped[float | None] = mapped_column(Double)
    output_tps: Mapped[float | None] = mapped_column(Double)


class SqlResourceSample(Base):
    """One resource sample; a metric the platform cannot read is NULL, never a made-up 0."""

    __tablename__ = "resource_samples"
    __table_args__ = (Index(None, "run_id", "phase", "t_s"), _phase_check())

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = _run_fk()
    phase: Mapped[str] = mapped_column(StorableString(16))
    t_s: Mapped[float] = mapped_column(Double)
    cpu_process_pct: Mapped[float | None] = mapped_column(Double)
    cpu_system_pct: Mapped[float | None] = mapped_column(Double)
    cpu_per_core_json: Mapped[list[float] | None] = mapped_column(JSONText)
    rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    mem_used_bytes: Mapped[int | None] = mapped_column(BigInteger)
    mem_total_bytes: Mapped[int | None] = mapped_column(BigInteger)
    iowait_pct: Mapped[float | None] = mapped_column(Double)
    service_cpu_pct: Mapped[float | None] = mapped_column(Double)
    service_rss_bytes: Mapped[int | None] = mapped_column(BigInteger)
    steal_pct: Mapped[float | None] = mapped_column(Double)
    other_cpu_pct: Mapped[float | None] = mapped_column(Double)
    gpu_json: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONText)


class SqlRunError(Base):
    __tablename__ = "run_errors"
    __table_args__ = (UniqueConstraint("run_id", "error_type"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = _run_fk()
    error_type: Mapped[str] = mapped_column(StorableString(200))
    count: Mapped[int] = mapped_column(BigInteger)
    example: Mapped[str | None] = mapped_column(StorableText)


SWEEP_MODES = ("open", "closed")


class SqlSweep(Base):
    """One `optlab sweep`: its experiment and stored config, the SLO, how it searched, what it
    found. Its levels are runs (`sweep_levels`), so every level keeps its histograms,
    windows, resources and stages."""

    __tablename__ = "sweeps"
    __table_args__ = (
        CheckConstraint(_in_list("status", RUN_STATUSES), name="status"),
        CheckConstraint(_in_list("mode", SWEEP_MODES), name="mode"),
        Index(None, "experiment_id", "status"),
        UniqueConstraint("uid"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uid: Mapped[str] = mapped_column(StorableString(32), default=new_uid)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"))
    config_id: Mapped[int] = mapped_column(ForeignKey("experiment_configs.id"))
    environment_id: Mapped[int | None] = mapped_column(ForeignKey("environments.id"))
    status: Mapped[str] = mapped_column(StorableString(16))
    mode: Mapped[str] = mapped_column(StorableString(16))
    slo_percentile: Mapped[str] = mapped_column(StorableString(16))
    slo_ms: Mapped[float] = mapped_column(Double)
    # The whole SLO when it is more than one latency percentile (a streaming target's token
    # series: `ttft_p99=500ms,tpot_p99=50ms`); null otherwise. The two columns above hold its
    # first bound.
    slo_json: Mapped[dict[str, Any] | None] = mapped_column(JSONText)
    # The protocol each level follows before its own duration factor (the comparison key).
    protocol_json: Mapped[dict[str, Any]] = mapped_column(JSONText)
    # The strategy's settings: rates, tolerance, budget.
    strategy_json: Mapped[dict[str, Any]] = mapped_column(JSONText)
    code_identity_json: Mapped[dict[str, Any]] = mapped_column(JSONText)
    hostname: Mapped[str] = mapped_column(StorableString(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # The sweep's result (store.sweep_result), the capacity included.
    result_json: Mapped[dict[str, Any] | None] = mapped_column(JSONText)
    measured_s: Mapped[float | None] = mapped_column(Double)
    error_message: Mapped[str | None] = mapped_column(StorableText)

    experiment: Mapped[SqlExperiment] = relationship()
    config: Mapped[SqlConfig] = relationship()


class SqlSweepLevel(Base):
    """A level of a sweep: the run that measured it, at what load. A run measured by an
    earlier sweep may be a level of a later one too (reused: same config, protocol,
    environment and code)."""

    __tablename__ = "sweep_levels"
    __table_args__ = (
        UniqueConstraint("sweep_id", "position"),
        CheckConstraint(_in_list("mode", SWEEP_MODES), name="mode"),
        Index(None, "run_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sweep_id: Mapped[int] = mapped_column(ForeignKey("sweeps.id", ondelete="CASCADE"))
    position: Mapped[int] = mapped_column(Integer)
    run_id: Mapped[int] = _run_fk()
    mode: Mapped[str] = mapped_column(StorableString(16))
    load: Mapped[float] = mapped_column(Double)  # requests/s (open) or clients (closed)
    purpose: Mapped[str] = mapped_column(StorableString(32))
    reused: Mapped[bool] = mapped_column(Boolean)


class SqlKnobSweep(Base):
    """One `optlab sweep-knob`: the parent experiment (the control arm), the knob, its values
    and sibling experiments, the block plan, what it found. Its cells are runs or, for a
    capacity metric, sweeps (`knob_sweep_cells`)."""

    __tablename__ = "knob_sweeps"
    __table_args__ = (
        CheckConstraint(_in_list("status", RUN_STATUSES), name="status"),
        Index(None, "experiment_id", "status"),
        UniqueConstraint("uid"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    uid: Mapped[str] = mapped_column(StorableString(32), default=new_uid)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("experiments.id"))
    config_id: Mapped[int] = mapped_column(ForeignKey("experiment_configs.id"))
    knob: Mapped[str] = mapped_column(StorableString(255))
    metric: Mapped[str] = mapped_column(StorableString(32))
    status: Mapped[str] = mapped_column(StorableString(16))
    # The request as asked (values, blocks, SLO, protocol, seed), the arms' experiments and
    # the block plan: what a resumed sweep must match and follow.
    spec_json: Mapped[dict[str, Any]] = mapped_column(JSONText)
    hostname: Mapped[str] = mapped_column(StorableString(255))
    pid: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    result_json: Mapped[dict[str, Any] | None] = mapped_column(JSONText)
    measured_s: Mapped[float | None] = mapped_column(Double)
    error_message: Mapped[str | None] = mapped_column(StorableText)

    experiment: Mapped[SqlExperiment] = relationship()
    config: Mapped[SqlConfig] = relationship()


class SqlKnobCell(Base):
    """One arm measured in one block of a knob sweep: a run (its metric read from the run) or
    a capacity sweep. Measured again (an INVALID run), the cell points at the new one."""

    __tablename__ = "knob_sweep_cells"
    __table_args__ = (
        UniqueConstraint("knob_sweep_id", "block", "arm"),
        Index(None, "run_id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    knob_sweep_id: Mapped[int] = mapped_column(ForeignKey("knob_sweeps.id", ondelete="CASCADE"))
    block: Mapped[int] = mapped_column(Integer)
    arm: Mapped[int] = mapped_column(Integer)  # 0: the parent; 1..k: the values in order
    position: Mapped[int] = mapped_column(Integer)  # its place in the block's random order
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id", ondelete="SET NULL"))
    sweep_id: Mapped[int | None] = mapped_column(ForeignKey("sweeps.id", ondelete="SET NULL"))
    measured_s: Mapped[float] = mapped_column(Double)
