"""The store when things go wrong: unstorable text, damaged and read-only files, a full disk,
a lost server, and processes racing to store the same new experiment. Real databases only:
SQLite files, and PostgreSQL when OPTLAB_TEST_POSTGRES_URL names a server.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import String, event, text

from optlab.cli.main import cli
from optlab.errors import StoreError, StoreUnavailable
from optlab.store import RunErrorCount, RunFinal, Store, WindowStats, current
from optlab.store import database as database_module
from optlab.store.models import metadata
from tests.support import storebuild
from tests.support.capabilities import lacks
from tests.support.storebuild import alembic_cfg, save_baseline, start_run

# SQLite always; PostgreSQL when OPTLAB_TEST_POSTGRES_URL is set (a database per test).
db_url = storebuild.db_url
store = storebuild.store
POSTGRES_ONLY = pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)

NUL_BODY = b"\x08\x02\x12\x00internal".decode()  # an HTTP 503's protobuf body, decoded


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def finish(store: Store, run_id: int, error_message: str | None = None) -> None:
    store.finish_run(
        run_id,
        RunFinal(
            status="FAILED" if error_message else "FINISHED",
            valid=error_message is None,
            requests=10,
            errors=0,
            qps=1.0,
            warmup_s=1.0,
            duration_s=5.0,
            error_message=error_message,
        ),
    )


def cli_run(url: str, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--db", url, *args], catch_exceptions=False)


# -- text every backend can store --------------------------------------------------------


def test_every_text_column_is_storable() -> None:
    # A plain String or Text column would let a NUL through to PostgreSQL again.
    plain = [
        f"{table.name}.{column.name}"
        for table in metadata.tables.values()
        for column in table.columns
        if isinstance(column.type, String)
    ]
    assert plain == []


def test_control_characters_cost_no_run(store: Store) -> None:
    name = "nul\x00name"
    saved = store.save_config(
        name=name,
        kind="baseline",
        parent=None,
        description="reference\x00 classifier\x1b[31m",
        hypothesis="tabs\tand\nnewlines\r stay",
        config={"k\x00ey": "v\x00al", "bell": "\x07", "surrogate": "\udcff"},
        config_hash="a" * 64,
        change=None,
        variable=None,
        parent_config_hash=None,
        source_path="experiments/\x01.yaml",
        source_hash="b" * 64,
    )
    # JSON escapes control characters itself: the config comes back exactly.
    assert store.get_config(saved.id).config == {
        "k\x00ey": "v\x00al",
        "bell": "\x07",
        "surrogate": "\udcff",
    }
    experiment = store.get_experiment(name)  # the lookup escapes the same way
    assert experiment is not None
    assert experiment.description == "reference\\x00 classifier\\x1b[31m"
    assert experiment.hypothesis == "tabs\tand\nnewlines\r stay"

    run_id = start_run(store, experiment=name)
    store.add_run_errors(run_id, [RunErrorCount("HTTP 503", 3, NUL_BODY)])
    finish(store, run_id, error_message="bad token b'ab\x00cd' \udc80")
    run = store.get_run(run_id)
    assert run.status == "FAILED"
    assert run.error_message == "bad token b'ab\\x00cd' \\udc80"
    assert [e.example for e in store.get_run_errors(run_id)] == ["\\x08\\x02\\x12\\x00internal"]


def test_diff_with_nul_in_the_description(db_url: str, chain_dir: Path) -> None:
    baseline = chain_dir / "baseline.yaml"
    text_ = baseline.read_text().replace(
        "description: reference image classifier", 'description: "reference\\0 classifier'
    )
    text_ = text_.replace("4 concurrent clients\n", '4 concurrent clients"\n', 1)
    baseline.write_text(text_)
    assert '"reference\\0 classifier' in baseline.read_text()
    result = cli_run(db_url, "diff", str(baseline))
    assert result.exit_code == 0, result.output
    with Store.open(db_url, read_only=True) as store:
        stored = store.get_experiment("baseline")
        assert stored is not None and stored.description is not None
        assert stored.description.startswith("reference\\x00 classifier")


# -- a damaged SQLite file ------------------------------------------------------------------


def _stored_database(path: Path, runs: int = 3) -> None:
    with Store.open(sqlite_url(path)) as store:
        save_baseline(store)
        for _ in range(runs):
            run_id = start_run(store)
            store.add_windows(
                run_id, [WindowStats("measure", t, 10, 0, 10.0, 1.0, 2.0) for t in range(300)]
            )
            finish(store, run_id)


def _overwrite(path: Path, offset: int, length: int = 2000) -> None:
    with path.open("r+b") as file:
        file.seek(offset)
        file.write(b"\xde\xad\xbe\xef" * (length // 4))


def test_damaged_file_is_refused_before_any_write(tmp_path: Path) -> None:
    path = tmp_path / "optlab.db"
    _stored_database(path)
    with sqlite3.connect(path) as raw:
        page_size = raw.execute("PRAGMA page_size").fetchone()[0]
        # A page of the windows table: nothing on open reads it, only quick_check does.
        page = raw.execute(
            "SELECT pageno FROM dbstat WHERE name = 'run_windows' AND pagetype = 'leaf' "
            "ORDER BY pageno LIMIT 1 OFFSET 2"
        ).fetchone()[0]
    _overwrite(path, (page - 1) * page_size + 8)
    before = path.read_bytes()

    with pytest.raises(StoreError) as refused:
        Store.open(sqlite_url(path))
    assert not isinstance(refused.value, StoreUnavailable)
    assert f"database {path} is damaged" in refused.value.message
    assert refused.value.hint is not None
    assert f'sqlite3 {path} ".recover" | sqlite3 repaired.db' in refused.value.hint
    assert "keep the original" in refused.value.hint
    assert path.read_bytes() == before  # not one byte written

    logged = cli_run(sqlite_url(path), "log")  # a reader needs no check: it writes nothing
    assert logged.exit_code == 0 and "FINISHED" in logged.output


def test_damage_met_by_a_read_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "optlab.db"
    _stored_database(path)
    with sqlite3.connect(path) as raw:
        page_size = raw.execute("PRAGMA page_size").fetchone()[0]
        page = raw.execute("SELECT rootpage FROM sqlite_master WHERE name = 'runs'").fetchone()[0]
    _overwrite(path, (page - 1) * page_size + 8, 400)

    result = CliRunner().invoke(cli, ["--db", sqlite_url(path), "log"])
    assert result.exit_code == 2, result.output
    assert f"optlab: database {path} is damaged" in result.output
    assert ".recover" in result.output and "unexpected error" not in result.output

    _overwrite(path, 0, 100)  # the header: "file is not a database"
    for args in (["log"], ["db", "current"]):
        result = CliRunner().invoke(cli, ["--db", sqlite_url(path), *args])
        assert result.exit_code == 2 and "is damaged: file is not a database" in result.output
    with pytest.raises(StoreError, match="is damaged: file is not a database"):
        Store.open(sqlite_url(path))


# -- read-only databases --------------------------------------------------------------------


@pytest.fixture
def read_only_media(tmp_path: Path) -> Iterator[Path]:
    """A folder nobody may write, holding a copy of tmp_path/optlab.db.

    Root ignores file modes, so as root it is a tmpfs remounted read-only (real read-only
    media; skipped where mounting is not allowed); as another user, a 0555 folder does.
    """
    folder = tmp_path / "media"
    folder.mkdir()
    try:
        if os.geteuid() != 0:
            shutil.copy(tmp_path / "optlab.db", folder)
            (folder / "optlab.db").chmod(0o444)
            folder.chmod(0o555)
        else:
            mounted = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=16m", "optlab-test", str(folder)],
                capture_output=True,
                text=True,
            )
            if mounted.returncode != 0:
                lacks(f"cannot mount a tmpfs as read-only media: {mounted.stderr.strip()}")
            shutil.copy(tmp_path / "optlab.db", folder)
            subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)
        yield folder
    finally:
        if os.path.ismount(folder):
            # Lazily: an engine the CLI left to the garbage collector may hold the file open.
            subprocess.run(["umount", "-l", str(folder)], check=False)
        folder.chmod(0o755)


@pytest.fixture
def stored_database(tmp_path: Path) -> Path:
    path = tmp_path / "optlab.db"
    _stored_database(path, runs=2)
    assert not path.with_name("optlab.db-wal").exists()  # closed cleanly, as one copies it
    return path


def test_read_commands_work_on_read_only_media(
    stored_database: Path, read_only_media: Path
) -> None:
    folder = read_only_media
    url = sqlite_url(folder / "optlab.db")

    logged = cli_run(url, "log", "--json")
    assert logged.exit_code == 0, logged.output
    assert [json.loads(line)["status"] for line in logged.output.splitlines()] == ["FINISHED"] * 2
    status = cli_run(url, "db", "current")
    assert status.exit_code == 0 and "up to date" in status.output
    with Store.open(url, read_only=True) as store:
        assert len(store.list_runs()) == 2

    # A command that writes is told what to do, not about a server.
    written = CliRunner().invoke(cli, ["--db", url, "db", "upgrade"])
    assert written.exit_code == 2
    assert f"database {folder / 'optlab.db'} is read-only" in written.output
    assert "copy it somewhere writable or use --db" in written.output.replace(
        " (with any -wal and -shm files next to it)", ""
    )
    assert "server" not in written.output
    assert sorted(p.name for p in folder.iterdir()) == ["optlab.db"]


def test_read_only_open_writes_nothing(db_url: str) -> None:
    with Store.open(db_url) as store:
        save_baseline(store)
    with Store.open(db_url, read_only=True) as store:
        assert store.get_experiment("baseline") is not None
        with pytest.raises(StoreError, match="is read-only") as refused:
            save_baseline(store, name="other", config_hash="c" * 64)
        assert not isinstance(refused.value, StoreUnavailable)
    with Store.open(db_url) as store:
        assert [e.name for e in store.list_experiments()] == ["baseline"]


def test_read_only_open_refuses_an_old_schema_without_upgrading(db_url: str) -> None:
    from alembic import command

    command.upgrade(alembic_cfg(db_url), "0001_initial")
    with pytest.raises(StoreError, match="this optlab needs") as refused:
        Store.open(db_url, read_only=True)
    assert refused.value.hint is not None and "optlab db upgrade" in refused.value.hint
    assert current(db_url).revision == "0001_initial"


def test_read_only_open_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "typo" / "optlab.db"
    with pytest.raises(StoreError, match=f"there is no optlab database at {path}"):
        Store.open(sqlite_url(path), read_only=True)
    assert not path.parent.exists()
    result = CliRunner().invoke(cli, ["--db", sqlite_url(path), "table"])
    assert result.exit_code == 2 and "there is no optlab database" in result.output


def test_a_folder_given_as_the_database(tmp_path: Path) -> None:
    for read_only in (False, True):
        with pytest.raises(StoreError) as refused:
            Store.open(sqlite_url(tmp_path), read_only=read_only)
        assert refused.value.message == f"database {tmp_path} is a folder, not a file"
        assert refused.value.hint is not None
        assert f"name a file, e.g. sqlite:///{tmp_path / 'optlab.db'}" in refused.value.hint


# -- transient failures: StoreUnavailable ---------------------------------------------------


def test_full_disk_is_unavailable_and_keeps_what_was_committed(tmp_path: Path) -> None:
    path = tmp_path / "optlab.db"
    store = Store.open(sqlite_url(path))
    save_baseline(store)
    run_id = start_run(store)
    store.add_windows(run_id, [WindowStats("measure", t, 1, 0, 1.0, 1.0, 1.0) for t in range(50)])

    @event.listens_for(store.engine, "connect")
    def _small_disk(dbapi_connection: Any, _record: Any) -> None:
        # A disk with two pages left: SQLite fails with SQLITE_FULL, as on a full disk.
        pages = dbapi_connection.execute("PRAGMA page_count").fetchone()[0]
        dbapi_connection.execute(f"PRAGMA max_page_count = {pages + 2}")

    store.engine.dispose()
    many = [WindowStats("warmup", t, 1, 0, 1.0, 1.0, 1.0) for t in range(5000)]
    with pytest.raises(StoreUnavailable) as refused:
        store.add_windows(run_id, many)
    store.close()
    assert f"database {path} cannot grow, the disk is full" in refused.value.message
    free_mb = shutil.disk_usage(path.parent).free / 1e6
    assert refused.value.hint is not None and "MB left" in refused.value.hint
    assert refused.value.hint.startswith("free space on /")
    mb_left = float(refused.value.hint.split("(")[1].split(" MB")[0])
    assert abs(mb_left - free_mb) < max(100.0, free_mb * 0.05)

    with Store.open(sqlite_url(path)) as reopened:
        assert len(reopened.get_windows(run_id)) == 50
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_a_lock_held_too_long_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "optlab.db"
    monkeypatch.setattr(database_module, "SQLITE_BUSY_TIMEOUT_MS", 200)
    writer = Store.open(sqlite_url(path))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with Store.open(sqlite_url(path), read_only=True) as reader:
            assert reader.list_runs() == []  # WAL: readers are not blocked
        with pytest.raises(StoreUnavailable, match=f"database {path} is locked") as refused:
            save_baseline(writer)
        assert refused.value.hint is not None and "run the command again" in refused.value.hint
    finally:
        holder.rollback()
        holder.close()
        writer.close()


def test_a_refused_connection_is_unavailable() -> None:
    with pytest.raises(StoreUnavailable, match="Connection refused") as refused:
        Store.open("postgresql+psycopg://optlab:secret@127.0.0.1:1/optlab")
    assert "127.0.0.1:1/optlab" in refused.value.message
    assert "secret" not in str(refused.value)


@POSTGRES_ONLY
def test_a_database_that_does_not_exist_is_not_unavailable(db_url: str) -> None:
    from sqlalchemy.engine import make_url

    missing = make_url(db_url).set(database="optlab_no_such_database")
    with pytest.raises(StoreError, match="does not exist") as refused:
        Store.open(missing.render_as_string(hide_password=False))
    assert not isinstance(refused.value, StoreUnavailable)


@POSTGRES_ONLY
def test_server_ending_a_session_is_unavailable_anywhere(db_url: str) -> None:
    store = Store.open(db_url)
    started = threading.Event()
    failures: list[BaseException] = []

    def long_query() -> None:
        # Through store.engine, not a Store method: analysis code meets the same errors.
        try:
            with store.engine.connect() as connection:
                started.set()
                connection.execute(text("SELECT pg_sleep(30)"))
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=long_query, daemon=True)
    thread.start()
    assert started.wait(10)
    admin = Store.open(db_url)
    deadline = time.monotonic() + 10
    with admin.engine.begin() as connection:
        while time.monotonic() < deadline:
            ended = connection.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE query = 'SELECT pg_sleep(30)' AND pid <> pg_backend_pid()"
                )
            ).scalar()
            if ended:
                break
            time.sleep(0.05)
    thread.join(10)
    admin.close()
    assert len(failures) == 1 and isinstance(failures[0], StoreUnavailable), failures
    assert "the server is shutting down" in str(failures[0])
    assert store.count_runs("baseline") == 0  # the pool replaced the dead connection
    store.close()


# -- processes racing to store the same new experiment ------------------------------------

WRITERS = 8
ROUNDS = 10


def _save_rounds(url: str, barrier: Any, results: Any) -> None:
    store = Store.open(url)
    try:
        for round_ in range(ROUNDS):
            barrier.wait(60)
            try:
                save_baseline(store, name=f"new-{round_}", config_hash=f"{round_:064d}")
                store.record_environment({"round": round_}, "m" * 64)
                results.put(None)
            except Exception as exc:
                results.put(f"{type(exc).__name__}: {exc}")
    finally:
        store.close()


def test_concurrent_first_saves_of_one_experiment(db_url: str) -> None:
    Store.open(db_url).close()  # the schema exists; the race is over the new rows
    # Forked from a server that imported optlab once: spawning, each writer imported it anew.
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    barrier, results = context.Barrier(WRITERS), context.Queue()
    writers = [
        context.Process(target=_save_rounds, args=(db_url, barrier, results))
        for _ in range(WRITERS)
    ]
    for writer in writers:
        writer.start()
    outcomes = [results.get(timeout=120) for _ in range(WRITERS * ROUNDS)]
    for writer in writers:
        writer.join(30)
        assert writer.exitcode == 0
    assert [o for o in outcomes if o is not None] == []
    with Store.open(db_url, read_only=True) as store:
        experiments = store.list_experiments()
        assert sorted(e.name for e in experiments) == sorted(f"new-{r}" for r in range(ROUNDS))
        assert all(e.current_config is not None for e in experiments)
    engine = database_module.make_engine(db_url, read_only=True)
    with engine.connect() as connection:
        configs = connection.execute(text("SELECT count(*) FROM experiment_configs")).scalar()
        environments = connection.execute(text("SELECT count(*) FROM environments")).scalar()
    engine.dispose()
    assert (configs, environments) == (ROUNDS, ROUNDS)
