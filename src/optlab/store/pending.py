"""Pending runs: a run whose final write the database refused, kept whole on disk until the
next optlab command that opens that database stores it (README: Team store, Reliability).

A pending run is a one-run bundle file (`optlab.store.bundle`) named by the run's uid, whose
header `source` is the (masked) URL of the database it was meant for. It goes under
`.optlab/pending/` in the current folder; when that folder cannot take it (the disk that
filled up, a read-only checkout), under `~/.optlab/pending/`, else a folder of this user's
own in the temp directory. Every command looks in all three.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from optlab.errors import OptlabError, StoreError
from optlab.store.bundle import ImportResult, RunBundle
from optlab.store.bundle_files import read_bundle_file, write_bundle
from optlab.store.files import lstat_kind, open_regular

if TYPE_CHECKING:
    from optlab.store.repository import Store

PENDING_DIR = Path(".optlab") / "pending"
IMPORTED_DIR = "imported"
HEADER_BYTES = 64 * 1024  # a header line is short; a larger one is not a pending bundle


def pending_dirs() -> list[Path]:
    """Where pending runs are kept, in the order they are tried: the current folder's, the
    home folder's, then this user's own folder in the temp directory."""
    folders = [Path.cwd() / PENDING_DIR]
    with contextlib.suppress(RuntimeError):  # no home directory for this user
        folders.append(Path.home() / PENDING_DIR)
    folders.append(Path(tempfile.gettempdir()) / f"optlab-pending-{os.getuid()}")
    return list(dict.fromkeys(folders))


def _usable(folder: Path, create: bool) -> bool:
    """A folder we may keep runs in. The temp one is shared by every user: it must be ours,
    a real folder (not a symlink someone planted), and private."""
    try:
        if create:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = folder.lstat()
    except OSError:
        return False
    if not stat.S_ISDIR(info.st_mode):
        return False
    shared = str(folder).startswith(tempfile.gettempdir())
    return not shared or (info.st_uid == os.getuid() and not info.st_mode & 0o077)


def save_pending(bundle: RunBundle, database: str, directory: str | Path | None = None) -> Path:
    """Keep a run whose final write to `database` failed, atomically, in `directory` or the
    first of `pending_dirs()` that takes it; StoreError when none does."""
    folders = [Path(directory)] if directory is not None else pending_dirs()
    refusals = []
    for folder in folders:
        if not _usable(folder, create=True):
            refusals.append(f"{folder}: not a private, writable folder")
            continue
        try:
            return write_bundle(folder / f"{bundle.uid}.jsonl", [bundle], database)
        except StoreError as exc:
            refusals.append(exc.message)
    raise StoreError(
        f"cannot keep run {bundle.uid} anywhere: " + "; ".join(refusals),
        hint="free disk space, or run from a writable folder",
    )


def same_database(first: str, second: str) -> bool:
    """Whether two URLs name one database (passwords ignored, SQLite paths resolved)."""
    return _database_key(first) == _database_key(second)


def _database_key(url: str) -> str:
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url
    database = parsed.database
    sqlite = parsed.get_backend_name() == "sqlite"
    if sqlite and database and database != ":memory:" and not database.startswith("file:"):
        parsed = parsed.set(drivername="sqlite", database=str(Path(database).resolve()))
    return parsed.render_as_string(hide_password=True)


def _source(path: Path) -> str | None:
    """The database a pending file is addressed to, from its header line only."""
    import json

    try:
        with open_regular(path, "a pending run bundle") as handle:
            header = json.loads(handle.readline(HEADER_BYTES).decode("utf-8"))
    except (OptlabError, OSError, ValueError):
        return None
    source = header.get("source") if isinstance(header, dict) else None
    return source if isinstance(source, str) else None


def pending_files(database: str) -> list[Path]:
    """The pending files addressed to `database` (read from their headers only): cheap
    enough for every command to ask, so that none creates or opens a database for nothing.
    An entry that is not a regular file (a FIFO would block whoever opened it, a device never
    end) is listed too, never opened: `import_pending` reports it with the fix."""
    found = []
    for folder in pending_dirs():
        if not folder.is_dir() or not _usable(folder, create=False):
            continue
        for path in sorted(folder.glob("*.jsonl")):
            if lstat_kind(path) is not None:
                found.append(path)
                continue
            source = _source(path)
            if source is None or same_database(source, database):
                found.append(path)  # unreadable headers are reported by the import
    return found


def _not_regular(path: Path) -> str | None:
    kind = lstat_kind(path)
    if kind is None:
        return None
    return (
        f"{path} is {kind}, not a pending run bundle: passed over without opening it; "
        "remove it (optlab keeps only regular files under .optlab/pending/)"
    )


def import_pending(
    store: Store,
    paths: list[Path] | None = None,
    check: Callable[[RunBundle], None] | None = None,
) -> list[ImportResult]:
    """Store the pending runs meant for `store`'s database (`paths`, default all of them);
    `check` (`run.imported.check_imported`) refuses a file whose figures do not hold up.

    A stored file (imported, completed, or found already stored) is moved to `imported/`
    beside it rather than deleted: it costs little and shows what happened. A file that
    fails stays where it is and comes back with action "failed" and the error.
    """
    results: list[ImportResult] = []
    for path in pending_files(store.url) if paths is None else paths:
        refused = _not_regular(path)
        if refused is not None:
            results.append(ImportResult(path.stem, None, "failed", path=path, error=refused))
            continue
        try:
            header, bundles = read_bundle_file(path)
            if not same_database(str(header.get("source")), store.url):
                continue
            if check is not None:
                for bundle in bundles:
                    check(bundle)
            stored = [replace(result, path=path) for result in store.import_bundles(bundles)]
            (path.parent / IMPORTED_DIR).mkdir(exist_ok=True)
            os.replace(path, path.parent / IMPORTED_DIR / path.name)
        except Exception as exc:  # reported, and the file stays for the next command
            if not path.exists():
                continue  # another optlab command stored it (and moved it) meanwhile
            why = exc.message if isinstance(exc, OptlabError) else f"{type(exc).__name__}: {exc}"
            results.append(ImportResult(path.stem, None, "failed", path=path, error=why))
            continue
        results += stored
    return results
