"""Engines, the Alembic migrations, and the schema check run on every open.

A database is usable only at the schema head this optlab ships. Anything else is refused
with a message that says what to do, in the manner of mlflow's `_verify_schema`: silently
writing to an old or foreign schema would corrupt results that cannot be re-measured.

Commands that only read open the database read-only (SQLite `mode=ro`, a PostgreSQL
READ ONLY session): they work on read-only media and cannot change anything by mistake.
"""

from __future__ import annotations

import importlib.resources
import os
import re
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from optlab.errors import StoreError
from optlab.store.faults import (
    ENV_VAR,
    damaged,
    first_line,
    folder_given,
    install,
    read_only_media,
    shown,
    sqlite_path,
    storage_error,
)
from optlab.store.records import SchemaStatus

VERSION_TABLE = "alembic_version"
# Long enough to ride out another process's write transaction (a runner storing a
# finished run) instead of failing with "database is locked".
SQLITE_BUSY_TIMEOUT_MS = 30_000

# An arbitrary constant that names optlab's schema lock among PostgreSQL advisory locks.
_PG_LOCK_KEY = 0x6F70746C6162  # "optlab"


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


def migrations_dir() -> Path:
    """The Alembic script directory: shipped in the wheel, or the repository's top level."""
    packaged = importlib.resources.files("optlab") / "_migrations"
    if packaged.is_dir():
        return Path(str(packaged))
    # src layout: src/optlab/store/database.py -> parents[3] is the repository root.
    checkout = Path(__file__).resolve().parents[3] / "migrations"
    if checkout.is_dir():
        return checkout
    raise StoreError(
        f"optlab's database migrations are missing (looked for {packaged} and {checkout})",
        hint="reinstall optlab; a wheel must contain optlab/_migrations",
    )


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


def _upgrade_hint(url: URL) -> str:
    if url.get_backend_name() == "sqlite":
        backup = "copy the .db file together with any -wal and -shm files next to it"
    else:
        backup = "for PostgreSQL, pg_dump the database"
    return f"run `optlab db upgrade` (back up first: {backup})"


def alembic_config(connection: Connection) -> Config:
    """An Alembic config that runs migrations on `connection` (see migrations/env.py)."""
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("path_separator", "os")
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    head = ScriptDirectory(str(migrations_dir())).get_current_head()
    if head is None:
        raise StoreError("optlab ships no database migrations", hint="reinstall optlab")
    return head


def _known_revisions() -> set[str]:
    script = ScriptDirectory(str(migrations_dir()))
    return {rev.revision for rev in script.walk_revisions()}


def _revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def _refuse_foreign(url: str | URL, connection: Connection) -> None:
    """Refuse a database that holds tables but was never stamped by Alembic."""
    tables = [name for name in inspect(connection).get_table_names() if name != VERSION_TABLE]
    if tables:
        shown = ", ".join(sorted(tables)[:5])
        raise StoreError(
            f"database {masked(url)} is not an optlab database "
            f"(it has tables {shown} but no schema version)",
            hint=f"point --db or {ENV_VAR} at a new file or an empty database",
        )


def _refuse_newer(url: str | URL, revision: str) -> None:
    if revision not in _known_revisions():
        raise StoreError(
            f"database {masked(url)} is at schema revision {revision}, which this optlab does "
            f"not know: it was written by a newer optlab (this one goes up to {head_revision()})",
            hint="upgrade optlab (pip install -U optlab) to use this database",
        )


def _serialize_schema_changes(connection: Connection) -> None:
    """Make concurrent first opens take turns, so only one of them creates the tables.

    SQLite already does (BEGIN IMMEDIATE); PostgreSQL needs a lock held to the end of the
    transaction.
    """
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_LOCK_KEY})


def _upgrade_connection(connection: Connection) -> None:
    command.upgrade(alembic_config(connection), "head")


