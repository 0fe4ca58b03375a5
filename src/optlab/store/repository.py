"""The Store: one session scope and the queries the rest of optlab needs.

Every method opens its own short transaction and returns frozen records, so callers never
hold a session (or a SQLite write lock) across a measurement.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy import Engine, Select, func, select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from optlab.config.canonical import canonical_json
from optlab.errors import NotFoundError
from optlab.store.convert import experiment_record, stored_config
from optlab.store.database import default_url, make_engine, masked
from optlab.store.faults import failed
from optlab.store.imports import ImportMixin
from optlab.store.interrupts import signals_deferred
from optlab.store.knob_sweeps import KnobSweepsMixin
from optlab.store.measurements import MeasurementsMixin
from optlab.store.models import (
    EXPERIMENT_KINDS,
    SqlConfig,
    SqlEnvironment,
    SqlExperiment,
    SqlRun,
    utcnow,
)
from optlab.store.records import EnvironmentRecord, ExperimentRecord, StoredConfig
from optlab.store.runs import RunsMixin, experiment_row
from optlab.store.schema import verify_or_create
from optlab.store.sweeps import SweepsMixin
from optlab.store.transfer import TransferMixin

_Row = TypeVar("_Row", SqlExperiment, SqlConfig, SqlEnvironment)


def _insert_or_get(session: Session, query: Select[_Row], new: Callable[[], _Row]) -> _Row:
    """The row `query` finds, else `new()` inserted - or, when another process inserted the
    same unique key first, that process's row.

    Select-then-insert alone races: two processes storing the same new experiment both find
    nothing, and the second insert fails on the unique constraint. The insert runs in a
    SAVEPOINT, so losing the race rolls back only the insert, and the row is selected again
    (PostgreSQL's READ COMMITTED sees the winner's commit; SQLite's BEGIN IMMEDIATE already
    lets one writer in at a time).
    """
    existing = session.scalar(query)
    if existing is not None:
        return existing
    row = new()
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        existing = session.scalar(query)
        if existing is None:
            raise  # another constraint failed: a real error, not a lost race
        return existing
    return row


class Store(RunsMixin, SweepsMixin, KnobSweepsMixin, MeasurementsMixin, TransferMixin, ImportMixin):
    """optlab's database. Create one with `Store.open()`; close it (or use `with`)."""

    def __init__(self, engine: Engine) -> None:
        # Use Store.open: it checks the schema, which this constructor does not.
        self._engine = engine
        self._sessions = sessionmaker(bind=engine, expire_on_commit=False)

    @classmethod
    def open(cls, url: str | None = None, *, read_only: bool = False) -> Store:
        """Open `url` (default: `default_url()`), creating a new database at schema head.

        Raises StoreError for an unreachable or damaged database, one at an older or newer
        schema revision, or one that is not an optlab database. `read_only`: for commands
        that only read; nothing is created or written, so read-only media work too.
        """
        engine = make_engine(url or default_url(), read_only=read_only)
        try:
            verify_or_create(engine, read_only=read_only)
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    @property
    def url(self) -> str:
        """The database URL with the password masked."""
        return masked(self._engine.url)

    @property
    def engine(self) -> Engine:
        """For read-only analysis (e.g. `pandas.read_sql`); write through the methods."""
        return self._engine

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def session_scope(self) -> Iterator[Session]:
        """The one transaction boundary: commit on success, roll back on any exception.

        Ctrl-C (SIGTERM, SIGHUP) raises once the transaction has ended: raised halfway
        through SQLAlchemy, it could leave a connection holding the write lock, and the
        interrupted command's next write would fail "database is locked" (`interrupts`)."""
        with signals_deferred():
            session = self._sessions()
            try:
                yield session
                session.commit()
            except DBAPIError as exc:
                session.rollback()
                # The engine already turns known conditions into StoreError as they happen
                # (faults.install); this catches the rest, e.g. an unknown OperationalError.
                found = failed(self._engine.url, exc)
                if found is None:
                    raise
                raise found from exc
            except BaseException:
                session.rollback()
                raise
            finally:
                session.close()

    # -- experiments and configs ------------------------------------------------------

    def get_experiment(self, name: str) -> ExperimentRecord | None:
        with self.session_scope() as session:
            row = session.scalar(select(SqlExperiment).where(SqlExperiment.name == name))
            return None if row is None else experiment_record(row)

    def list_experiments(self) -> list[ExperimentRecord]:
        with self.session_scope() as session:
            rows = session.scalars(select(SqlExperiment).order_by(SqlExperiment.id))
            return [experiment_record(row) for row in rows]

    def save_config(
        self,
        *,
        name: str,
        kind: str,
        parent: str | None,
        description: str | None,
        hypothesis: str | None,
        config: dict[str, Any],
        config_hash: str,
        change: dict[str, Any] | None,
        variable: str | None,
        parent_config_hash: str | None,
        source_path: str,
        source_hash: str,
    ) -> StoredConfig:
        """Store `config` for experiment `name` (created if new) and make it current.

        An identical config (same hash) is reused rather than duplicated. Whether a config
        may change at all is the caller's decision; see `count_runs`.
        """
        if kind not in EXPERIMENT_KINDS:
            raise ValueError(f"kind must be one of {EXPERIMENT_KINDS}, not {kind!r}")
        if (kind == "baseline") != (parent is None):
            raise ValueError("a baseline has no parent and a step must have one")
        with self.session_scope() as session:
            parent_row = None if parent is None else experiment_row(session, parent)
            experiment = _insert_or_get(
                session,
                select(SqlExperiment).where(SqlExperiment.name == name),
                lambda: SqlExperiment(name=name, kind=kind, parent=parent_row),
            )
            self._refuse_cycle(experiment, parent_row)
            experiment.kind = kind
            experiment.parent = parent_row
            experiment.description = description
            experiment.hypothesis = hypothesis
            experiment.updated_at = utcnow()
            session.flush()
            row = _insert_or_get(
                session,
                select(SqlConfig).where(
                    SqlConfig.experiment_id == experiment.id, SqlConfig.config_hash == config_hash
                ),
                lambda: SqlConfig(
                    experiment=experiment,
                    config_json=config,
                    config_hash=config_hash,
                    change_json=change,
                    variable=variable,
                    parent_config_hash=parent_config_hash,
                    source_path=source_path,
                    source_hash=source_hash,
                ),
            )
            # The same hash with another config: only `target.remedies` differ (advice, not a
            # measured variable: `config_hash`), and the stored config takes the new ones.
            if row.config_json != config:
                row.config_json = config
            experiment.current_config = row
            session.flush()
            return stored_config(row, name)

    @staticmethod
    def _refuse_cycle(experiment: SqlExperiment, parent: SqlExperiment | None) -> None:
        # A chain must end at a baseline; a loop would make every chain walk endless.
        ancestor = parent
        while ancestor is not None:
            if ancestor is experiment:
                raise ValueError(f"experiment {experiment.name!r} cannot be its own ancestor")
            ancestor = ancestor.parent

    def get_config(self, config_id: int) -> StoredConfig:
        with self.session_scope() as session:
            row = session.get(SqlConfig, config_id)
            if row is None:
                raise NotFoundError(f"stored config {config_id} does not exist")
            return stored_config(row, row.experiment.name)

    def count_runs(self, name: str) -> int:
        """How many runs (of any status) experiment `name` has; 0 when it is unknown."""
        with self.session_scope() as session:
            query = (
                select(func.count(SqlRun.id))
                .join(SqlRun.experiment)
                .where(SqlExperiment.name == name)
            )
            return session.scalar(query) or 0

    # -- environments -----------------------------------------------------------------

    def record_environment(self, fingerprint: dict[str, Any], material_hash: str) -> int:
        """Store a fingerprint once (by the hash of its canonical JSON); return its id."""
        fingerprint_hash = hashlib.sha256(canonical_json(fingerprint).encode()).hexdigest()
        query = select(SqlEnvironment).where(SqlEnvironment.fingerprint_hash == fingerprint_hash)
        with self.session_scope() as session:
            row = _insert_or_get(
                session,
                query,
                lambda: SqlEnvironment(
                    fingerprint_hash=fingerprint_hash,
                    material_hash=material_hash,
                    fingerprint_json=fingerprint,
                ),
            )
            return row.id

    def get_environment(self, environment_id: int) -> EnvironmentRecord:
        with self.session_scope() as session:
            row = session.get(SqlEnvironment, environment_id)
            if row is None:
                raise NotFoundError(f"environment {environment_id} does not exist")
            return EnvironmentRecord(
                id=row.id,
                fingerprint=row.fingerprint_json,
                fingerprint_hash=row.fingerprint_hash,
                material_hash=row.material_hash,
                created_at=row.created_at,
            )
