"""Run bundles: runs with everything they need, as a versioned JSON-lines file (its format;
writing and reading files is `store.bundle_files`).

A bundle moves runs between databases (a laptop's SQLite and the team's PostgreSQL, a CI job's
artifact) and keeps a run whose final write failed: the runner saves it under
`.optlab/pending/` and the next writing command stores it. Runs keep their identity (`uid`)
across databases, so importing is idempotent.

File format (schema_version 1): line 1 is the header
`{"kind": "optlab-bundle", "schema_version", "created_at", "optlab_version", "source"}`
(`source`: the database URL it came from or was meant for, password masked); every further
line is one run: `{"kind": "run", "experiments", "environment", "run", "stage_stats",
"windows", "samples", "errors"}`, its chain's experiments baseline first, each with the
config the run used. `run.summary` is the run's `RunSummary` in its JSON form (`to_bundle`:
every field, with the summary's own schema_version); bundles written before summaries had a
version hold the same fields without it, and read the same.

Reading a line checks its run as if it were measured here (`store.bundle_rules`: names,
numbers, enums, hashes); its figures against its histograms are checked above the store
(`run.imported`), before anything is stored.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from optlab.store import bundle_rules as rules
from optlab.store.convert import gpu_sample
from optlab.store.models import RUN_STATUSES, utcnow
from optlab.store.records import (
    ResourceSample,
    RunErrorCount,
    RunFinal,
    RunRecord,
    StageStatsRow,
    WindowStats,
)
from optlab.store.summary import RunSummary

BUNDLE_KIND = "optlab-bundle"
BUNDLE_SCHEMA_VERSION = 1

TIMESTAMP_FIELDS = ("started_at", "heartbeat_at", "finished_at")
_UID = re.compile(r"^[0-9a-f]{32}$")
# Run fields a bundle must have (the NOT NULL columns), with their JSON types.
_REQUIRED_RUN = {
    "experiment": str,
    "config_hash": str,
    "status": str,
    "protocol_name": str,
    "protocol": dict,
    "provisional": bool,
    "repeat": bool,
    "code_identity": dict,
    "hostname": str,
    "pid": int,
    "started_at": str,
    "heartbeat_at": str,
    "reasons": list,
}

Action = Literal["imported", "completed", "skipped", "failed"]


@dataclass(frozen=True)
class RunBundle:
    """One run with its chain's experiments, environment and measurements.

    `experiments`: baseline first, each `{name, kind, parent, description, hypothesis,
    config, config_hash, change, variable, parent_config_hash, source_path, source_hash}` with
    the config this run used (its ancestors' configs those its steps were resolved against).
    `environment`: `{fingerprint, fingerprint_hash, material_hash}` or None. `run`: every
    field of the run, JSON-ready (timestamps as ISO 8601 strings, UTC), with `uid` and the
    source database's `id`.
    """

    experiments: tuple[dict[str, Any], ...]
    environment: dict[str, Any] | None
    run: dict[str, Any]
    stage_stats: tuple[StageStatsRow, ...] = ()
    windows: tuple[WindowStats, ...] = ()
    samples: tuple[ResourceSample, ...] = ()
    errors: tuple[RunErrorCount, ...] = ()
    # "file:line" for a bundle read from a file (what a refusal names); not part of the run.
    origin: str | None = field(default=None, compare=False)

    @property
    def uid(self) -> str:
        return str(self.run["uid"])

    @property
    def experiment(self) -> str:
        return str(self.run["experiment"])

    @property
    def summary(self) -> RunSummary | None:
        value = self.run.get("summary")
        return None if value is None else RunSummary.from_json(value)

    @property
    def final(self) -> RunFinal:
        """The run's final fields (its status must be a terminal one)."""
        run = self.run
        return RunFinal(
            status=str(run["status"]),
            valid=run.get("valid"),
            reasons=tuple(run.get("reasons") or ()),
            reason_codes=tuple(run.get("reason_codes") or ()),
            requests=run.get("requests"),
            errors=run.get("errors"),
            qps=run.get("qps"),
            warmup_s=run.get("warmup_s"),
            duration_s=run.get("duration_s"),
            summary=self.summary,
            error_message=run.get("error_message"),
        )

    def completed(
        self,
        *,
        final: RunFinal,
        stage_stats: Iterable[StageStatsRow],
        windows: Iterable[WindowStats],
        samples: Iterable[ResourceSample],
        errors: Iterable[RunErrorCount],
    ) -> RunBundle:
        """A copy with the run finished as `final` says, finished_at now, and the measurement
        lists replaced by these (every window and sample of the run, not only the unflushed
        ones)."""
        now = utcnow().isoformat()
        run = {**self.run, **final_json(final), "finished_at": now, "heartbeat_at": now}
        return replace(
            self,
            run=run,
            stage_stats=tuple(stage_stats),
            windows=tuple(windows),
            samples=tuple(samples),
            errors=tuple(errors),
        )


def final_json(final: RunFinal) -> dict[str, Any]:
    """A run's final fields as a bundle's `run` holds them."""
    summary = final.summary
    return {
        "status": final.status,
        "valid": final.valid,
        "reasons": list(final.reasons),
        "reason_codes": list(final.reason_codes),
        "requests": final.requests,
        "errors": final.errors,
        "qps": final.qps,
        "summary": None if summary is None else summary.to_bundle(),
        "warmup_s": final.warmup_s,
        "duration_s": final.duration_s,
        "error_message": final.error_message,
    }


@dataclass(frozen=True)
class ImportResult:
    """What importing one run did. `run_id` is this database's id (None when it failed)."""

    run_uid: str
    run_id: int | None
    action: Action
    experiment: str = ""
    path: Path | None = None  # the pending file it came from (`import_pending`)
    error: str | None = None  # why it failed (`import_pending` only; it stays pending)


@dataclass(frozen=True)
class ExportResult:
    path: Path
    runs: list[RunRecord]
    left_out: list[RunRecord] = field(default_factory=list)  # RUNNING: still being measured


# -- JSON ---------------------------------------------------------------------------------


def bundle_json(bundle: RunBundle) -> dict[str, Any]:
    return {
        "kind": "run",
        "experiments": list(bundle.experiments),
        "environment": bundle.environment,
        "run": bundle.run,
        "stage_stats": [asdict(row) for row in bundle.stage_stats],
        "windows": [asdict(window) for window in bundle.windows],
        "samples": [asdict(sample) for sample in bundle.samples],
        "errors": [asdict(error) for error in bundle.errors],
    }


_Malformed = rules.Malformed


def _need(value: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(value, dict) or key not in value:
        raise _Malformed(f"{where} has no {key!r}")
    if not isinstance(value[key], kind):
        raise _Malformed(f"{where}.{key} is {type(value[key]).__name__}")
    return value[key]


def _sample(value: dict[str, Any]) -> ResourceSample:
    cores, gpus = value.get("cpu_per_core"), value.get("gpus")
    tuples = {
        "cpu_per_core": None if cores is None else tuple(cores),
        "gpus": None if gpus is None else tuple(gpu_sample(gpu) for gpu in gpus),
    }
    return ResourceSample(**{**value, **tuples})


def _check_chain(experiments: list[Any], run: dict[str, Any]) -> None:
    if not experiments or len(experiments) > 1000:
        raise _Malformed("experiments is empty" if not experiments else "experiments is too long")
    names = [item.get("name") if isinstance(item, dict) else None for item in experiments]
    if len(set(map(str, names))) != len(names):
        raise _Malformed("experiments name one experiment twice")
    parent = None
    for index, experiment in enumerate(experiments):
        where = f"experiments[{index}]"
        _need(experiment, "name", str, where)
        _need(experiment, "config_hash", str, where)
        _need(experiment, "config", dict, where)
        if experiment.get("parent") != parent:
            raise _Malformed(f"{where} has parent {experiment.get('parent')!r}, not {parent!r}")
        if experiment.get("kind") != ("baseline" if parent is None else "step"):
            raise _Malformed(f"{where} has kind {experiment.get('kind')!r}")
        parent = experiment["name"]
    if parent != run["experiment"] or experiments[-1]["config_hash"] != run["config_hash"]:
        raise _Malformed("the last experiment is not the run's experiment and config")


def bundle_from_json(value: Any) -> RunBundle:
    """A bundle from one parsed line, checked under `store.bundle_rules` as if its run were
    measured here; raises ValueError saying which run and which field is wrong."""
    if not isinstance(value, dict) or value.get("kind") != "run":
        raise _Malformed("not a run line (its kind is not 'run')")
    run = _need(value, "run", dict, "line")
    if not _UID.match(str(_need(run, "uid", str, "run"))[:40]):
        raise _Malformed(f"run.uid {run['uid'][:40]!r} is not 32 hex digits")
    experiment = run.get("experiment")
    shown = experiment[:60] if isinstance(experiment, str) else experiment
    try:
        return _bundle(value, run)
    except _Malformed as exc:
        raise _Malformed(f"run {run['uid']} ({shown!r}): {exc}") from exc


def _bundle(value: dict[str, Any], run: dict[str, Any]) -> RunBundle:
    rules.check_json_values(value)
    for key, kind in _REQUIRED_RUN.items():
        _need(run, key, kind, "run")
    rules.one_of(run["status"], "run.status", RUN_STATUSES)
    rules.check_run(run)
    for key in TIMESTAMP_FIELDS:
        if run.get(key) is not None:
            parse_timestamp(run[key], f"run.{key}")
    experiments = _need(value, "experiments", list, "line")
    _check_chain(experiments, run)
    rules.check_experiments(experiments)
    environment = value.get("environment")
    if environment is not None:
        fingerprint = _need(environment, "fingerprint", dict, "environment")
        _need(environment, "material_hash", str, "environment")
        rules.check_environment(environment, rules.fingerprint_hash(fingerprint))
    rules.check_stage_stats(value.get("stage_stats", []))
    rules.check_windows(value.get("windows", []))
    rules.check_samples(value.get("samples", []))
    rules.check_errors(value.get("errors", []))
    if run.get("summary") is not None:
        try:
            RunSummary.from_json(run["summary"])
        except ValueError as exc:
            raise _Malformed(f"run.summary does not fit: {_first(exc)}") from exc
    try:
        return RunBundle(
            experiments=tuple(experiments),
            environment=environment,
            run=run,
            stage_stats=tuple(StageStatsRow(**row) for row in value.get("stage_stats", [])),
            windows=tuple(WindowStats(**row) for row in value.get("windows", [])),
            samples=tuple(_sample(row) for row in value.get("samples", [])),
            errors=tuple(RunErrorCount(**row) for row in value.get("errors", [])),
        )
    except (TypeError, AttributeError) as exc:
        raise _Malformed(f"a measurement row does not fit: {exc}") from exc


def parse_timestamp(value: Any, where: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError) as exc:
        raise _Malformed(f"{where} {value!r} is not an ISO 8601 timestamp") from exc
    if parsed.tzinfo is None:
        raise _Malformed(f"{where} {value!r} has no timezone")
    return parsed


def _first(exc: ValueError) -> str:
    # pydantic lists every problem over many lines; the first says enough for a damaged file.
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
