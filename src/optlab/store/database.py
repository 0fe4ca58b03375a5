"""Engines: optlab's connection settings for SQLite and PostgreSQL, and database URLs.

SQLite runs in WAL with foreign keys on, a busy timeout and transactions optlab begins itself
(IMMEDIATE for writers). Commands that only read open the database read-only (SQLite
`mode=ro`, a PostgreSQL READ ONLY session): they work on read-only media and cannot change
anything by mistake. The schema check on open is `store.schema`'s.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError

from optlab.errors import StoreError
from optlab.store.faults import (
    ENV_VAR,
    first_line,
    folder_given,
    install,
    read_only_media,
    shown,
    sqlite_path,
    storage_error,
)

# Long enough to ride out another process's write transaction (a runner storing a
# finished run) instead of failing with "database is locked".
SQLITE_BUSY_TIMEOUT_MS = 30_000


def default_url() -> str:
    """`OPTLAB_DB` if set, else a SQLite file under the current directory."""
    url = os.environ.get(ENV_VAR)
    if url:
        return url
    return f"sqlite:///{Path.cwd() / '.optlab' / 'optlab.db'}"


def masked(url: str | URL) -> str:
    """The URL with any password hidden, safe for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        # Still show what was typed (that is the typo to fix), minus anything like a password.
        return re.sub(r":[^:@/]*@", ":***@", str(url))


def _switch_to_wal(cursor: Any) -> None:
    """Switch to WAL, riding out the moment when another connection is switching too.

    The switch needs an exclusive lock, and SQLite may refuse it at once ("database is
    locked") without calling the busy handler while another connection creates or switches
    the same file. WAL is stored in the file, so once any connection has switched, every
    later one is in WAL already.
    """
    for attempt in range(50):
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            time.sleep(0.01 * (attempt + 1))
    cursor.execute("PRAGMA journal_mode=WAL")  # the last try reports its own error


def _set_sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Take transaction control away from the sqlite3 module (it never wraps DDL in a
    # transaction, and begins late); `_begin_sqlite` starts transactions instead.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    try:
        # The busy timeout makes concurrent writers (and the switch to WAL) wait instead of
        # failing; WAL lets reports read while a runner writes; SQLite ignores foreign
        # keys unless asked.
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        _switch_to_wal(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _set_sqlite_reader_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # No switch to WAL (that is a write); the busy timeout still rides out a writer's lock.
    dbapi_connection.isolation_level = None
    dbapi_connection.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")


def _sqlite_reader(path: Path) -> Callable[[], sqlite3.Connection]:
    """Connections that cannot write `path`."""
    uri = path.absolute().as_uri()
    wal = path.with_name(path.name + "-wal")

    def connect() -> sqlite3.Connection:
        # Reading a WAL database needs its -shm file, which SQLite cannot create on read-only
        # media. There nobody can be writing, so the file may be read as immutable - unless a
        # -wal file holds commits not yet copied into it, which immutable would skip.
        try:
            pending = wal.stat().st_size > 0
        except OSError:  # no -wal file: everything committed is in the database file
            pending = False
        mode = "immutable=1" if read_only_media(path) and not pending else "mode=ro"
        return sqlite3.connect(f"{uri}?{mode}", uri=True, check_same_thread=False)

    return connect


def _begin_sqlite_reader(connection: Connection) -> None:
    # A deferred transaction: one consistent snapshot for a report's several queries.
    connection.exec_driver_sql("BEGIN")


def _postgres_read_only(dbapi_connection: Any, _record: Any) -> None:
    # Every transaction of the session is READ ONLY, so a read command cannot write by
    # mistake; committed at once, or the pool's reset would roll the setting back.
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY")
    finally:
        cursor.close()
    dbapi_connection.commit()


def _begin_sqlite(connection: Connection) -> None:
    # IMMEDIATE takes the write lock up front, so a transaction that reads and then writes
    # waits for other writers (busy timeout) instead of failing on a stale WAL snapshot.
    # Every optlab transaction is short, and WAL readers outside optlab are not blocked.
    # Being a real transaction, it also makes a failed migration roll back completely.
    connection.exec_driver_sql("BEGIN IMMEDIATE")


def make_engine(url: str, *, create_dirs: bool = True, read_only: bool = False) -> Engine:
    """An engine with optlab's connection settings; raises StoreError for a bad URL.

    `read_only`: connections that cannot write (and create no directory).
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreError(
            f"cannot parse database URL {masked(url)!r}: {exc}",
            hint="use a SQLAlchemy URL such as sqlite:///path/optlab.db or "
            "postgresql+psycopg://user@host/dbname",
        ) from exc
    path = sqlite_path(parsed)
    if path is not None and path.is_dir():
        raise folder_given(path)
    if path is not None and create_dirs and not read_only:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"cannot create the directory for database {masked(parsed)}: {exc}",
                hint=f"choose a writable location with --db or {ENV_VAR}",
            ) from exc
    try:
        # pre_ping: a runner holds its engine for a 15-minute measurement; a server-side
        # idle timeout must not turn the final write into an error.
        options: dict[str, Any] = {"pool_pre_ping": parsed.get_backend_name() != "sqlite"}
        if path is not None and read_only:
            options["creator"] = _sqlite_reader(path)
        engine = create_engine(parsed, **options)
    except (NoSuchModuleError, ImportError) as exc:
        raise StoreError(
            f"no database driver for {masked(parsed)}: {exc}",
            hint="for PostgreSQL install the driver: pip install 'optlab[postgres]' and use "
            "a postgresql+psycopg:// URL",
        ) from exc
    if engine.dialect.name == "sqlite" and read_only:
        event.listen(engine, "connect", _set_sqlite_reader_pragmas)
        event.listen(engine, "begin", _begin_sqlite_reader)
    elif engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _set_sqlite_pragmas)
        event.listen(engine, "begin", _begin_sqlite)
    elif read_only and engine.dialect.name == "postgresql":
        event.listen(engine, "connect", _postgres_read_only)
    install(engine)
    return engine


def unreachable(url: str | URL, exc: Exception) -> StoreError:
    """What `exc` means for the database (see `faults`), or a generic can't-open error."""
    parsed = make_url(url)
    found = storage_error(parsed, exc)
    if found is not None:
        return found
    if parsed.get_backend_name() == "sqlite":
        hint = f"check the --db path or {ENV_VAR}, and that you may read and write the file"
    else:
        hint = (
            f"check the --db URL or {ENV_VAR}, that the server is running and reachable, "
            "and that the user may connect"
        )
    return StoreError(f"cannot open database {shown(parsed)}: {first_line(exc)}", hint=hint)
