"""Runs out of the database as bundles, and a run's final write in one transaction.

`Store` methods (a mixin, like `MeasurementsMixin`): `export_run(s)` builds `RunBundle`s
(`store.imports` stores them); `complete_run` is what a runner calls at the end of a
measurement, safe to retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from optlab.errors import StoreError
from optlab.store.bundle import TIMESTAMP_FIELDS, RunBundle
from optlab.store.convert import (
    error_counts,
    measured_latency,
    resource_sample,
    run_summary,
    stage_stats,
    window_stats,
)
from optlab.store.measurements import replace_measurements, require_run
from optlab.store.models import (
    SqlConfig,
    SqlEnvironment,
    SqlExperiment,
    SqlResourceSample,
    SqlRun,
    SqlRunError,
    SqlStageStats,
    SqlWindow,
)
from optlab.store.records import (
    ResourceSample,
    RunErrorCount,
    RunFinal,
    StageStatsRow,
    WindowStats,
)
from optlab.store.runs import write_final
from optlab.store.summary import RunSummary

# Bundle key -> runs column, for every run field a bundle carries besides uid, ids and the
# summary (which the store writes apart: `store.summary`).
RUN_COLUMNS = {
    "status": "status",
    "protocol_name": "protocol_name",
    "protocol": "protocol_json",
    "provisional": "provisional",
    "repeat": "repeat",
    "code_identity": "code_identity_json",
    "git_commit": "git_commit",
    "git_dirty": "git_dirty",
    "hostname": "hostname",
    "pid": "pid",
    "started_at": "started_at",
    "heartbeat_at": "heartbeat_at",
    "finished_at": "finished_at",
    "warmup_s": "warmup_s",
    "duration_s": "duration_s",
    "valid": "valid",
    "reasons": "reasons_json",
    "reason_codes": "reason_codes_json",
    "requests": "requests",
    "errors": "errors",
    "qps": "qps",
    "error_message": "error_message",
}
_CONFIG_FIELDS = ("variable", "parent_config_hash", "source_path", "source_hash")


def _run_json(row: SqlRun, summary: RunSummary | None) -> dict[str, Any]:
    value: dict[str, Any] = {
        "uid": row.uid,
        "id": row.id,
        "experiment": row.experiment.name,
        "config_hash": row.config.config_hash,
    }
    for key, column in RUN_COLUMNS.items():
        value[key] = getattr(row, column)
    value["summary"] = None if summary is None else summary.to_bundle()
    for key in TIMESTAMP_FIELDS:
        value[key] = None if value[key] is None else value[key].isoformat()
    return value


def _experiment_json(row: SqlExperiment, config: SqlConfig) -> dict[str, Any]:
    return {
        "name": row.name,
        "kind": row.kind,
        "parent": None if row.parent is None else row.parent.name,
        "description": row.description,
        "hypothesis": row.hypothesis,
        "config": config.config_json,
        "config_hash": config.config_hash,
        "change": config.change_json,
        **{key: getattr(config, key) for key in _CONFIG_FIELDS},
    }


class TransferMixin:
    """Bundle methods of `Store`; they rely only on its `session_scope` and `url`."""

    def session_scope(self) -> AbstractContextManager[Session]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        raise NotImplementedError

    # -- export ---------------------------------------------------------------------------

    def export_run(self, run_id: int) -> RunBundle:
        """The run as a bundle, read in one transaction (any status, RUNNING included)."""
        with self.session_scope() as session:
            run = require_run(session, run_id)
            environment = None
            if run.environment_id is not None:
                env = session.get(SqlEnvironment, run.environment_id)
                assert env is not None  # a foreign key
                environment = {
                    "fingerprint": env.fingerprint_json,
                    "fingerprint_hash": env.fingerprint_hash,
                    "material_hash": env.material_hash,
                }
            by_run: dict[type[Any], Any] = {
                model: select(model).where(model.run_id == run_id)
                for model in (SqlStageStats, SqlWindow, SqlResourceSample, SqlRunError)
            }
            # The getters' orders, so that a bundle and the database read back alike.
            stages = session.scalars(by_run[SqlStageStats].order_by(SqlStageStats.id))
            windows = session.scalars(
                by_run[SqlWindow].order_by(SqlWindow.phase.desc(), SqlWindow.t_s)
            )
            samples = session.scalars(
                by_run[SqlResourceSample].order_by(
                    SqlResourceSample.phase.desc(), SqlResourceSample.t_s
                )
            )
            errors = session.scalars(
                by_run[SqlRunError].order_by(SqlRunError.count.desc(), SqlRunError.id)
            )
            stage_rows = tuple(stage_stats(row) for row in stages)
            error_rows = tuple(RunErrorCount(e.error_type, e.count, e.example) for e in errors)
            summary = run_summary(
                run, run.experiment.name, measured_latency(stage_rows), error_counts(error_rows)
            )
            return RunBundle(
                experiments=tuple(self._chain_json(session, run)),
                environment=environment,
                run=_run_json(run, summary),
                stage_stats=stage_rows,
                windows=tuple(window_stats(row) for row in windows),
                samples=tuple(resource_sample(row) for row in samples),
                errors=error_rows,
            )

    def export_runs(self, run_ids: Sequence[int]) -> list[RunBundle]:
        return [self.export_run(run_id) for run_id in run_ids]

    @staticmethod
    def _chain_json(session: Session, run: SqlRun) -> list[dict[str, Any]]:
        """The run's experiments, baseline first, each with the config the chain used: the
        run's own, then for each parent the config its child was resolved against."""
        chain = []
        experiment: SqlExperiment | None = run.experiment
        config: SqlConfig | None = run.config
        seen: set[int] = set()
        while experiment is not None and config is not None:
            if experiment.id in seen:
                raise StoreError(f"experiment {experiment.name!r} is its own ancestor")
            seen.add(experiment.id)
            chain.append(_experiment_json(experiment, config))
            parent = experiment.parent
            if parent is None:
                break
            wanted = config.parent_config_hash
            config = (
                session.scalar(
                    select(SqlConfig).where(
                        SqlConfig.experiment_id == parent.id, SqlConfig.config_hash == wanted
                    )
                )
                if wanted is not None
                else None
            ) or parent.current_config
            if config is None:
                raise StoreError(f"experiment {parent.name!r} has no stored config to export")
            experiment = parent
        chain.reverse()
        return chain

    # -- the end of a measurement -------------------------------------------------------------

    def complete_run(
        self,
        run_id: int,
        *,
        final: RunFinal,
        stage_stats: Sequence[StageStatsRow],
        windows: Sequence[WindowStats],
        samples: Sequence[ResourceSample],
        run_errors: Sequence[RunErrorCount],
    ) -> None:
        """Store a run's measurements and final fields in ONE transaction.

        The measurements replace whatever the run has stored (the 5 s flushes, a failed
        earlier attempt), so a retry after any failure stores the same thing; pass EVERY
        window and sample of the run. A stored window or sample missing from them is refused
        (ValueError) rather than deleted. `run_errors`: the errors by type.
        """
        with self.session_scope() as session:
            run = require_run(session, run_id)
            self._refuse_dropping(session, run_id, windows, samples)
            replace_measurements(
                session,
                run_id,
                stage_stats=stage_stats,
                windows=windows,
                samples=samples,
                errors=run_errors,
            )
            write_final(run, final, stage_stats, run_errors)

    @staticmethod
    def _refuse_dropping(
        session: Session,
        run_id: int,
        windows: Sequence[WindowStats],
        samples: Sequence[ResourceSample],
    ) -> None:
        # Replacing with a partial list would silently lose measured seconds.
        for model, given in (
            (SqlWindow, {(w.phase, w.t_s) for w in windows}),
            (SqlResourceSample, {(s.phase, s.t_s) for s in samples}),
        ):
            query = select(model.phase, model.t_s).where(model.run_id == run_id)
            stored = {(phase, t_s) for phase, t_s in session.execute(query)}
            missing = stored - given
            if missing:
                raise ValueError(
                    f"complete_run({run_id}) lacks {len(missing)} {model.__tablename__} rows "
                    f"already stored (first: {min(missing)}); pass every one of the run's, "
                    "not only the unflushed ones"
                )
