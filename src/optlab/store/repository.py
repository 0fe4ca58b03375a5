"""The Store: one session scope and the queries the rest of optlab needs.

Every method opens its own short transaction and returns frozen records, so callers never
hold a session (or a SQLite write lock) across a measurement.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar

from sqlalchemy import Engine, Select, and_, func, or_, select
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from optlab.config.canonical import canonical_json
from optlab.errors import NotFoundError
from optlab.store.convert import experiment_record, run_record, stored_config
from optlab.store.database import default_url, make_engine, masked, verify_or_create
from optlab.store.faults import failed
from optlab.store.measurements import MeasurementsMixin, require_run
from optlab.store.models import (
    EXPERIMENT_KINDS,
    SqlConfig,
    SqlEnvironment,
    SqlExperiment,
    SqlRun,
    new_uid,
    utcnow,
)
from optlab.store.records import (
    TERMINAL_STATUSES,
    EnvironmentRecord,
    ExperimentRecord,
    RunRecord,
    RunStatus,
    StoredConfig,
)
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


class Store(MeasurementsMixin, TransferMixin):
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
        """The one transaction boundary: commit on success, roll back on any exception."""
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

    @staticmethod
    def _experiment_row(session: Session, name: str) -> SqlExperiment:
        row = session.scalar(select(SqlExperiment).where(SqlExperiment.name == name))
        if row is None:
            raise NotFoundError(
                f"experiment {name!r} is not in the database",
                hint="an experiment is stored when it is first run; check the name, or run "
                "its parent first",
            )
        return row

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
            parent_row = None if parent is None else self._experiment_row(session, parent)
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

    # -- runs -------------------------------------------------------------------------

    def create_run(
        self,
        *,
        experiment: str,
        protocol_name: str,
        protocol: dict[str, Any],
        provisional: bool,
        environment_id: int | None,
        code_identity: dict[str, Any],
        git_commit: str | None,
        git_dirty: bool | None,
        repeat: bool = False,
    ) -> int:
        """Start a RUNNING run of the experiment's current config by this process."""
        with self.session_scope() as session:
            row = self._experiment_row(session, experiment)
            if row.current_config_id is None:
                raise NotFoundError(f"experiment {experiment!r} has no stored config")
            now = utcnow()
            run = SqlRun(
                uid=new_uid(),
                experiment_id=row.id,
                config_id=row.current_config_id,
                environment_id=environment_id,
                status=RunStatus.RUNNING.value,
                protocol_name=protocol_name,
                protocol_json=protocol,
                provisional=provisional,
                repeat=repeat,
                code_identity_json=code_identity,
                git_commit=git_commit,
                git_dirty=git_dirty,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                started_at=now,
                heartbeat_at=now,
                reasons_json=[],
            )
            session.add(run)
            session.flush()
            return run.id

    def heartbeat(self, run_id: int) -> None:
        """Record that the run's process is alive (see `mark_crashed`)."""
        with self.session_scope() as session:
            require_run(session, run_id).heartbeat_at = utcnow()

    def finish_run(
        self,
        run_id: int,
        *,
        status: str,
        valid: bool | None,
        reasons: Sequence[str],
        requests: int | None,
        errors: int | None,
        qps: float | None,
        summary: dict[str, Any] | None,
        warmup_s: float | None,
        duration_s: float | None,
        error_message: str | None = None,
    ) -> None:
        if status not in TERMINAL_STATUSES:
            allowed = sorted(TERMINAL_STATUSES)
            raise ValueError(f"a run finishes as one of {allowed}, not {status!r}")
        with self.session_scope() as session:
            run = require_run(session, run_id)
            now = utcnow()
            run.status = str(status)
            run.valid = valid
            run.reasons_json = list(reasons)
            run.requests = requests
            run.errors = errors
            run.qps = qps
            run.summary_json = summary
            run.warmup_s = warmup_s
            run.duration_s = duration_s
            run.error_message = error_message
            run.finished_at = now
            run.heartbeat_at = now

    def get_run(self, run_id: int) -> RunRecord:
        with self.session_scope() as session:
            query = self._runs_query().where(SqlRun.id == run_id)
            found = session.execute(query).one_or_none()
            if found is None:
                raise NotFoundError(f"run {run_id} does not exist")
            return run_record(*found)

    def list_runs(self, experiment: str | None = None) -> list[RunRecord]:
        """Runs oldest first, of one experiment or of all."""
        query = self._runs_query().order_by(SqlRun.id)
        if experiment is not None:
            query = query.where(SqlExperiment.name == experiment)
        with self.session_scope() as session:
            return [run_record(*found) for found in session.execute(query)]

    def overlapping_runs(self, run_id: int) -> list[RunRecord]:
        """Other runs on this run's host that ran while it did (a RUNNING one counts while
        its heartbeat is fresh): a hidden variable, since their loads share the CPUs."""
        with self.session_scope() as session:
            me = require_run(session, run_id)
            started, host = me.started_at, me.hostname
            query = (
                self._runs_query()
                .where(SqlRun.hostname == host, SqlRun.id != run_id)
                .where(
                    or_(
                        SqlRun.finished_at > started,
                        and_(SqlRun.finished_at.is_(None), SqlRun.heartbeat_at > started),
                    )
                )
                .order_by(SqlRun.id)
            )
            return [run_record(*found) for found in session.execute(query)]

    @staticmethod
    def _runs_query() -> Select[SqlRun, str, str]:
        # One joined query instead of two lazy loads per run.
        return (
            select(SqlRun, SqlExperiment.name, SqlConfig.config_hash)
            .join(SqlRun.experiment)
            .join(SqlRun.config)
        )

    def mark_crashed(
        self,
        stale_after_s: float,
        *,
        pid_alive: Callable[[int, datetime], bool] | None = None,
    ) -> list[int]:
        """Mark RUNNING runs silent for more than `stale_after_s` as CRASHED; their ids.

        With `pid_alive(pid, started_at)`, runs started on this host are judged by their
        process instead: one whose process is gone is marked at once, and one whose process
        is alive never is, however long its heartbeat has been silent.
        """
        cutoff = utcnow() - timedelta(seconds=stale_after_s)
        query = (
            select(SqlRun)
            .where(SqlRun.status == RunStatus.RUNNING.value)
            .order_by(SqlRun.id)
            # PostgreSQL: a heartbeat arriving now waits for this decision, not races it.
            .with_for_update()
        )
        host = socket.gethostname()
        with self.session_scope() as session:
            crashed = []
            for run in session.scalars(query):
                stale = run.heartbeat_at < cutoff
                if pid_alive is not None and run.hostname == host:
                    # On this host the process table knows better than a heartbeat: a live
                    # run may be silent for minutes (a store outage, a stopped terminal).
                    if run.pid == os.getpid() or pid_alive(run.pid, run.started_at):
                        continue
                    stale = True
                if not stale:
                    continue
                run.status = RunStatus.CRASHED.value
                if run.error_message is None:
                    run.error_message = (
                        f"no heartbeat since {run.heartbeat_at.isoformat()} from "
                        f"{run.hostname} pid {run.pid}; the process is presumed dead"
                    )
                crashed.append(run.id)
            return crashed
