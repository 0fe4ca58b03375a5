"""Knob sweeps in the database: created RUNNING with their request and plan, a cell stored
per arm measured in a block (a run, or a capacity sweep), finished once with the result;
read back with their cells. A RUNNING knob sweep whose process is gone is CRASHED, and an
unfinished one is resumed by asking the same question again (`optlab.knobs.search`).

`Store` methods (a mixin, like `SweepsMixin`); they rely only on its `session_scope`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from optlab.errors import NotFoundError
from optlab.store.models import (
    SqlConfig,
    SqlExperiment,
    SqlKnobCell,
    SqlKnobSweep,
    new_uid,
    utcnow,
)
from optlab.store.records import KnobCellRecord, KnobSweepRecord, RunStatus
from optlab.store.runs import experiment_row
from optlab.store.sweeps import crash_orphans, finish_owned

__all__ = ["KnobSweepsMixin"]


def _record(
    session: Session, row: SqlKnobSweep, experiment: str, config_hash: str
) -> KnobSweepRecord:
    cells = session.scalars(
        select(SqlKnobCell)
        .where(SqlKnobCell.knob_sweep_id == row.id)
        .order_by(SqlKnobCell.block, SqlKnobCell.position)
    )
    return KnobSweepRecord(
        id=row.id,
        uid=row.uid,
        experiment=experiment,
        config_hash=config_hash,
        knob=row.knob,
        metric=row.metric,
        status=row.status,
        spec=row.spec_json,
        hostname=row.hostname,
        pid=row.pid,
        started_at=row.started_at,
        finished_at=row.finished_at,
        result=row.result_json,
        measured_s=row.measured_s,
        error_message=row.error_message,
        cells=tuple(
            KnobCellRecord(c.block, c.arm, c.position, c.run_id, c.sweep_id, c.measured_s)
            for c in cells
        ),
    )


def _query() -> Any:
    return (
        select(SqlKnobSweep, SqlExperiment.name, SqlConfig.config_hash)
        .join(SqlKnobSweep.experiment)
        .join(SqlKnobSweep.config)
    )


class KnobSweepsMixin:
    """Knob-sweep lifecycle methods of `Store`."""

    def session_scope(self) -> AbstractContextManager[Session]:
        raise NotImplementedError

    def create_knob_sweep(
        self, *, experiment: str, knob: str, metric: str, spec: dict[str, Any]
    ) -> int:
        """A RUNNING knob sweep of the experiment's current config by this process."""
        with self.session_scope() as session:
            row = experiment_row(session, experiment)
            if row.current_config_id is None:
                raise NotFoundError(f"experiment {experiment!r} has no stored config")
            sweep = SqlKnobSweep(
                uid=new_uid(),
                experiment_id=row.id,
                config_id=row.current_config_id,
                knob=knob,
                metric=metric,
                status=RunStatus.RUNNING.value,
                spec_json=spec,
                hostname=socket.gethostname(),
                pid=os.getpid(),
                started_at=utcnow(),
            )
            session.add(sweep)
            session.flush()
            return sweep.id

    def resume_knob_sweep(self, knob_sweep_id: int) -> None:
        """An unfinished knob sweep taken up again by this process."""
        with self.session_scope() as session:
            sweep = session.get(SqlKnobSweep, knob_sweep_id)
            if sweep is None:
                raise NotFoundError(f"knob sweep {knob_sweep_id} does not exist")
            sweep.status = RunStatus.RUNNING.value
            sweep.hostname = socket.gethostname()
            sweep.pid = os.getpid()
            sweep.started_at = utcnow()
            sweep.finished_at = None
            sweep.error_message = None

    def set_knob_cell(
        self,
        knob_sweep_id: int,
        *,
        block: int,
        arm: int,
        position: int,
        run_id: int | None,
        sweep_id: int | None,
        measured_s: float,
    ) -> None:
        """The cell's run (or sweep): a cell measured again points at the new one."""
        with self.session_scope() as session:
            cell = session.scalar(
                select(SqlKnobCell).where(
                    SqlKnobCell.knob_sweep_id == knob_sweep_id,
                    SqlKnobCell.block == block,
                    SqlKnobCell.arm == arm,
                )
            )
            if cell is None:
                cell = SqlKnobCell(knob_sweep_id=knob_sweep_id, block=block, arm=arm)
                session.add(cell)
            cell.position = position
            cell.run_id = run_id
            cell.sweep_id = sweep_id
            cell.measured_s = measured_s

    def finish_knob_sweep(
        self,
        knob_sweep_id: int,
        *,
        status: str,
        result: dict[str, Any] | None,
        measured_s: float,
        error: str | None = None,
    ) -> None:
        with self.session_scope() as session:
            finish_owned(
                session,
                SqlKnobSweep,
                knob_sweep_id,
                status=status,
                result=result,
                measured_s=measured_s,
                error=error,
            )

    def get_knob_sweep(self, knob_sweep_id: int) -> KnobSweepRecord:
        with self.session_scope() as session:
            found = session.execute(_query().where(SqlKnobSweep.id == knob_sweep_id)).one_or_none()
            if found is None:
                raise NotFoundError(
                    f"knob sweep {knob_sweep_id} does not exist",
                    hint="list them with `optlab knob-sweeps`",
                )
            return _record(session, *found)

    def list_knob_sweeps(self, experiment: str | None = None) -> list[KnobSweepRecord]:
        """Knob sweeps oldest first, of one (parent) experiment or of all."""
        query = _query().order_by(SqlKnobSweep.id)
        if experiment is not None:
            query = query.where(SqlExperiment.name == experiment)
        with self.session_scope() as session:
            return [_record(session, *found) for found in session.execute(query).all()]

    def mark_knob_sweeps_crashed(self, pid_alive: Callable[[int, datetime], bool]) -> list[int]:
        """RUNNING knob sweeps of this host whose process is gone become CRASHED (their cells
        stay, and asking the same question again resumes them)."""
        with self.session_scope() as session:
            return crash_orphans(session, SqlKnobSweep, pid_alive)
