"""The Alembic migrations, and the schema check run on every open.

A database is usable only at the schema head this optlab ships. Anything else is refused
with a message that says what to do, in the manner of mlflow's `_verify_schema`: silently
writing to an old or foreign schema would corrupt results that cannot be re-measured.
`upgrade()` and `current()` back `optlab db upgrade` and `optlab db current`.
"""

from __future__ import annotations

import importlib.resources
import sqlite3
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError

from optlab.errors import StoreError
from optlab.store.database import default_url, make_engine, masked, unreachable
from optlab.store.faults import ENV_VAR, damaged, first_line, shown, sqlite_path
from optlab.store.records import SchemaStatus

VERSION_TABLE = "alembic_version"

# An arbitrary constant that names optlab's schema lock among PostgreSQL advisory locks.
_PG_LOCK_KEY = 0x6F70746C6162  # "optlab"


def migrations_dir() -> Path:
    """The Alembic script directory: shipped in the wheel, or the repository's top level."""
    packaged = importlib.resources.files("optlab") / "_migrations"
    if packaged.is_dir():
        return Path(str(packaged))
    # src layout: src/optlab/store/schema.py -> parents[3] is the repository root.
    checkout = Path(__file__).resolve().parents[3] / "migrations"
    if checkout.is_dir():
        return checkout
    raise StoreError(
        f"optlab's database migrations are missing (looked for {packaged} and {checkout})",
        hint="reinstall optlab; a wheel must contain optlab/_migrations",
    )


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
