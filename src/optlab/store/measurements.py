"""Measurements of a run: stage latency, per-second windows, resource samples, errors.

Kept apart from the run lifecycle in `repository.py` because it is the bulk of the data and
of the code: these tables are written once per run and read by reports.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import asdict
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.orm import Session

from optlab.errors import NotFoundError
from optlab.store.convert import gpu_dicts, resource_sample, stage_stats, window_stats
from optlab.store.models import (
    PHASES,
    SqlResourceSample,
    SqlRun,
    SqlRunError,
    SqlStageStats,
    SqlWindow,
)
from optlab.store.records import (
    LLM_WINDOW_FIELDS,
    ResourceSample,
    RunErrorCount,
    StageStatsRow,
    WindowStats,
)


def require_run(session: Session, run_id: int) -> SqlRun:
    row = session.get(SqlRun, run_id)
    if row is None:
        raise NotFoundError(f"run {run_id} does not exist")
    return row


def _check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")


def _sample_values(samples: Sequence[ResourceSample]) -> list[dict[str, Any]]:
    values = []
    for sample in samples:
        _check_phase(sample.phase)
        value = asdict(sample)
        del value["cpu_per_core"], value["gpus"]
        value["cpu_per_core_json"] = (
            None if sample.cpu_per_core is None else list(sample.cpu_per_core)
        )
        value["gpu_json"] = gpu_dicts(sample.gpus)
        values.append(value)
    return values


def replace_measurements(
    session: Session,
    run_id: int,
    *,
    stage_stats: Sequence[StageStatsRow],
    windows: Sequence[WindowStats],
    samples: Sequence[ResourceSample],
    errors: Sequence[RunErrorCount],
) -> None:
    """Make these the run's measurements, in the caller's transaction.

    Delete and insert rather than merge: the result is exactly what was given however much a
    failed attempt (or the 5 s flushes) stored before, and resource samples have no key to
    merge on.
    """
    for phase in [row.phase for row in stage_stats] + [window.phase for window in windows]:
        _check_phase(phase)
    for model in (SqlStageStats, SqlWindow, SqlResourceSample, SqlRunError):
        session.execute(delete(model).where(model.run_id == run_id))
    tables: list[tuple[type[Any], list[dict[str, Any]]]] = [
        (SqlStageStats, [asdict(row) for row in stage_stats]),
        (SqlWindow, [asdict(window) for window in windows]),
        (SqlResourceSample, _sample_values(samples)),
        (SqlRunError, [asdict(error) for error in errors]),
    ]
    for model, values in tables:
        if values:
            session.execute(insert(model), [{**value, "run_id": run_id} for value in values])


class MeasurementsMixin:
    """Measurement methods of `Store`; they rely only on its `session_scope`."""

    def session_scope(self) -> AbstractContextManager[Session]:
        raise NotImplementedError

    def add_stage_stats(self, run_id: int, rows: Sequence[StageStatsRow]) -> None:
        for row in rows:
            _check_phase(row.phase)
        self._insert(run_id, SqlStageStats, [asdict(row) for row in rows])

    def add_windows(self, run_id: int, windows: Sequence[WindowStats]) -> None:
        for window in windows:
            _check_phase(window.phase)
        self._insert(run_id, SqlWindow, [asdict(window) for window in windows])

    def add_resource_samples(self, run_id: int, samples: Sequence[ResourceSample]) -> None:
        self._insert(run_id, SqlResourceSample, _sample_values(samples))

    def add_run_errors(self, run_id: int, errors: Sequence[RunErrorCount]) -> None:
        self._insert(run_id, SqlRunError, [asdict(error) for error in errors])

    def _insert(self, run_id: int, model: type[Any], values: list[dict[str, Any]]) -> None:
        with self.session_scope() as session:
            require_run(session, run_id)  # a clear NotFoundError, not a foreign key error
            if values:
                # One multi-row INSERT: a 15-minute run has about a thousand windows.
                session.execute(insert(model), [{**value, "run_id": run_id} for value in values])

    def get_stage_stats(self, run_id: int, phase: str | None = None) -> list[StageStatsRow]:
        query = select(SqlStageStats).where(SqlStageStats.run_id == run_id)
        if phase is not None:
            query = query.where(SqlStageStats.phase == phase)
        with self.session_scope() as session:
            rows = session.scalars(query.order_by(SqlStageStats.id))
            return [stage_stats(row) for row in rows]

    def get_windows(self, run_id: int, phase: str | None = None) -> list[WindowStats]:
        query = select(SqlWindow).where(SqlWindow.run_id == run_id)
        if phase is not None:
            query = query.where(SqlWindow.phase == phase)
        # "warmup" sorts after "measure": descending phase puts the windows in time order.
        query = query.order_by(SqlWindow.phase.desc(), SqlWindow.t_s)
        with self.session_scope() as session:
            rows = session.scalars(query)
            return [window_stats(row) for row in rows]

    def window_series(
        self, run_ids: Sequence[int], fields: Sequence[str], phase: str = "measure"
    ) -> dict[int, dict[str, list[float]]]:
        """Chosen per-second fields of many runs in one query, in time order, None values
        left out: what statistics over many runs need, without building a row object per
        second (that made the table of a 10,000-run database take seconds)."""
        allowed = {
            "completed",
            "errors",
            "qps",
            "p50_ms",
            "p99_ms",
            "send_lag_p99_ms",
            *LLM_WINDOW_FIELDS,
        }
        unknown = set(fields) - allowed
        if unknown:
            raise ValueError(f"unknown window fields {sorted(unknown)}; use {sorted(allowed)}")
        series: dict[int, dict[str, list[float]]] = {
            run_id: {field: [] for field in fields} for run_id in run_ids
        }
        if not run_ids:
            return series
        columns = [getattr(SqlWindow, field) for field in fields]
        query = (
            select(SqlWindow.run_id, *columns)
            .where(SqlWindow.run_id.in_(list(run_ids)), SqlWindow.phase == phase)
            .order_by(SqlWindow.run_id, SqlWindow.t_s)
        )
        with self.session_scope() as session:
            rows = session.execute(query).all()
        # Columns per run, transposed in C by zip: a Python loop per value cost 0.4 s for
        # 200 runs of 600 windows.
        for run_id, chunk in itertools.groupby(rows, key=operator.itemgetter(0)):
            columns = list(zip(*chunk, strict=True))
            for index, field in enumerate(fields, start=1):
                series[run_id][field] = [v for v in columns[index] if v is not None]
        return series

    def get_resource_samples(self, run_id: int, phase: str | None = None) -> list[ResourceSample]:
        query = select(SqlResourceSample).where(SqlResourceSample.run_id == run_id)
        if phase is not None:
            query = query.where(SqlResourceSample.phase == phase)
        query = query.order_by(SqlResourceSample.phase.desc(), SqlResourceSample.t_s)
        with self.session_scope() as session:
            rows = session.scalars(query)
            return [resource_sample(row) for row in rows]

    def get_run_errors(self, run_id: int) -> list[RunErrorCount]:
        query = select(SqlRunError).where(SqlRunError.run_id == run_id)
        with self.session_scope() as session:
            rows = session.scalars(query.order_by(SqlRunError.count.desc(), SqlRunError.id))
            return [
                RunErrorCount(error_type=row.error_type, count=row.count, example=row.example)
                for row in rows
            ]
