"""Runs into the database from bundles, idempotently by run uid.

`Store` methods (a mixin, like `TransferMixin`, which exports): `import_bundle(s)` stores a
bundle's run with its experiments and environment, completes a run whose final write failed,
and skips a run already stored.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from optlab.errors import RefusedError
from optlab.store import bundle_rules as rules
from optlab.store.bundle import TIMESTAMP_FIELDS, ImportResult, RunBundle, parse_timestamp
from optlab.store.convert import summary_json
from optlab.store.measurements import replace_measurements
from optlab.store.models import SqlConfig, SqlEnvironment, SqlExperiment, SqlRun
from optlab.store.reasons import reasons_of
from optlab.store.records import RunStatus
from optlab.store.runs import write_final
from optlab.store.transfer import RUN_COLUMNS

# A run stored in one of these is final: importing it again changes nothing.
_FINAL_STATUSES = {RunStatus.FINISHED, RunStatus.FAILED, RunStatus.KILLED}
_INCOMPLETE_STATUSES = {RunStatus.RUNNING, RunStatus.CRASHED}


class _Rehearsal(Exception):
    """Raised to roll back a rehearsed import."""


def _column_values(run: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    values = {}
    for key in keys:
        value = run.get(key)
        if key in TIMESTAMP_FIELDS and value is not None:
            value = parse_timestamp(value, f"run.{key}")
        if key == "reasons":
            value = list(value or ())
        elif key == "reason_codes":  # absent from older bundles: every reason is `other`
            value = [r.code for r in reasons_of(run.get("reasons") or (), value or ())]
        values[RUN_COLUMNS[key]] = value
    return values


class ImportMixin:
    """Import methods of `Store`; they rely only on its `session_scope` and `url`."""

    def session_scope(self) -> AbstractContextManager[Session]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        raise NotImplementedError

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
            **_column_values(bundle.run, list(RUN_COLUMNS)),
            summary_json=summary_json(bundle.summary, bundle.stage_stats, bundle.errors),
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
            write_final(row, bundle.final, bundle.stage_stats, bundle.errors)
            for key, value in _column_values(bundle.run, ("finished_at", "heartbeat_at")).items():
                setattr(row, key, value)  # as the bundle has them, not now
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
        fingerprint_hash = rules.fingerprint_hash(fingerprint)
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
