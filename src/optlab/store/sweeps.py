"""Sweeps in the database: created RUNNING, a level added per measured (or reused) run,
finished once with the result; read back with their levels.

`Store` methods (a mixin, like `RunsMixin`); they rely only on its `session_scope`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session

from optlab.errors import NotFoundError
from optlab.store.models import (
    SqlConfig,
    SqlExperiment,
    SqlKnobSweep,
    SqlSweep,
    SqlSweepLevel,
    new_uid,
    utcnow,
)
from optlab.store.records import RunStatus, SweepLevelRecord, SweepRecord
from optlab.store.runs import experiment_row
from optlab.store.sweep_result import SweepResult

__all__ = ["SweepsMixin", "crash_orphans", "finish_owned"]


_Owned = TypeVar("_Owned", SqlSweep, SqlKnobSweep)


def crash_orphans(
    session: Session,
    table: type[_Owned],
    pid_alive: Callable[[int, datetime], bool],
) -> list[int]:
    """RUNNING records of `table` (sweeps, knob sweeps) started on this host by a process that
    is gone: CRASHED now, saying which; their ids."""
    host = socket.gethostname()
    crashed = []
    for row in session.scalars(select(table).where(table.status == RunStatus.RUNNING.value)):
        if row.hostname != host or row.pid == os.getpid() or pid_alive(row.pid, row.started_at):
            continue
        row.status = RunStatus.CRASHED.value
        row.finished_at = utcnow()
        row.error_message = f"pid {row.pid} on {host} is gone"
        crashed.append(row.id)
    return crashed


def finish_owned(
    session: Session,
    table: type[_Owned],
    row_id: int,
    *,
    status: str,
    result: dict[str, Any] | None,
    measured_s: float,
    error: str | None,
) -> None:
    """A record of `table` (a sweep, a knob sweep) ended: its status, result and seconds."""
    row = session.get(table, row_id)
    if row is None:
        noun = "sweep" if table is SqlSweep else "knob sweep"
        raise NotFoundError(f"{noun} {row_id} does not exist")
    row.status = status
    row.result_json = result
    row.measured_s = measured_s
    row.error_message = error
    row.finished_at = utcnow()


def _record(session: Session, row: SqlSweep, experiment: str, config_hash: str) -> SweepRecord:
    levels = session.scalars(
        select(SqlSweepLevel)
        .where(SqlSweepLevel.sweep_id == row.id)
        .order_by(SqlSweepLevel.position)
    )
    return SweepRecord(
        id=row.id,
        uid=row.uid,
        experiment=experiment,
        config_id=row.config_id,
        config_hash=config_hash,
        environment_id=row.environment_id,
        status=row.status,
        mode=row.mode,
        slo_percentile=row.slo_percentile,
        slo_ms=row.slo_ms,
        protocol=row.protocol_json,
        strategy=row.strategy_json,
        code_identity=row.code_identity_json,
        hostname=row.hostname,
        pid=row.pid,
        started_at=row.started_at,
        finished_at=row.finished_at,
        result=SweepResult.from_stored(row.result_json),
        measured_s=row.measured_s,
        error_message=row.error_message,
        levels=tuple(
            SweepLevelRecord(lv.position, lv.run_id, lv.mode, lv.load, lv.purpose, lv.reused)
            for lv in levels
        ),
        slo_json=row.slo_json,
    )


def _query() -> Any:
    return (
        select(SqlSweep, SqlExperiment.name, SqlConfig.config_hash)
        .join(SqlSweep.experiment)
        .join(SqlSweep.config)
    )


class SweepsMixin:
    """Sweep lifecycle methods of `Store`."""

    def session_scope(self) -> AbstractContextManager[Session]:
        raise NotImplementedError

    def create_sweep(
        self,
        *,
        experiment: str,
        mode: str,
        slo_percentile: str,
        slo_ms: float,
        protocol: dict[str, Any],
        strategy: dict[str, Any],
        environment_id: int | None,
        code_identity: dict[str, Any],
        slo_json: dict[str, Any] | None = None,
    ) -> int:
        """A RUNNING sweep of the experiment's current config by this process; `slo_json`
        is the whole SLO where it is more than the one percentile bound given."""
        with self.session_scope() as session:
            row = experiment_row(session, experiment)
            if row.current_config_id is None:
                raise NotFoundError(f"experiment {experiment!r} has no stored config")
            sweep = SqlSweep(
                uid=new_uid(),
                experiment_id=row.id,
                config_id=row.current_config_id,
                environment_id=environment_id,
                status=RunStatus.RUNNING.value,
                mode=mode,
                slo_percentile=slo_percentile,
                slo_ms=slo_ms,
                slo_json=slo_json,
                protocol_json=protocol,
                strategy_json=strategy,
                code_identity_json=code_identity,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                started_at=utcnow(),
            )
            session.add(sweep)
            session.flush()
            return sweep.id

    def add_sweep_level(
        self, sweep_id: int, position: int, run_id: int, mode: str, load: float, purpose: str
    ) -> None:
        """A run measured by an earlier sweep, reused as a level of this one."""
        with self.session_scope() as session:
            session.add(
                SqlSweepLevel(
                    sweep_id=sweep_id,
                    position=position,
                    run_id=run_id,
                    mode=mode,
                    load=load,
                    purpose=purpose,
                    reused=True,
                )
            )

    def relabel_level(self, sweep_id: int, position: int, purpose: str) -> None:
        """Say after the fact why a level was measured (a level too short to count)."""
        with self.session_scope() as session:
            row = session.scalar(
                select(SqlSweepLevel).where(
                    SqlSweepLevel.sweep_id == sweep_id, SqlSweepLevel.position == position
                )
            )
            if row is None:
                raise NotFoundError(f"sweep {sweep_id} has no level {position}")
            row.purpose = purpose

    def finish_sweep(
        self,
        sweep_id: int,
        *,
        status: str,
        result: SweepResult | None,
        measured_s: float,
        error: str | None = None,
    ) -> None:
        stored = None if result is None else result.stored_form()
        with self.session_scope() as session:
            finish_owned(
                session,
                SqlSweep,
                sweep_id,
                status=status,
                result=stored,
                measured_s=measured_s,
                error=error,
            )

    def get_sweep(self, sweep_id: int) -> SweepRecord:
        with self.session_scope() as session:
            found = session.execute(_query().where(SqlSweep.id == sweep_id)).one_or_none()
            if found is None:
                raise NotFoundError(
                    f"sweep {sweep_id} does not exist",
                    hint="list the sweeps with `optlab sweeps`",
                )
            return _record(session, *found)

    def list_sweeps(self, experiment: str | None = None) -> list[SweepRecord]:
        """Sweeps oldest first, of one experiment or of all."""
        query = _query().order_by(SqlSweep.id)
        if experiment is not None:
            query = query.where(SqlExperiment.name == experiment)
        with self.session_scope() as session:
            return [_record(session, *found) for found in session.execute(query).all()]

    def mark_sweeps_crashed(self, pid_alive: Callable[[int, datetime], bool]) -> list[int]:
        """RUNNING sweeps of this host whose process is gone become CRASHED (their finished
        levels stay, and a later sweep reuses them)."""
        with self.session_scope() as session:
            return crash_orphans(session, SqlSweep, pid_alive)
