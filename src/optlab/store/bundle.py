"""Run bundles: runs with everything they need, as a versioned JSON-lines file.

A bundle moves runs between databases (a laptop's SQLite and the team's PostgreSQL, a CI job's
artifact) and keeps a run whose final write failed: the runner saves it under
`.optlab/pending/` and the next writing command stores it. Runs keep their identity (`uid`)
across databases, so importing is idempotent.

File format (schema_version 1): line 1 is the header
`{"kind": "optlab-bundle", "schema_version", "created_at", "optlab_version", "source"}`
(`source`: the database URL it came from or was meant for, password masked); every further
line is one run: `{"kind": "run", "experiments", "environment", "run", "stage_stats",
"windows", "samples", "errors"}`, its chain's experiments baseline first, each with the
config the run used.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from optlab import __version__
from optlab.errors import NotFoundError, RefusedError, StoreError
from optlab.store.convert import gpu_sample
from optlab.store.database import masked
from optlab.store.models import RUN_STATUSES, utcnow
from optlab.store.records import (
    TERMINAL_STATUSES,
    ResourceSample,
    RunErrorCount,
    RunRecord,
    RunStatus,
    StageStatsRow,
    WindowStats,
)

if TYPE_CHECKING:
    from optlab.store.repository import Store

BUNDLE_KIND = "optlab-bundle"
SCHEMA_VERSION = 1

# `Store.finish_run`'s keyword arguments: the run fields a measurement decides at its end.
FINAL_FIELDS = (
    "status",
    "valid",
    "reasons",
    "requests",
    "errors",
    "qps",
    "summary",
    "warmup_s",
    "duration_s",
    "error_message",
)
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

    @property
    def uid(self) -> str:
        return str(self.run["uid"])

    @property
    def experiment(self) -> str:
        return str(self.run["experiment"])

    def completed(
        self,
        *,
        final: dict[str, Any],
        stage_stats: Iterable[StageStatsRow],
        windows: Iterable[WindowStats],
        samples: Iterable[ResourceSample],
        errors: Iterable[RunErrorCount],
    ) -> RunBundle:
        """A copy with the run finished: `final` holds `Store.finish_run`'s keyword arguments
        (`error_message` may be left out), finished_at is now, and the measurement lists are
        replaced by these (every window and sample of the run, not only the unflushed ones)."""
        final = {"error_message": None, **final}
        unknown = set(final) - set(FINAL_FIELDS)
        missing = set(FINAL_FIELDS) - set(final)
        if unknown or missing:
            raise ValueError(
                f"final fields are finish_run's keywords: unknown {sorted(unknown)}, "
                f"missing {sorted(missing)}"
            )
        status = str(final["status"])
        if status not in TERMINAL_STATUSES:
            allowed = sorted(TERMINAL_STATUSES)
            raise ValueError(f"a run finishes as one of {allowed}, not {status!r}")
        now = utcnow().isoformat()
        run = {
            **self.run,
            **final,
            "status": status,
            "reasons": list(final["reasons"]),
            "finished_at": now,
            "heartbeat_at": now,
        }
        return replace(
            self,
            run=run,
            stage_stats=tuple(stage_stats),
            windows=tuple(windows),
            samples=tuple(samples),
            errors=tuple(errors),
        )


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


class _Malformed(ValueError):
    pass


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
    if not experiments:
        raise _Malformed("experiments is empty")
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
    """A bundle from one parsed line; raises ValueError saying what is wrong."""
    if not isinstance(value, dict) or value.get("kind") != "run":
        raise _Malformed("not a run line (its kind is not 'run')")
    run = _need(value, "run", dict, "line")
    if not _UID.match(str(_need(run, "uid", str, "run"))):
        raise _Malformed(f"run.uid {run['uid']!r} is not 32 hex digits")
    for key, kind in _REQUIRED_RUN.items():
        _need(run, key, kind, "run")
    if run["status"] not in RUN_STATUSES:
        raise _Malformed(f"run.status {run['status']!r} is not one of {RUN_STATUSES}")
    for key in TIMESTAMP_FIELDS:
        if run.get(key) is not None:
            parse_timestamp(run[key], f"run.{key}")
    experiments = _need(value, "experiments", list, "line")
    _check_chain(experiments, run)
    environment = value.get("environment")
    if environment is not None:
        _need(environment, "fingerprint", dict, "environment")
        _need(environment, "material_hash", str, "environment")
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


# -- files ----------------------------------------------------------------------------------


def _atomic_write(path: Path, text: str) -> None:
    """Write `text` to `path` so that a crash leaves the old file or the new one, never half."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        # The rename itself is durable only once the folder is synced.
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise StoreError(
            f"cannot write {path}: {exc.strerror or exc}",
            hint="check that the folder exists, is writable and has free space",
        ) from exc


