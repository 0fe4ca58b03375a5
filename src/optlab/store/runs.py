"""A run's lifecycle in the database: created RUNNING, kept alive by heartbeats, finished once
(or marked CRASHED when its process is gone), and read back with its summary.

`Store` methods (a mixin, like `MeasurementsMixin`); they rely only on its `session_scope`.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Select, and_, exists, or_, select
from sqlalchemy.orm import Session

from optlab.errors import NotFoundError
from optlab.store.convert import (
    error_counts,
    run_record,
    run_summary,
    stage_stats,
    summary_json,
)
from optlab.store.measurements import require_run
from optlab.store.models import (
    SqlConfig,
    SqlExperiment,
    SqlRun,
    SqlRunError,
    SqlStageStats,
    SqlSweepLevel,
    new_uid,
    utcnow,
)
from optlab.store.records import (
    RunErrorCount,
    RunFinal,
    RunRecord,
    RunStatus,
    StageStatsRow,
    SweepLevelTag,
)
from optlab.store.summary import LatencyStats

# Runs whose summaries are read in one query each for their series and their errors; a
# bound keeps the IN list under every backend's limit on bound parameters.
_SUMMARY_BATCH = 500


def experiment_row(session: Session, name: str) -> SqlExperiment:
    row = session.scalar(select(SqlExperiment).where(SqlExperiment.name == name))
    if row is None:
        raise NotFoundError(
            f"experiment {name!r} is not in the database",
            hint="an experiment is stored when it is first run; check the name, or run "
            "its parent first",
        )
    return row


def write_final(
    run: SqlRun,
    final: RunFinal,
    stage_rows: Sequence[StageStatsRow],
    error_rows: Sequence[RunErrorCount],
) -> None:
    """Set a run's final fields, in the caller's transaction, from `final` and the
    measurement rows stored with it (its summary is stored apart from what they hold)."""
    run.status = final.status
    run.valid = final.valid
    run.reasons_json = list(final.reasons)
    run.reason_codes_json = list(final.reason_codes)
    run.requests = final.requests
    run.errors = final.errors
    run.qps = final.qps
    run.summary_json = summary_json(final.summary, stage_rows, error_rows)
    run.warmup_s = final.warmup_s
    run.duration_s = final.duration_s
    run.error_message = final.error_message
    run.finished_at = run.heartbeat_at = utcnow()


def _summary_parts(
    session: Session, run_ids: Sequence[int]
) -> tuple[dict[int, dict[str, LatencyStats]], dict[int, dict[str, int]]]:
    """Measure-phase series and error counts of these runs, by run id (no histograms)."""
    latency: dict[int, dict[str, LatencyStats]] = {run_id: {} for run_id in run_ids}
    errors: dict[int, list[RunErrorCount]] = {run_id: [] for run_id in run_ids}
    stats = SqlStageStats
    for start in range(0, len(run_ids), _SUMMARY_BATCH):
        chunk = list(run_ids[start : start + _SUMMARY_BATCH])
        series = select(
            stats.run_id,
            stats.stage,
            stats.count,
            stats.mean_ms,
            stats.p50_ms,
            stats.p95_ms,
            stats.p99_ms,
            stats.p999_ms,
            stats.max_ms,
        ).where(stats.run_id.in_(chunk), stats.phase == "measure")
        for run_id, stage, count, mean, p50, p95, p99, p999, most in session.execute(
            series.order_by(stats.run_id, stats.id)
        ):
            latency[run_id][stage] = LatencyStats(
                p50=p50, p95=p95, p99=p99, p999=p999, max=most, mean=mean, count=count
            )
        counted = select(SqlRunError.run_id, SqlRunError.error_type, SqlRunError.count).where(
            SqlRunError.run_id.in_(chunk)
        )
        for run_id, error_type, count in session.execute(counted):
            errors[run_id].append(RunErrorCount(error_type, count))
    return latency, {run_id: error_counts(found) for run_id, found in errors.items()}


def run_records(session: Session, found: Sequence[Any]) -> list[RunRecord]:
    """Records of (SqlRun, experiment name, config hash) rows, summaries included."""
    ids = [row.id for row, _, _ in found if row.summary_json is not None]
    latency, errors = _summary_parts(session, ids)
    return [
        run_record(
            row,
            experiment,
            config_hash,
            run_summary(row, experiment, latency.get(row.id, {}), errors.get(row.id, {})),
        )
        for row, experiment, config_hash in found
    ]


def runs_query() -> Select[SqlRun, str, str]:
    # One joined query instead of two lazy loads per run.
    return (
        select(SqlRun, SqlExperiment.name, SqlConfig.config_hash)
        .join(SqlRun.experiment)
        .join(SqlRun.config)
    )


class RunsMixin:
    """Run lifecycle methods of `Store`."""

    def session_scope(self) -> AbstractContextManager[Session]:
        raise NotImplementedError

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
        level: SweepLevelTag | None = None,
    ) -> int:
        """Start a RUNNING run of the experiment's current config by this process; with
        `level`, as that level of a sweep (both rows in one transaction)."""
        with self.session_scope() as session:
            row = experiment_row(session, experiment)
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
                reason_codes_json=[],
            )
            session.add(run)
            session.flush()
            if level is not None:
                session.add(
                    SqlSweepLevel(
                        sweep_id=level.sweep_id,
                        position=level.position,
                        run_id=run.id,
                        mode=level.mode,
                        load=level.load,
                        purpose=level.purpose,
                        reused=False,
                    )
                )
            return run.id

    def heartbeat(self, run_id: int) -> None:
        """Record that the run's process is alive (see `mark_crashed`)."""
        with self.session_scope() as session:
            require_run(session, run_id).heartbeat_at = utcnow()

    def finish_run(self, run_id: int, final: RunFinal) -> None:
        """Store a run's final fields beside the measurements it already has (a runner
        stores both at once with `complete_run`)."""
        with self.session_scope() as session:
            run = require_run(session, run_id)
            stages = session.scalars(select(SqlStageStats).where(SqlStageStats.run_id == run_id))
            errors = session.scalars(select(SqlRunError).where(SqlRunError.run_id == run_id))
            write_final(
                run,
                final,
                [stage_stats(row) for row in stages],
                [RunErrorCount(e.error_type, e.count) for e in errors],
            )

    def level_tags(self) -> dict[int, SweepLevelTag]:
        """Run id -> the sweep level that measured it (the first sweep's, for a level later
        sweeps reused)."""
        query = select(SqlSweepLevel).order_by(SqlSweepLevel.sweep_id.desc())
        with self.session_scope() as session:
            return {
                row.run_id: SweepLevelTag(
                    row.sweep_id, row.position, row.mode, row.load, row.purpose
                )
                for row in session.scalars(query)
            }

    def get_run(self, run_id: int) -> RunRecord:
        with self.session_scope() as session:
            found = session.execute(runs_query().where(SqlRun.id == run_id)).one_or_none()
            if found is None:
                raise NotFoundError(f"run {run_id} does not exist")
            return run_records(session, [found])[0]

    def list_runs(self, experiment: str | None = None, *, levels: bool = False) -> list[RunRecord]:
        """Runs oldest first, of one experiment or of all. A sweep's levels measure other
        loads than the experiment's own, so they are left out unless `levels`."""
        query = runs_query().order_by(SqlRun.id)
        if not levels:
            query = query.where(~exists().where(SqlSweepLevel.run_id == SqlRun.id))
        if experiment is not None:
            query = query.where(SqlExperiment.name == experiment)
        with self.session_scope() as session:
            return run_records(session, session.execute(query).all())

    def overlapping_runs(self, run_id: int) -> list[RunRecord]:
        """Other runs on this run's host that ran while it did (a RUNNING one counts while
        its heartbeat is fresh): a hidden variable, since their loads share the CPUs."""
        with self.session_scope() as session:
            me = require_run(session, run_id)
            started, host = me.started_at, me.hostname
            query = (
                runs_query()
                .where(SqlRun.hostname == host, SqlRun.id != run_id)
                .where(
                    or_(
                        SqlRun.finished_at > started,
                        and_(SqlRun.finished_at.is_(None), SqlRun.heartbeat_at > started),
                    )
                )
                .order_by(SqlRun.id)
            )
            return run_records(session, session.execute(query).all())

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
