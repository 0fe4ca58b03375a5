"""What went wrong with the database, in words a user can act on.

One function, `storage_error`, reads the driver's error (SQLite's error name and message,
PostgreSQL's SQLSTATE) and says which condition it is: damaged file, read-only file or
folder, full disk, locked, server gone, no permission. Transient conditions become
`StoreUnavailable`, which the measurement code retries and, failing that, keeps a pending
bundle for; permanent ones become `StoreError`, which only the user can fix. Every engine
optlab makes runs its errors through this function (`install`), so a damaged page met by
a report query is reported the same way as one met on open.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
from pathlib import Path

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL, ExceptionContext
from sqlalchemy.exc import OperationalError

from optlab.errors import StoreError, StoreUnavailable

ENV_VAR = "OPTLAB_DB"

# SQLite's words for a file whose pages are not what SQLite wrote (SQLITE_CORRUPT, _NOTADB).
_DAMAGED_WORDS = ("malformed", "not a database", "disk image")
# PostgreSQL SQLSTATEs worth retrying: the server is going away, starting, out of room, or
# chose this transaction as the victim of a conflict. Class 08 (connection) is added below.
_PG_TRANSIENT = {
    "57P01": "the server is shutting down",
    "57P02": "the server crashed",
    "57P03": "the server is starting up",
    "53100": "the server's disk is full",
    "53200": "the server is out of memory",
    "53300": "the server has too many connections",
    "40001": "a concurrent transaction conflicted",
    "40P01": "a deadlock with another transaction",
    "55P03": "a lock is held by another transaction",
}
# Connection failures that carry no SQLSTATE (libpq reports them before any session exists).
_PG_PERMANENT_CONNECT = ("does not exist", "password authentication", "pg_hba.conf", "permission")


def first_line(exc: BaseException) -> str:
    """The driver's own message, without SQLAlchemy's SQL echo and background link."""
    inner = getattr(exc, "orig", None) or exc
    lines = str(inner).strip().splitlines()
    return lines[0] if lines else type(inner).__name__


def shown(url: URL) -> str:
    """The database as a message names it: the file for SQLite, else the masked URL."""
    path = sqlite_path(url)
    return str(path) if path is not None else url.render_as_string(hide_password=True)


def sqlite_path(url: URL) -> Path | None:
    """The file behind a SQLite URL, or None for in-memory and URI-style databases."""
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _mount_point(path: Path) -> Path:
    path = _existing_ancestor(path)
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def read_only_media(path: Path) -> bool:
    """Whether the file system holding `path` is mounted read-only (nobody can write it)."""
    try:
        return bool(os.statvfs(_existing_ancestor(path)).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _writable(path: Path) -> bool:
    folder = path if path.is_dir() else path.parent
    if not os.access(_existing_ancestor(folder), os.W_OK):
        return False
    return not path.exists() or os.access(path, os.W_OK)


def damaged(path: Path | str, detail: str) -> StoreError:
    quoted = shlex.quote(str(path))
    return StoreError(
        f"database {path} is damaged: {detail}",
        hint=f"keep the original, and recover what it holds into a new file: sqlite3 {quoted} "
        f'".recover" | sqlite3 repaired.db, then use --db sqlite:///repaired.db',
    )


def read_only(shown_db: str, detail: str) -> StoreError:
    return StoreError(
        f"database {shown_db} is read-only: {detail}",
        hint=f"copy it somewhere writable (with any -wal and -shm files next to it) or use "
        f"--db (or {ENV_VAR}) to name a writable database",
    )


def folder_given(path: Path) -> StoreError:
    return StoreError(
        f"database {path} is a folder, not a file",
        hint=f"--db (or {ENV_VAR}) names a folder; name a file, e.g. "
        f"sqlite:///{path / 'optlab.db'}",
    )


def disk_full(path: Path, detail: str) -> StoreUnavailable:
    mount = _mount_point(path)
    try:
        left = f"{shutil.disk_usage(mount).free / 1e6:.0f} MB left"
    except OSError:
        left = "free space unknown"
    return StoreUnavailable(
        f"database {path} cannot grow, the disk is full: {detail}",
        hint=f"free space on {mount} ({left}), then run the command again; everything "
        "committed before is kept",
    )


def _nearly_full(path: Path | None, margin: int = 1 << 20) -> bool:
    """Whether the disk holding `path` has less than `margin` bytes free."""
    if path is None:
        return False
    try:
        return shutil.disk_usage(_mount_point(path)).free < margin
    except OSError:
        return False


def _sqlite_error(url: URL, exc: BaseException, detail: str) -> StoreError | None:
    path = sqlite_path(url)
    where = str(path) if path is not None else shown(url)
    name = getattr(exc, "sqlite_errorname", "") or ""
    lowered = detail.lower()
    if name in ("SQLITE_CORRUPT", "SQLITE_NOTADB") or any(w in lowered for w in _DAMAGED_WORDS):
        return damaged(where, detail)
    if name.startswith("SQLITE_READONLY") or "readonly" in lowered or "read-only" in lowered:
        return read_only(where, detail)
    if name == "SQLITE_FULL" or "database or disk is full" in lowered:
        return disk_full(path or Path.cwd(), detail)
    if (name.startswith("SQLITE_IOERR") or "disk i/o error" in lowered) and _nearly_full(path):
        # SQLite reports a failed write of its -wal or -shm file as an I/O error, not FULL.
        return disk_full(path or Path.cwd(), detail)
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in lowered:
        return StoreUnavailable(
            f"database {where} is locked by another process: {detail}",
            hint="another optlab (or a SQL client) held the write lock longer than optlab "
            "waits for it; run the command again when that process has finished",
        )
    if name.startswith("SQLITE_CANTOPEN") or "unable to open" in lowered:
        if path is not None and path.is_dir():
            return folder_given(path)
        if path is not None and read_only_media(path):
            return read_only(where, f"{detail} (its file system is mounted read-only)")
        if path is not None and not _writable(path):
            return read_only(where, f"{detail} (you may not write the file or its folder)")
        return StoreError(
            f"cannot open database {where}: {detail}",
            hint=f"check that the folder exists and that you may read and write it, or name "
            f"another file with --db or {ENV_VAR}",
        )
    return None


def _postgres_error(url: URL, exc: BaseException, detail: str, lost: bool) -> StoreError | None:
    where = shown(url)
    state = getattr(exc, "sqlstate", None) or getattr(exc, "pgcode", None) or ""
    if state == "25006":
        return read_only(where, f"{detail} (a standby, or default_transaction_read_only)")
    if state.startswith("08") or state in _PG_TRANSIENT or lost:
        reason = _PG_TRANSIENT.get(state, "the connection to the server failed")
        return StoreUnavailable(
            f"database {where} is unavailable ({reason}): {detail}",
            hint="check that the server is running and reachable, then run the command again",
        )
    if state.startswith("28") or state == "42501":
        return StoreError(
            f"database {where} refused the user: {detail}",
            hint="check the user and password in --db or "
            f"{ENV_VAR}, and that the user may connect and use the tables",
        )
    if state == "3D000":
        return StoreError(
            f"database {where} does not exist: {detail}",
            hint="create it (createdb NAME) or fix the name in --db or " + ENV_VAR,
        )
    return None


def storage_error(url: URL, exc: BaseException, *, lost: bool = False) -> StoreError | None:
    """The StoreError (or StoreUnavailable) that `exc` means, or None when it is not a
    storage condition optlab knows (a constraint violation, a bug, a failed migration whose
    caller says more) and should be raised as it is.

    `exc` is a SQLAlchemy DBAPIError or the driver's own exception; `lost` says SQLAlchemy
    found the connection dead.
    """
    inner = getattr(exc, "orig", None) or exc
    lost = lost or bool(getattr(exc, "connection_invalidated", False))
    detail = first_line(exc)
    backend = url.get_backend_name()
    found: StoreError | None = None
    if backend == "sqlite" and isinstance(inner, sqlite3.Error):
        found = _sqlite_error(url, inner, detail)
    elif backend == "postgresql":
        found = _postgres_error(url, inner, detail, lost)
        if (
            found is None
            and type(inner).__name__ == "OperationalError"
            and not getattr(inner, "sqlstate", None)
        ):
            # No SQLSTATE: libpq failed before or outside a session (refused, timed out,
            # closed), which is worth retrying - unless the server said who or what is wrong.
            if any(word in detail for word in _PG_PERMANENT_CONNECT):
                found = StoreError(
                    f"cannot open database {shown(url)}: {detail}",
                    hint=f"check the --db URL or {ENV_VAR}: the database name, the user and "
                    "its password, and that the user may connect",
                )
            else:
                found = StoreUnavailable(
                    f"cannot reach database {shown(url)}: {detail}",
                    hint=f"check the --db URL or {ENV_VAR} and that the server is running "
                    "and reachable, then run the command again",
                )
    return found


def failed(url: URL, exc: BaseException) -> StoreError | None:
    """`storage_error`, or for any other OperationalError a StoreError that quotes it: an
    operational failure is the environment's, not a bug in optlab. None for the rest."""
    found = storage_error(url, exc)
    if found is None and isinstance(exc, OperationalError):
        found = StoreError(
            f"database {shown(url)} failed: {first_line(exc)}",
            hint="check that the database is reachable and usable, then run the command again",
        )
    return found


def _on_error(context: ExceptionContext) -> BaseException | None:
    # During pool_pre_ping a dead connection is expected: SQLAlchemy reconnects quietly.
    if context.is_pre_ping or context.engine is None:
        return None
    error = storage_error(
        context.engine.url, context.original_exception, lost=context.is_disconnect
    )
    if error is None:
        return None
    error.__cause__ = context.original_exception
    return error


def install(engine: Engine) -> None:
    """Turn the driver's storage errors into StoreError wherever the engine meets them."""
    event.listen(engine, "handle_error", _on_error, retval=True)
