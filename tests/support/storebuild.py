"""A store to test against, and rows built in it without measuring: the `db_url` and `store`
fixtures (SQLite always, PostgreSQL when OPTLAB_TEST_POSTGRES_URL names a server, a fresh
database per test there), Alembic driven by URL, a saved baseline config and a started run.

A module takes the fixtures by assignment (`db_url = storebuild.db_url`), so pytest finds them
in its namespace."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.config import Config
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from optlab.store import Store, migrations_dir
from tests.support.capabilities import lacks

POSTGRES_ENV = "OPTLAB_TEST_POSTGRES_URL"
HEAD = "0011_knob_sweeps"  # the newest migration: a new one updates this line


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'nested' / 'optlab.db'}"
        return
    base = os.environ.get(POSTGRES_ENV)
    if not base:
        lacks(f"no PostgreSQL server named: set {POSTGRES_ENV} to a URL to run this variant")
    # A fresh database per test: tests stay independent and never see each other's schema.
    name = f"optlab_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    with Store.open(db_url) as opened:
        yield opened


def alembic_cfg(url: str) -> Config:
    """Alembic driven by URL, the way a developer's `alembic` command runs env.py."""
    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def save_baseline(store: Store, name: str = "baseline", config_hash: str = "a" * 64) -> int:
    saved = store.save_config(
        name=name,
        kind="baseline",
        parent=None,
        description="reference classifier",
        hypothesis=None,
        config={"knobs": {"precision": "fp32", "threads": 2}, "protocol": {"name": "quick"}},
        config_hash=config_hash,
        change=None,
        variable=None,
        parent_config_hash=None,
        source_path="experiments/baseline.yaml",
        source_hash="b" * 64,
    )
    return saved.id


def start_run(store: Store, experiment: str = "baseline", **overrides: object) -> int:
    arguments: dict[str, object] = {
        "experiment": experiment,
        "protocol_name": "quick",
        "protocol": {"name": "quick", "duration_s": 5},
        "provisional": True,
        "environment_id": None,
        "code_identity": {"target": "builtin:image-classifier"},
        "git_commit": "0123abc",
        "git_dirty": False,
    }
    arguments.update(overrides)
    return store.create_run(**arguments)  # type: ignore[arg-type]
