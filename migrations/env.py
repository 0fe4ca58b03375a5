"""Alembic environment for optlab.

Code (`optlab.store`) runs migrations on its own engine by putting a connection in
`config.attributes["connection"]`; a developer running the `alembic` command gets an engine
built from `sqlalchemy.url` in alembic.ini, or from OPTLAB_DB / the default when that is empty.
"""

from __future__ import annotations

from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from optlab.store.database import default_url, make_engine
from optlab.store.models import metadata

config = context.config
target_metadata = metadata

if config.config_file_name is not None:
    # Keep the application's loggers alive when run from the alembic command line.
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or default_url()


def run_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        render_as_batch=True,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def _run_on(connection: Connection) -> None:
    # render_as_batch: SQLite alters a table only by copying it; batch mode does that, and
    # autogenerate then writes migrations that work on SQLite and PostgreSQL alike.
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=True,
        compare_type=True,
        # optlab's SQLite engines issue BEGIN themselves (see store/database.py), so DDL
        # is transactional there too and a failed migration leaves nothing half done.
        transactional_ddl=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_on(connection)
        return
    # make_engine: the same SQLite pragmas (foreign keys, WAL) as optlab itself uses.
    engine = make_engine(_url())
    try:
        with engine.connect() as fresh:
            _run_on(fresh)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
