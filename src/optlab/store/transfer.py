"""Runs in and out of the database as bundles, and a run's final write in one transaction.

`Store` methods (a mixin, like `MeasurementsMixin`): `export_run(s)` builds `RunBundle`s;
`import_bundle(s)` stores them idempotently by run uid; `complete_run` is what a runner calls
at the end of a measurement, safe to retry.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from optlab.config.canonical import canonical_json
from optlab.errors import RefusedError, StoreError
from optlab.store.bundle import (
    FINAL_FIELDS,
    TIMESTAMP_FIELDS,
    ImportResult,
    RunBundle,
    parse_timestamp,
)
from optlab.store.convert import resource_sample, stage_stats, window_stats
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
    utcnow,
)
from optlab.store.records import (
    TERMINAL_STATUSES,
    ResourceSample,
    RunErrorCount,
    RunStatus,
    StageStatsRow,
    WindowStats,
)

# Bundle key -> runs column, for every run field a bundle carries besides uid and ids.
_RUN_COLUMNS = {
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
    "requests": "requests",
    "errors": "errors",
    "qps": "qps",
    "summary": "summary_json",
    "error_message": "error_message",
}
_CONFIG_FIELDS = ("variable", "parent_config_hash", "source_path", "source_hash")
# A run stored in one of these is final: importing it again changes nothing.
_FINAL_STATUSES = {RunStatus.FINISHED, RunStatus.FAILED, RunStatus.KILLED}
_INCOMPLETE_STATUSES = {RunStatus.RUNNING, RunStatus.CRASHED}


class _Rehearsal(Exception):
    """Raised to roll back a rehearsed import."""


def _run_json(row: SqlRun) -> dict[str, Any]:
    value: dict[str, Any] = {
        "uid": row.uid,
        "id": row.id,
        "experiment": row.experiment.name,
        "config_hash": row.config.config_hash,
    }
    for key, column in _RUN_COLUMNS.items():
        value[key] = getattr(row, column)
    for key in TIMESTAMP_FIELDS:
        value[key] = None if value[key] is None else value[key].isoformat()
    return value


def _column_values(run: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    values = {}
    for key in keys:
        value = run.get(key)
        if key in TIMESTAMP_FIELDS and value is not None:
            value = parse_timestamp(value, f"run.{key}")
        values[_RUN_COLUMNS[key]] = list(value or ()) if key == "reasons" else value
    return values


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


def _fingerprint_hash(fingerprint: dict[str, Any]) -> str:
    # The same hash Store.record_environment keys environments by.
    return hashlib.sha256(canonical_json(fingerprint).encode()).hexdigest()


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
            return RunBundle(
                experiments=tuple(self._chain_json(session, run)),
                environment=environment,
                run=_run_json(run),
                stage_stats=tuple(stage_stats(row) for row in stages),
                windows=tuple(window_stats(row) for row in windows),
                samples=tuple(resource_sample(row) for row in samples),
                errors=tuple(RunErrorCount(e.error_type, e.count, e.example) for e in errors),
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
        stage_stats: Sequence[StageStatsRow],
        windows: Sequence[WindowStats],
        samples: Sequence[ResourceSample],
        run_errors: Sequence[RunErrorCount],
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
        """Store a run's measurements and final fields in ONE transaction.

        The measurements replace whatever the run has stored (the 5 s flushes, a failed
        earlier attempt), so a retry after any failure stores the same thing; pass EVERY
        window and sample of the run. A stored window or sample missing from them is refused
        (ValueError) rather than deleted. `errors` is the error count as in `finish_run`;
        `run_errors` the errors by type.
        """
        final = {
            "status": str(status),
            "valid": valid,
            "reasons": list(reasons),
            "requests": requests,
            "errors": errors,
            "qps": qps,
            "summary": summary,
            "warmup_s": warmup_s,
            "duration_s": duration_s,
            "error_message": error_message,
        }
        if final["status"] not in TERMINAL_STATUSES:
            allowed = sorted(TERMINAL_STATUSES)
            raise ValueError(f"a run finishes as one of {allowed}, not {status!r}")
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
            for key, value in _column_values(final, FINAL_FIELDS).items():
                setattr(run, key, value)
            run.finished_at = run.heartbeat_at = utcnow()

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

    # -- import ---------------------------------------------------------------------------

    def import_bundle(self, bundle: RunBundle) -> ImportResult:
        """Store one run, in one transaction, idempotently by its uid.

        Already stored FINISHED, FAILED or KILLED: skipped. Stored RUNNING or CRASHED (its
        final write failed) and final in the bundle: completed from it (measurements
        replaced, final fields set). New: inserted with its experiments (baseline first,
        created when missing) and environment. Refused (RefusedError, nothing written): an
        experiment name stored with another parent or without the run's config.
        """
        try:
            with self.session_scope() as session:
                return self._import(session, bundle)
        except IntegrityError:
            # Another process stored this run, an experiment or the environment at the same
            # moment; a second look finds them.
            with self.session_scope() as session:
                return self._import(session, bundle)

    def import_bundles(self, bundles: Sequence[RunBundle]) -> list[ImportResult]:
        """Import each bundle in its own transaction, after a rehearsal of all of them in one
        rolled-back transaction: a refusal anywhere writes nothing at all."""
        try:
            with self.session_scope() as session:
                for bundle in bundles:
                    self._import(session, bundle, rehearsal=True)
                raise _Rehearsal
        except _Rehearsal:
            pass
        return [self.import_bundle(bundle) for bundle in bundles]

    def _import(
        self, session: Session, bundle: RunBundle, *, rehearsal: bool = False
    ) -> ImportResult:
        """A rehearsal makes only the checks that can refuse, and the experiments that later
        bundles' checks need; it inserts no run (a PostgreSQL id would be used up)."""
        existing = session.scalar(select(SqlRun).where(SqlRun.uid == bundle.uid))
        if existing is not None:
            return self._import_existing(session, existing, bundle, rehearsal=rehearsal)
        if bundle.run["status"] == RunStatus.RUNNING:
            raise RefusedError(
                f"run {bundle.uid} of {bundle.experiment} was still RUNNING when it was "
                "exported: its measurements are partial",
                hint="export it again once it has finished (or has been marked CRASHED)",
            )
        config = self._ensure_chain(session, bundle)
        if rehearsal:
            return ImportResult(bundle.uid, None, "imported", bundle.experiment)
        row = SqlRun(
            uid=bundle.uid,
            experiment_id=config.experiment_id,
            config_id=config.id,
            environment_id=self._ensure_environment(session, bundle.environment),
            **_column_values(bundle.run, list(_RUN_COLUMNS)),
        )
        session.add(row)
        session.flush()
        self._replace_from(session, row.id, bundle)
        return ImportResult(bundle.uid, row.id, "imported", bundle.experiment)

    def _import_existing(
        self, session: Session, row: SqlRun, bundle: RunBundle, *, rehearsal: bool
    ) -> ImportResult:
        stored = (row.experiment.name, row.config.config_hash)
        if stored != (bundle.experiment, bundle.run["config_hash"]):
            raise RefusedError(
                f"run {bundle.uid} is stored in {self.url} as a run of {stored[0]} (config "
                f"{stored[1][:12]}), but the bundle has it as {bundle.experiment} (config "
                f"{str(bundle.run['config_hash'])[:12]})",
                hint="the bundle does not belong with this database; import it into another",
            )
        if row.status in _INCOMPLETE_STATUSES and bundle.run["status"] in _FINAL_STATUSES:
            if rehearsal:
                return ImportResult(bundle.uid, row.id, "completed", bundle.experiment)
            self._replace_from(session, row.id, bundle)
            keys = [*FINAL_FIELDS, "finished_at", "heartbeat_at"]
            for key, value in _column_values(bundle.run, keys).items():
                setattr(row, key, value)
            return ImportResult(bundle.uid, row.id, "completed", bundle.experiment)
        return ImportResult(bundle.uid, row.id, "skipped", bundle.experiment)

    @staticmethod
    def _replace_from(session: Session, run_id: int, bundle: RunBundle) -> None:
        replace_measurements(
            session,
            run_id,
            stage_stats=bundle.stage_stats,
            windows=bundle.windows,
            samples=bundle.samples,
            errors=bundle.errors,
        )

    def _ensure_chain(self, session: Session, bundle: RunBundle) -> SqlConfig:
        """The stored config of the bundle's run, creating missing experiments and configs
        baseline first; refuses a name stored with another parent or without the config."""
        parent: SqlExperiment | None = None
        config: SqlConfig | None = None
        for item in bundle.experiments:
            name = item["name"]
            row = session.scalar(select(SqlExperiment).where(SqlExperiment.name == name))
            if row is None:
                row = SqlExperiment(
                    name=name,
                    kind=item["kind"],
                    parent=parent,
                    description=item.get("description"),
                    hypothesis=item.get("hypothesis"),
                )
                session.add(row)
                session.flush()
                config = SqlConfig(
                    experiment=row,
                    config_json=item["config"],
                    config_hash=item["config_hash"],
                    change_json=item.get("change"),
                    variable=item.get("variable"),
                    parent_config_hash=item.get("parent_config_hash"),
                    source_path=item.get("source_path") or "",
                    source_hash=item.get("source_hash") or "",
                )
                session.add(config)
                row.current_config = config
                session.flush()
            else:
                self._refuse_other_parent(row, item, bundle)
                config = session.scalar(
                    select(SqlConfig).where(
                        SqlConfig.experiment_id == row.id,
                        SqlConfig.config_hash == item["config_hash"],
                    )
                )
                if config is None:
                    stored = row.current_config.config_hash if row.current_config else "none"
                    raise RefusedError(
                        f"experiment {name!r} is stored in {self.url} with config "
                        f"{stored[:12]}, but run {bundle.uid} of {bundle.experiment} used "
                        f"config {item['config_hash'][:12]} under that name: nothing was "
                        "imported",
                        hint="rename the experiment or import into another database",
                    )
            parent = row
        assert config is not None  # bundles have at least their baseline
        return config

    def _refuse_other_parent(
        self, row: SqlExperiment, item: dict[str, Any], bundle: RunBundle
    ) -> None:
        stored = None if row.parent is None else row.parent.name
        if stored != item.get("parent"):
            raise RefusedError(
                f"experiment {row.name!r} is stored in {self.url} with parent {stored!r}, but "
                f"run {bundle.uid} of {bundle.experiment} has it with parent "
                f"{item.get('parent')!r}: nothing was imported",
                hint="rename the experiment or import into another database",
            )

    @staticmethod
    def _ensure_environment(session: Session, environment: dict[str, Any] | None) -> int | None:
        if environment is None:
            return None
        fingerprint = environment["fingerprint"]
        fingerprint_hash = _fingerprint_hash(fingerprint)
        query = select(SqlEnvironment.id).where(SqlEnvironment.fingerprint_hash == fingerprint_hash)
        existing = session.scalar(query)
        if existing is not None:
            return existing
        row = SqlEnvironment(
            fingerprint_hash=fingerprint_hash,
            material_hash=environment["material_hash"],
            fingerprint_json=fingerprint,
        )
        session.add(row)
        session.flush()
        return row.id