def write_bundle(path: str | Path, bundles: Sequence[RunBundle], source: str) -> Path:
    """Write `bundles` to `path` (replaced atomically); `source` is their database URL."""
    path = Path(path)
    header = {
        "kind": BUNDLE_KIND,
        "schema_version": SCHEMA_VERSION,
        "created_at": utcnow().isoformat(),
        "optlab_version": __version__,
        "source": masked(source),
    }
    lines = [json.dumps(header, ensure_ascii=False)]
    lines += [json.dumps(bundle_json(bundle), ensure_ascii=False) for bundle in bundles]
    _atomic_write(path, "\n".join(lines) + "\n")
    return path


def _malformed(path: Path, line: int, why: str) -> StoreError:
    return StoreError(
        f"{path}:{line}: malformed run bundle: {why}",
        hint="the file is damaged or truncated; export the runs again",
    )


def _header(path: Path, text: str) -> dict[str, Any]:
    try:
        header: dict[str, Any] = json.loads(text)
    except ValueError as exc:
        raise _malformed(path, 1, f"the header is not JSON ({exc})") from exc
    kind = header.get("kind") if isinstance(header, dict) else None
    if kind != BUNDLE_KIND:
        raise StoreError(
            f"{path} is not an optlab run bundle (its first line has kind {kind!r}, "
            f"not {BUNDLE_KIND!r})",
            hint="`optlab import` reads files written by `optlab export`",
        )
    version = header.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise _malformed(path, 1, f"schema_version {version!r} is not a positive integer")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} is a run bundle of schema version {version}, written by a newer optlab "
            f"({header.get('optlab_version', 'unknown version')}); this optlab reads up to "
            f"version {SCHEMA_VERSION}",
            hint="upgrade optlab (pip install -U optlab), then import it again",
        )
    return header


def read_bundle_file(path: str | Path) -> tuple[dict[str, Any], list[RunBundle]]:
    """The header and the bundles of a bundle file; StoreError names a bad line."""
    path = Path(path)
    header: dict[str, Any] | None = None
    bundles: list[RunBundle] = []
    number = 0
    try:
        with open(path, encoding="utf-8") as handle:
            # Line by line: a bundle of many long runs need not be in memory twice.
            for number, line in enumerate(handle, start=1):
                if header is None:
                    header = _header(path, line)
                elif line.strip():
                    try:
                        bundles.append(bundle_from_json(json.loads(line)))
                    except ValueError as exc:
                        raise _malformed(path, number, str(exc)) from exc
    except UnicodeDecodeError as exc:
        raise _malformed(path, number + 1, "not UTF-8 text") from exc
    except OSError as exc:
        error = NotFoundError if isinstance(exc, FileNotFoundError) else StoreError
        raise error(f"cannot read {path}: {exc.strerror or exc}", hint="check the path") from exc
    if header is None:
        raise _malformed(path, 1, "the file is empty")
    return header, bundles


def read_bundle(path: str | Path) -> list[RunBundle]:
    """The runs of a bundle file; refuses another kind of file, a newer schema version, or a
    malformed line (named by file and line number)."""
    return read_bundle_file(path)[1]


# -- export and import ------------------------------------------------------------------------


def select_runs(
    store: Store, *, experiments: Sequence[str] | None = None, run_ids: Sequence[int] | None = None
) -> tuple[list[RunRecord], list[RunRecord]]:
    """(runs to export, runs left out because they are still RUNNING), oldest first.

    `run_ids`: exactly those (a RUNNING one is refused); else the runs of `experiments`;
    else every run.
    """
    if run_ids is not None:
        runs = [store.get_run(run_id) for run_id in run_ids]
        running = [run for run in runs if run.status == RunStatus.RUNNING]
        if running:
            raise RefusedError(
                f"run {running[0].id} ({running[0].experiment}) is still RUNNING: its "
                "measurements are partial",
                hint="export it once it has finished (or once `optlab run` has marked it CRASHED)",
            )
        return runs, []
    runs = store.list_runs()
    if experiments is not None:
        wanted = set(experiments)
        runs = [run for run in runs if run.experiment in wanted]
    kept = [run for run in runs if run.status != RunStatus.RUNNING]
    return kept, [run for run in runs if run.status == RunStatus.RUNNING]


def export_file(
    store: Store,
    path: str | Path,
    *,
    experiments: Sequence[str] | None = None,
    run_ids: Sequence[int] | None = None,
) -> ExportResult:
    """Write the chosen runs (see `select_runs`) to a bundle file."""
    runs, left_out = select_runs(store, experiments=experiments, run_ids=run_ids)
    if not runs:
        raise NotFoundError(
            f"no runs to export in {store.url}"
            + (f" ({len(left_out)} still RUNNING)" if left_out else ""),
            hint="measure one first (`optlab run EXPERIMENT`), or check HEAD, --runs and --db",
        )
    bundles = store.export_runs([run.id for run in runs])
    return ExportResult(write_bundle(path, bundles, store.url), runs, left_out)


def read_bundles(paths: Sequence[str | Path]) -> list[RunBundle]:
    """The runs of several bundle files, every file read (and checked) before any import."""
    return [bundle for path in paths for bundle in read_bundle(path)]
