"""Run bundle files: writing them atomically, reading them line by line (refusing another
kind of file, a newer format or a damaged line), and exporting a database's runs to one.
The format is `store.bundle`'s.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optlab._version import __version__
from optlab.errors import ConfigError, NotFoundError, RefusedError, StoreError
from optlab.store.bundle import (
    BUNDLE_KIND,
    BUNDLE_SCHEMA_VERSION,
    ExportResult,
    RunBundle,
    bundle_from_json,
    bundle_json,
)
from optlab.store.bundle_rules import NonFinite
from optlab.store.database import masked
from optlab.store.files import open_regular, write_atomic
from optlab.store.models import utcnow
from optlab.store.records import RunRecord, RunStatus

if TYPE_CHECKING:
    from optlab.store.repository import Store

# A bundle is read whole before anything is stored (a refusal anywhere stores nothing), so its
# size is bounded by memory: a day-long run is a few MiB, so this holds hundreds of runs.
MAX_BUNDLE_MIB = 512
MAX_BUNDLE_ENV = "OPTLAB_MAX_BUNDLE_MIB"
MAX_RUN_ID = (1 << 63) - 1


def write_bundle(path: str | Path, bundles: Sequence[RunBundle], source: str) -> Path:
    """Write `bundles` to `path` (replaced atomically); `source` is their database URL."""
    path = Path(path)
    header = {
        "kind": BUNDLE_KIND,
        "schema_version": BUNDLE_SCHEMA_VERSION,
        "created_at": utcnow().isoformat(),
        "optlab_version": __version__,
        "source": masked(source),
    }
    lines = [json.dumps(header, ensure_ascii=False)]
    lines += [json.dumps(bundle_json(bundle), ensure_ascii=False) for bundle in bundles]
    return write_atomic(path, "\n".join(lines) + "\n", "a run bundle")


def _malformed(path: Path, line: int, why: str) -> StoreError:
    return StoreError(
        f"{path}:{line}: malformed run bundle: {why}",
        hint="the file is damaged, truncated or was edited after `optlab export` wrote it; "
        "export the runs again from the database that measured them",
    )


def _header(path: Path, text: str) -> dict[str, Any]:
    try:
        header: dict[str, Any] = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
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
    if version > BUNDLE_SCHEMA_VERSION:
        raise StoreError(
            f"{path} is a run bundle of schema version {version}, written by a newer optlab "
            f"({header.get('optlab_version', 'unknown version')}); this optlab reads up to "
            f"version {BUNDLE_SCHEMA_VERSION}",
            hint="upgrade optlab (pip install -U optlab), then import it again",
        )
    return header


def max_bundle_bytes() -> int:
    """The largest bundle file read: MAX_BUNDLE_MIB, or OPTLAB_MAX_BUNDLE_MIB where set."""
    text = os.environ.get(MAX_BUNDLE_ENV, "").strip()
    try:
        mib = int(text) if text else MAX_BUNDLE_MIB
    except ValueError:
        mib = 0
    if not 1 <= mib <= 1 << 20:
        raise ConfigError(
            f"{MAX_BUNDLE_ENV}={text!r} is not a whole number of MiB from 1 to {1 << 20}",
            hint=f"unset it for the default ({MAX_BUNDLE_MIB} MiB), or set e.g. "
            f"{MAX_BUNDLE_ENV}=2048",
        )
    return mib << 20


def _too_large(path: Path, limit: int) -> StoreError:
    return StoreError(
        f"{path}: larger than the {limit:,}-byte limit on a run bundle (nothing was imported)",
        hint="split it: export fewer runs per file (`optlab export HEAD`, or --runs ID,ID), "
        f"or raise the limit with {MAX_BUNDLE_ENV}=<MiB> if this machine has the memory",
    )


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number (JSON has no NaN or infinities)")


def _parse(text: str) -> Any:
    try:
        # NaN and infinities are kept as markers, for `bundle_from_json` to name their field.
        return json.loads(text, parse_constant=NonFinite)
    except RecursionError as exc:
        raise ValueError("nested too deeply to be a run bundle") from exc


def read_bundle_file(path: str | Path) -> tuple[dict[str, Any], list[RunBundle]]:
    """The header and the bundles of a bundle file; StoreError names a bad line.

    Only a regular file is read (a FIFO, a device or a folder is refused before it is
    opened), and never more than `max_bundle_bytes()`. Every run is checked as it is parsed
    (`store.bundle`: names, numbers, enums, hashes); each bundle's `origin` is "path:line".
    """
    path = Path(path)
    limit = max_bundle_bytes()
    header: dict[str, Any] | None = None
    bundles: list[RunBundle] = []
    number, left = 0, limit
    with open_regular(path, "a run bundle") as handle:
        if os.fstat(handle.fileno()).st_size > limit:
            raise _too_large(path, limit)
        while True:
            try:
                # Line by line: a bundle of many long runs need not be in memory twice.
                line = handle.readline(left + 1)
            except OSError as exc:
                raise StoreError(f"cannot read {path}: {exc.strerror or exc}") from exc
            if not line:
                break
            number += 1
            left -= len(line)
            if left < 0:
                raise _too_large(path, limit)
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _malformed(path, number, "not UTF-8 text") from exc
            if header is None:
                header = _header(path, text)
            elif text.strip():
                try:
                    bundle = bundle_from_json(_parse(text))
                except ValueError as exc:
                    raise _malformed(path, number, str(exc)) from exc
                bundles.append(replace(bundle, origin=f"{path}:{number}"))
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
        for run_id in run_ids:
            if not 1 <= run_id <= MAX_RUN_ID:  # ids are positive 64-bit integers
                raise NotFoundError(
                    f"run {run_id} does not exist", hint="`optlab log` lists the runs and ids"
                )
        levels = store.level_tags()
        for run_id in run_ids:
            tag = levels.get(run_id)
            if tag is not None:
                # Imported elsewhere it would pass for a run of its experiment at the load the
                # experiment declares, which it is not.
                raise RefusedError(
                    f"run {run_id} is level {tag.position} of sweep {tag.sweep_id} (measured "
                    f"at {tag.load:g} {'clients' if tag.mode == 'closed' else 'requests/s'}, "
                    "not the experiment's own load); bundles do not carry sweeps yet",
                    hint="export the experiment's own runs; run the sweep again in the other "
                    "database (`optlab sweep`)",
                )
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