def _refuse_damaged(engine: Engine) -> None:
    """Refuse a SQLite file with damaged pages before anything is written into it.

    Writing into a damaged file spreads the damage, and the user would learn of it only when
    a report fails. `quick_check` reads every page once but skips `integrity_check`'s
    index-against-table comparison: on a 100 MB database, 0.1 s from the page cache and
    about 1.6 s from a cold disk (integrity_check: 0.2 s cached). Readers skip it.
    """
    path = sqlite_path(engine.url)
    if path is None or not path.exists():
        return
    with engine.connect() as connection:
        # On the driver's connection, outside a transaction: BEGIN IMMEDIATE would hold the
        # write lock, and other writers' waits, for the whole check.
        raw = connection.connection.driver_connection
        assert raw is not None
        try:
            report = [str(row[0]) for row in raw.execute("PRAGMA quick_check(3)")]
        except sqlite3.Error as exc:
            raise unreachable(engine.url, exc) from exc
    # One "ok", or problem lines under a "*** in database main ***" heading.
    problems = [
        line
        for entry in report
        for line in entry.splitlines()
        if line != "ok" and not line.startswith("***")
    ]
    if problems:
        raise damaged(path, "; ".join(problems[:2]))


def _read_only_revision(engine: Engine) -> str:
    """The revision of a database opened read-only, which must already hold optlab's tables."""
    url = engine.url
    path = sqlite_path(url)
    create = (
        "it is created by the first command that stores something (`optlab diff EXP` or "
        "`optlab run EXP`)"
    )
    if path is not None and not path.exists():
        raise StoreError(
            f"there is no optlab database at {path}",
            hint=f"check --db or {ENV_VAR} (or the working folder); {create}",
        )
    with engine.connect() as connection:
        revision = _revision(connection)
        if revision is None:
            _refuse_foreign(url, connection)
    if revision is None:
        raise StoreError(
            f"database {shown(url)} holds no optlab data yet",
            hint=f"check --db or {ENV_VAR}; {create}",
        )
    return revision


def _create_if_empty(engine: Engine) -> str | None:
    """The database's revision; None for an empty one, which now holds the schema at head."""
    with engine.begin() as connection:
        _serialize_schema_changes(connection)
        revision = _revision(connection)
        if revision is None:
            _refuse_foreign(engine.url, connection)
            # Upgrading (not create_all) stamps the new database with its revision.
            _upgrade_connection(connection)
    return revision


def verify_or_create(engine: Engine, *, read_only: bool = False) -> None:
    """Create an empty database at head, accept one at head, refuse everything else.

    `read_only` (the engine's too): create nothing, so a missing or empty database is
    refused, and skip the integrity check, which guards writes.
    """
    url = engine.url
    head = head_revision()
    try:
        if read_only:
            revision: str | None = _read_only_revision(engine)
        else:
            _refuse_damaged(engine)
            revision = _create_if_empty(engine)
    except StoreError:
        raise
    except SQLAlchemyError as exc:
        raise unreachable(url, exc) from exc
    if revision is None or revision == head:
        return
    _refuse_newer(url, revision)
    raise StoreError(
        f"database {masked(url)} is at schema revision {revision}, this optlab needs {head}",
        hint=_upgrade_hint(url),
    )


def upgrade(url: str | None = None) -> tuple[str | None, str]:
    """Migrate the database to head; returns (revision before, revision after)."""
    url = url or default_url()
    engine = make_engine(url)
    try:
        _refuse_damaged(engine)
        with engine.begin() as connection:
            _serialize_schema_changes(connection)
            before = _revision(connection)
            if before is None:
                _refuse_foreign(url, connection)
            else:
                _refuse_newer(url, before)
            _upgrade_connection(connection)
            after = _revision(connection)
    except StoreError:
        raise
    except SQLAlchemyError as exc:
        # One transaction: PostgreSQL and optlab's SQLite engines roll all of it back.
        raise StoreError(
            f"cannot upgrade database {masked(url)}: {first_line(exc)}",
            hint="nothing was changed; check that the database is reachable and that the "
            "user may alter tables, then run `optlab db upgrade` again",
        ) from exc
    finally:
        engine.dispose()
    if after is None:  # pragma: no cover - Alembic always stamps after an upgrade
        raise StoreError(f"upgrading {masked(url)} left no schema revision")
    return before, after


def current(url: str | None = None) -> SchemaStatus:
    """Where the database stands; reads only, and works on any revision."""
    url = url or default_url()
    head = head_revision()
    engine = make_engine(url, read_only=True)
    path = sqlite_path(engine.url)
    if path is not None and not path.exists():
        # Looking must not create an empty file as a side effect.
        engine.dispose()
        return SchemaStatus(url=masked(url), revision=None, head=head, up_to_date=False)
    try:
        with engine.connect() as connection:
            revision = _revision(connection)
    except SQLAlchemyError as exc:
        raise unreachable(url, exc) from exc
    finally:
        engine.dispose()
    return SchemaStatus(url=masked(url), revision=revision, head=head, up_to_date=revision == head)
