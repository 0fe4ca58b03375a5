"""Store tests against real databases: SQLite always, PostgreSQL when
OPTLAB_TEST_POSTGRES_URL names a server (each test gets a database of its own there).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import delete, inspect, select, text, update
from sqlalchemy.exc import IntegrityError

from optlab.errors import NotFoundError, StoreError
from optlab.store import (
    SUMMARY_SCHEMA_VERSION,
    GpuSample,
    LatencyStats,
    ResourceSample,
    ResourceSummary,
    RunErrorCount,
    RunFinal,
    RunStatus,
    RunSummary,
    StageStatsRow,
    Store,
    WindowStats,
    current,
    default_url,
    migrations_dir,
    upgrade,
)
from optlab.store.database import make_engine
from optlab.store.models import SqlExperiment, SqlKnobSweep, SqlRun, SqlStageStats, metadata
from optlab.store.schema import head_revision
from tests.support import storebuild
from tests.support.legacy import old_experiment
from tests.support.proc import start_python
from tests.support.storebuild import HEAD, alembic_cfg, save_baseline, start_run

MEASUREMENT_TABLES = {"stage_stats", "run_windows", "resource_samples", "run_errors"}
CORE_TABLES = {"experiments", "experiment_configs", "environments", "runs"}


# -- fixtures -------------------------------------------------------------------------


db_url = storebuild.db_url
store = storebuild.store


def table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())
    finally:
        engine.dispose()


def execute(url: str, sql: str, **params: object) -> None:
    engine = make_engine(url)  # creates the SQLite file's folder, like Store.open
    try:
        with engine.begin() as connection:
            connection.execute(text(sql), params)
    finally:
        engine.dispose()


TOTAL_ROW = StageStatsRow(
    "total",
    "measure",
    1200,
    "HISTOGRAM",
    mean_ms=3.4,
    p50_ms=3.1,
    p95_ms=8.0,
    p99_ms=9.4,
    p999_ms=11.0,
    max_ms=12.5,
)
TOTAL = LatencyStats(p50=3.1, p95=8.0, p99=9.4, p999=11.0, max=12.5, mean=3.4, count=1200)
REASON = "duration 5 s is under the 600 s minimum"


def finished_summary(run_id: int, **changes: Any) -> RunSummary:
    """A run's summary whose facts are those `final_of` stores in its columns, its total
    latency TOTAL_ROW's and its errors three timeouts."""
    summary = RunSummary(
        run_id=run_id,
        experiment="baseline",
        status="FINISHED",
        valid=False,
        provisional=True,
        reasons=(REASON,),
        notes=("closed loop: latency is measured from the actual send",),
        protocol="quick",
        load="closed",
        requests=1200,
        errors=3,
        errors_by_type={"timeout": 3},
        qps=240.5,
        warmup_s=1.5,
        duration_s=5.0,
        latency_ms={"total": TOTAL},
        resources=ResourceSummary(samples=5, rss_peak_bytes=2**27),
        who="ci@runner",
        target={"batching": {"mean_batch_size": 3.5}},
    )
    return RunSummary.model_validate(summary.model_dump() | changes)


def final_of(summary: RunSummary | None) -> RunFinal:
    return RunFinal(
        status=RunStatus.FINISHED,
        valid=False,
        reasons=(REASON,),
        requests=1200,
        errors=3,
        qps=240.5,
        warmup_s=1.5,
        duration_s=5.0,
        summary=summary,
    )


def stored_summary(store: Store, run_id: int) -> dict[str, Any]:
    with store.engine.connect() as connection:
        query = text("SELECT summary_json FROM runs WHERE id = :id")
        found: dict[str, Any] = json.loads(connection.execute(query, {"id": run_id}).scalar_one())
    return found


def run_threads(threads: list[threading.Thread], timeout_s: float = 120) -> None:
    """Start and join; a deadlock fails the test instead of hanging the suite."""
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
        assert not thread.is_alive(), "a thread is still running: deadlock?"


# -- schema lifecycle -----------------------------------------------------------------


def test_new_database_is_created_at_head(db_url: str) -> None:
    with Store.open(db_url):
        pass
    status = current(db_url)
    assert status.revision == head_revision() == HEAD
    assert status.up_to_date
    assert CORE_TABLES | MEASUREMENT_TABLES | {"alembic_version"} <= table_names(db_url)


def test_sqlite_gets_wal_foreign_keys_and_busy_timeout(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "optlab.db"
    with Store.open(f"sqlite:///{path}") as store, store.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
    assert path.exists()
    # WAL is a property of the file: a plain sqlite3 connection sees it too.
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_models_and_migrations_agree(store: Store) -> None:
    with store.engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, metadata) == []


def test_every_constraint_and_index_is_named(store: Store) -> None:
    with store.engine.connect() as connection:
        inspector = inspect(connection)
        for table in CORE_TABLES | MEASUREMENT_TABLES:
            assert inspector.get_pk_constraint(table)["name"] == f"pk_{table}"
            for foreign_key in inspector.get_foreign_keys(table):
                assert str(foreign_key["name"]).startswith(f"fk_{table}_")
            for unique in inspector.get_unique_constraints(table):
                assert str(unique["name"]).startswith(f"uq_{table}_")
            for check in inspector.get_check_constraints(table):
                assert str(check["name"]).startswith(f"ck_{table}_")
            for index in inspector.get_indexes(table):
                # PostgreSQL also lists the index behind each unique constraint.
                assert str(index["name"]).startswith((f"ix_{table}_", f"uq_{table}_"))
        foreign_keys = {fk["name"] for fk in inspector.get_foreign_keys("experiments")}
        assert "fk_experiments_current_config_id_experiment_configs" in foreign_keys


def test_downgrade_to_base_and_up_again(db_url: str) -> None:
    with Store.open(db_url) as store:
        save_baseline(store)
        start_run(store)
    cfg = alembic_cfg(db_url)
    command.downgrade(cfg, "base")
    assert table_names(db_url) <= {"alembic_version"}
    command.upgrade(cfg, "head")
    with Store.open(db_url) as store:
        assert store.get_experiment("baseline") is None


def test_older_revision_is_refused_until_upgraded(db_url: str) -> None:
    command.upgrade(alembic_cfg(db_url), "0001_initial")
    assert not MEASUREMENT_TABLES & table_names(db_url)
    execute(
        db_url,
        "INSERT INTO experiments (name, kind, description, created_at, updated_at) "
        "VALUES ('old-baseline', 'baseline', 'from 0001', :t, :t)",
        t="2024-05-01 12:00:00.000000",
    )

    with pytest.raises(StoreError) as refused:
        Store.open(db_url)
    assert f"schema revision 0001_initial, this optlab needs {HEAD}" in str(refused.value)
    assert refused.value.hint is not None and "optlab db upgrade" in refused.value.hint
    assert current(db_url).revision == "0001_initial"
    assert not current(db_url).up_to_date

    assert upgrade(db_url) == ("0001_initial", HEAD)
    with Store.open(db_url) as store:
        survivor = store.get_experiment("old-baseline")
        assert survivor is not None
        assert survivor.description == "from 0001"
        assert survivor.created_at.tzinfo is not None
    assert upgrade(db_url) == (HEAD, HEAD)


def test_newer_revision_is_refused(db_url: str) -> None:
    Store.open(db_url).close()
    execute(db_url, "UPDATE alembic_version SET version_num = '9999_future'")
    with pytest.raises(StoreError) as refused:
        Store.open(db_url)
    assert "newer optlab" in str(refused.value)
    assert refused.value.hint is not None and "upgrade optlab" in refused.value.hint
    with pytest.raises(StoreError, match="newer optlab"):
        upgrade(db_url)
    status = current(db_url)
    assert status.revision == "9999_future" and not status.up_to_date


def test_foreign_database_is_refused(db_url: str) -> None:
    execute(db_url, "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total INTEGER)")
    with pytest.raises(StoreError, match="not an optlab database"):
        Store.open(db_url)
    with pytest.raises(StoreError, match="not an optlab database"):
        upgrade(db_url)
    assert "experiments" not in table_names(db_url)


def test_foreign_sqlite_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE notes (body TEXT)")
    with pytest.raises(StoreError, match="not an optlab database") as refused:
        Store.open(f"sqlite:///{path}")
    assert refused.value.hint is not None


def test_unreachable_server_names_url_without_password() -> None:
    url = "postgresql+psycopg://optlab:s3cret@127.0.0.1:1/optlab"
    with pytest.raises(StoreError) as refused:
        Store.open(url)
    message = str(refused.value)
    assert "127.0.0.1:1/optlab" in message and "***" in message
    assert "s3cret" not in message
    assert refused.value.hint is not None


def test_unusable_sqlite_path_is_a_store_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreError, match="cannot create the directory"):
        Store.open(f"sqlite:///{blocker / 'optlab.db'}")


def test_bad_url_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="cannot parse database URL"):
        Store.open("not a url")


def test_default_url_honours_optlab_db(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPTLAB_DB", "postgresql+psycopg://u@h/db")
    assert default_url() == "postgresql+psycopg://u@h/db"
    monkeypatch.delenv("OPTLAB_DB")
    monkeypatch.chdir(tmp_path)
    assert default_url() == f"sqlite:///{tmp_path / '.optlab' / 'optlab.db'}"
    with Store.open() as store:
        assert store.url == default_url()
    assert (tmp_path / ".optlab" / "optlab.db").exists()


def test_current_does_not_create_a_missing_sqlite_file(tmp_path: Path) -> None:
    path = tmp_path / "missing" / "optlab.db"
    status = current(f"sqlite:///{path}")
    assert status.revision is None and not status.up_to_date
    assert not path.parent.exists()


def test_migrations_dir_is_the_repository_folder() -> None:
    found = migrations_dir()
    assert (found / "env.py").is_file()
    assert {p.name for p in (found / "versions").glob("*.py")} >= {
        "0001_initial.py",
        "0002_measurements.py",
        "0003_service_resources.py",
        "0004_run_uid.py",
        "0005_load_and_noise.py",
        "0006_versioned_summary.py",
        "0007_sweeps.py",
        "0008_reason_codes.py",
        "0009_sweep_slo_json.py",
        "0010_llm_windows.py",
        "0011_knob_sweeps.py",
    }


# -- session scope --------------------------------------------------------------------


def test_session_scope_commits(store: Store) -> None:
    with store.session_scope() as session:
        now = datetime.now(UTC)
        session.add(SqlExperiment(name="direct", kind="baseline", created_at=now))
    assert store.get_experiment("direct") is not None


def test_session_scope_rolls_back_on_exception(store: Store) -> None:
    with pytest.raises(RuntimeError, match="boom"), store.session_scope() as session:
        session.add(SqlExperiment(name="doomed", kind="baseline"))
        session.flush()  # really sent to the database, then rolled back
        raise RuntimeError("boom")
    assert store.get_experiment("doomed") is None


def test_check_constraints_hold(store: Store) -> None:
    save_baseline(store)
    run_id = start_run(store)
    with pytest.raises(IntegrityError), store.session_scope() as session:
        session.execute(update(SqlRun).where(SqlRun.id == run_id).values(status="PAUSED"))
    with pytest.raises(IntegrityError), store.session_scope() as session:
        session.add(SqlExperiment(name="orphan-step", kind="step"))  # a step needs a parent


# -- experiments and configs ----------------------------------------------------------


def test_save_and_get_experiment_configs(store: Store) -> None:
    assert store.get_experiment("baseline") is None
    first_id = save_baseline(store)
    baseline = store.get_experiment("baseline")
    assert baseline is not None
    assert (baseline.kind, baseline.parent, baseline.description) == (
        "baseline",
        None,
        "reference classifier",
    )
    assert baseline.current_config is not None
    assert baseline.current_config.id == first_id
    assert baseline.current_config.config["knobs"] == {"precision": "fp32", "threads": 2}
    assert baseline.current_config.created_at.tzinfo is not None

    # The same config again is the same row; a different one becomes current.
    assert save_baseline(store) == first_id
    second_id = save_baseline(store, config_hash="c" * 64)
    assert second_id != first_id
    refreshed = store.get_experiment("baseline")
    assert refreshed is not None and refreshed.current_config is not None
    assert refreshed.current_config.id == second_id
    assert store.get_config(first_id).config_hash == "a" * 64

    step = store.save_config(
        name="dynamic-batch",
        kind="step",
        parent="baseline",
        description=None,
        hypothesis="QPS up, P99 within SLO",
        config={"knobs": {"batching": {"mode": "dynamic", "max_batch_size": 8}}},
        config_hash="d" * 64,
        change={"batching": {"mode": "dynamic", "max_batch_size": 8}},
        variable="batching",
        parent_config_hash="c" * 64,
        source_path="experiments/01-dynamic-batch.yaml",
        source_hash="e" * 64,
    )
    assert (step.experiment, step.variable, step.parent_config_hash) == (
        "dynamic-batch",
        "batching",
        "c" * 64,
    )
    assert step.change == {"batching": {"mode": "dynamic", "max_batch_size": 8}}
    record = store.get_experiment("dynamic-batch")
    assert record is not None
    assert (record.parent, record.hypothesis) == ("baseline", "QPS up, P99 within SLO")
    assert [e.name for e in store.list_experiments()] == ["baseline", "dynamic-batch"]


def test_save_config_refuses_inconsistent_input(store: Store) -> None:
    save_baseline(store)
    common: dict[str, Any] = {
        "description": None,
        "hypothesis": None,
        "config": {},
        "config_hash": "f" * 64,
        "change": {},
        "variable": "x",
        "parent_config_hash": None,
        "source_path": "x.yaml",
        "source_hash": "0" * 64,
    }
    with pytest.raises(NotFoundError):
        store.save_config(name="s", kind="step", parent="nope", **common)
    with pytest.raises(ValueError, match="baseline has no parent"):
        store.save_config(name="s", kind="step", parent=None, **common)
    with pytest.raises(ValueError, match="kind"):
        store.save_config(name="s", kind="leaf", parent=None, **common)
    store.save_config(name="s1", kind="step", parent="baseline", **common)
    store.save_config(name="s2", kind="step", parent="s1", **common)
    with pytest.raises(ValueError, match="own ancestor"):
        store.save_config(name="s1", kind="step", parent="s2", **common)
    s1 = store.get_experiment("s1")
    assert s1 is not None and s1.parent == "baseline"


def test_count_runs(store: Store) -> None:
    assert store.count_runs("baseline") == 0
    save_baseline(store)
    assert store.count_runs("baseline") == 0
    start_run(store)
    start_run(store, repeat=True)
    assert store.count_runs("baseline") == 2
    assert store.count_runs("unknown") == 0


def test_record_environment_dedupes(store: Store) -> None:
    fingerprint = {"cpu": {"model": "Xeon", "cores": 16}, "gpu": None, "torch": "2.3.0"}
    first = store.record_environment(fingerprint, material_hash="m" * 64)
    reordered = {"torch": "2.3.0", "gpu": None, "cpu": {"cores": 16, "model": "Xeon"}}
    assert store.record_environment(reordered, material_hash="m" * 64) == first
    other = store.record_environment({**fingerprint, "hostname": "b"}, material_hash="m" * 64)
    assert other != first
    environment = store.get_environment(first)
    assert environment.fingerprint == fingerprint
    assert environment.material_hash == "m" * 64
    assert len(environment.fingerprint_hash) == 64
    with pytest.raises(NotFoundError):
        store.get_environment(999_999)


# -- runs -----------------------------------------------------------------------------


def test_run_lifecycle(store: Store) -> None:
    config_id = save_baseline(store)
    environment_id = store.record_environment({"os": "linux"}, material_hash="m" * 64)
    run_id = start_run(store, environment_id=environment_id, git_dirty=None, git_commit=None)

    run = store.get_run(run_id)
    assert (run.experiment, run.config_id, run.config_hash) == ("baseline", config_id, "a" * 64)
    assert (run.status, run.provisional, run.repeat) == ("RUNNING", True, False)
    assert (run.environment_id, run.git_commit, run.git_dirty) == (environment_id, None, None)
    assert run.pid == os.getpid() and run.hostname
    assert run.protocol == {"name": "quick", "duration_s": 5}
    assert run.code_identity == {"target": "builtin:image-classifier"}
    assert run.started_at == run.heartbeat_at and run.started_at.tzinfo is not None
    assert run.finished_at is None and run.reasons == () and run.summary is None

    store.heartbeat(run_id)
    assert store.get_run(run_id).heartbeat_at > run.started_at

    store.add_stage_stats(run_id, [TOTAL_ROW, replace(TOTAL_ROW, phase="warmup")])
    store.add_run_errors(run_id, [RunErrorCount("timeout", 3, "read timed out")])
    summary = finished_summary(run_id)
    store.finish_run(run_id, final_of(summary))
    done = store.get_run(run_id)
    assert (done.status, done.valid, done.requests, done.errors) == ("FINISHED", False, 1200, 3)
    assert done.reasons == ("duration 5 s is under the 600 s minimum",)
    assert (done.qps, done.warmup_s, done.duration_s) == (240.5, 1.5, 5.0)
    assert done.summary == summary and done.error_message is None
    assert done.summary.total.p99 == 9.4 and done.summary.errors_by_type == {"timeout": 3}
    assert done.finished_at is not None and done.finished_at >= done.started_at

    failed_id = start_run(store, provisional=False, protocol_name="full", repeat=True)
    store.finish_run(
        failed_id,
        RunFinal(status="FAILED", error_message="target crashed: CUDA out of memory"),
    )
    failed = store.get_run(failed_id)
    assert (failed.status, failed.repeat, failed.provisional) == ("FAILED", True, False)
    assert failed.error_message == "target crashed: CUDA out of memory"

    assert [r.id for r in store.list_runs()] == [run_id, failed_id]
    assert [r.id for r in store.list_runs("baseline")] == [run_id, failed_id]
    assert store.list_runs("nothing") == []


def test_a_summary_is_stored_once(store: Store) -> None:
    """The stored summary holds what no column or measurement row holds, and reads back whole."""
    save_baseline(store)
    run_id = start_run(store)
    store.add_stage_stats(run_id, [TOTAL_ROW, replace(TOTAL_ROW, stage="send_lag", p50_ms=0.1)])
    store.add_run_errors(run_id, [RunErrorCount("timeout", 3)])
    lag = LatencyStats(p50=0.1, p95=8.0, p99=9.4, p999=11.0, max=12.5, mean=3.4, count=1200)
    summary = finished_summary(run_id, harness_ms={"send_lag": lag})
    store.finish_run(run_id, final_of(summary))

    stored = stored_summary(store, run_id)
    assert stored["schema_version"] == SUMMARY_SCHEMA_VERSION == 3
    assert (stored["latency_stages"], stored["harness_stages"]) == (["total"], ["send_lag"])
    copies = {"run_id", "experiment", "status", "valid", "reasons", "qps", "requests", "errors"}
    assert not (copies | {"latency_ms", "harness_ms", "errors_by_type", "warmup_s"}) & set(stored)
    assert stored["target"] == {"batching": {"mean_batch_size": 3.5}} and "parent" not in stored
    read = store.get_run(run_id).summary
    assert read == summary and read == store.list_runs()[0].summary
    assert read.target_figure("batching", "mean_batch_size") == 3.5
    assert read.harness_ms["send_lag"].p50 == 0.1 and read.stages == {}
    # `run --json`'s shape: no schema_version, no absent sections.
    shown = read.to_json()
    assert list(shown)[:6] == ["run_id", "experiment", "status", "valid", "provisional", "reasons"]
    assert "schema_version" not in shown and "parent" not in shown and "accuracy" not in shown
    assert shown["latency_ms"]["total"] == {
        "p50": 3.1, "p95": 8.0, "p99": 9.4, "p999": 11.0, "max": 12.5, "mean": 3.4, "count": 1200
    }  # fmt: skip
    assert RunSummary.from_json(read.to_bundle()) == read == RunSummary.from_json(shown)


def test_a_summary_its_rows_do_not_reproduce_keeps_its_figures(store: Store) -> None:
    save_baseline(store)
    run_id = start_run(store)  # no stage rows, no error rows
    summary = finished_summary(run_id)
    store.finish_run(run_id, final_of(summary))
    stored = stored_summary(store, run_id)
    assert stored["latency_ms"]["total"]["p99"] == 9.4 and stored["errors_by_type"] == {
        "timeout": 3
    }
    assert "latency_stages" not in stored and "qps" not in stored
    assert store.get_run(run_id).summary == summary


def test_a_summary_of_another_version_or_shape_is_refused() -> None:
    good = finished_summary(1).to_bundle()
    with pytest.raises(ValueError, match="schema_version 4"):
        RunSummary.from_json({**good, "schema_version": 4})
    with pytest.raises(ValueError, match="colour"):
        RunSummary.from_json({**good, "colour": "red"})
    with pytest.raises(ValueError, match="JSON object"):
        RunSummary.from_json([good])


# A summary as optlab stored it before 0006: unversioned, every figure a copy.
V1_TOTAL = {"p50": 3.1, "p95": 8.0, "p99": 9.4, "p999": 11.0, "max": 12.5, "mean": 3.4}
V1_SUMMARY: dict[str, Any] = {
    "run_id": 1,
    "experiment": "old",
    "status": "FINISHED",
    "valid": True,
    "provisional": True,
    "reasons": [],
    "notes": ["closed loop: latency is measured from the actual send"],
    "protocol": "quick",
    "load": "closed",
    "requests": 1200,
    "errors": 3,
    "errors_by_type": {"timeout": 3},
    "qps": 240.5,
    "warmup_s": 1.5,
    "duration_s": 5.0,
    "latency_ms": {"total": {**V1_TOTAL, "count": 1200}},
    "harness_ms": {"send_lag": {**V1_TOTAL, "p50": 0.1, "count": 1200}},
    # As before 0003: no service resources.
    "resources": {"samples": 5, "cpu_process_pct": {"mean": 50.0, "max": 6.0}, "rss_peak_bytes": 7},
    "who": "ci@runner",
}  # fmt: skip


def _old_database(url: str) -> None:
    """Three runs at 0005: one whose rows hold its figures, one imported from another database
    (its summary's run_id is that database's) whose rows do not, and one RUNNING."""
    command.upgrade(alembic_cfg(url), "0005_load_and_noise")
    at = "2026-11-30 12:00:00+00:00"
    imported = {**V1_SUMMARY, "run_id": 41, "errors_by_type": {"HTTP 500": 3}}
    engine = make_engine(url)
    with engine.begin() as connection:
        old_experiment(connection, at)
        for uid, status, summary in (
            ("a" * 32, "FINISHED", V1_SUMMARY),
            ("b" * 32, "FINISHED", imported),
            ("c" * 32, "RUNNING", None),
        ):
            connection.execute(
                text(
                    "INSERT INTO runs (uid, experiment_id, config_id, status, protocol_name, "
                    "protocol_json, provisional, repeat, code_identity_json, hostname, pid, "
                    "started_at, heartbeat_at, reasons_json, valid, requests, errors, qps, "
                    "warmup_s, duration_s, summary_json) VALUES (:uid, 1, 1, :status, 'quick', "
                    "'{}', :yes, :no, '{}', 'h', 1, :at, :at, '[]', :yes, 1200, 3, 240.5, "
                    "1.5004, 5.0, :summary)"
                ),
                {
                    "uid": uid,
                    "status": status,
                    "at": at,
                    "yes": True,
                    "no": False,
                    "summary": None if summary is None else json.dumps(summary, sort_keys=True),
                },
            )
        for stage, p50 in (("total", 3.1), ("send_lag", 0.1)):
            for phase in ("warmup", "measure"):
                connection.execute(
                    text(
                        "INSERT INTO stage_stats (run_id, stage, phase, count, mean_ms, p50_ms, "
                        "p95_ms, p99_ms, p999_ms, max_ms, histogram) VALUES (1, :stage, "
                        ":phase, 1200, 3.4, :p50, 8.0, 9.4, 11.0, 12.5, 'h')"
                    ),
                    {"stage": stage, "phase": phase, "p50": p50 if phase == "measure" else 99.0},
                )
        for run_id in (1, 2):  # the imported run's rows say "timeout", its summary "HTTP 500"
            connection.execute(
                text(
                    "INSERT INTO run_errors (run_id, error_type, count) VALUES (:r, 'timeout', 3)"
                ),
                {"r": run_id},
            )
    engine.dispose()


def test_0006_versions_old_summaries_and_stores_each_figure_once(db_url: str) -> None:
    _old_database(db_url)
    assert upgrade(db_url) == ("0005_load_and_noise", HEAD)
    with Store.open(db_url) as store:
        first, second, running = store.list_runs()
        assert first.summary == RunSummary.from_json(V1_SUMMARY)
        assert first.summary.resources.service_cpu_pct is None
        stored = stored_summary(store, first.id)
        assert stored["schema_version"] == 2 and stored["harness_stages"] == ["send_lag"]
        assert not {"latency_ms", "errors_by_type", "run_id", "qps", "warmup_s"} & set(stored)
        # The imported run: its own id now; the figures its rows lack stay in its summary.
        assert second.summary is not None and second.summary.run_id == second.id == 2
        assert second.summary.total.p99 == 9.4
        assert second.summary.errors_by_type == {"HTTP 500": 3}
        assert {"latency_ms", "errors_by_type"} <= set(stored_summary(store, second.id))
        assert running.summary is None
        # Measurements untouched: `runs` was updated in place, never rebuilt.
        assert len(store.get_stage_stats(first.id)) == 4

    command.downgrade(alembic_cfg(db_url), "0005_load_and_noise")
    engine = make_engine(db_url)
    with engine.connect() as connection:
        rows = connection.execute(text("SELECT summary_json FROM runs ORDER BY id")).scalars()
        old = [None if value is None else json.loads(value) for value in rows]
    engine.dispose()
    assert old[0] == V1_SUMMARY
    assert old[1] == {**V1_SUMMARY, "run_id": 2, "errors_by_type": {"HTTP 500": 3}}
    assert old[2] is None
    assert upgrade(db_url) == ("0005_load_and_noise", HEAD)


OLD_REASONS = [
    "interrupted after 4.0 s of 10 s",
    "612 successful queries: P99 needs at least 662 (MLPerf's bound at 0.99 confidence)",
    "the load generator fell behind its schedule (send-lag P99 25.00 ms)",
    "the load generator fell behind: of 4 clients only 1.2 were inside a call on average",
    "duration 5 s is under the 600 s minimum",  # a wording no rule writes: `other`
]


def _database_at_0007(url: str) -> None:
    """At 0007: a run with reasons, a run without that is the level of a finished sweep whose
    capacity is in its column and its result, and a RUNNING sweep with neither."""
    command.upgrade(alembic_cfg(url), "0007_sweeps")
    at = "2026-12-01 12:00:00+00:00"
    engine = make_engine(url)
    with engine.begin() as connection:
        old_experiment(connection, at)
        for uid, reasons in (("a" * 32, OLD_REASONS), ("b" * 32, [])):
            connection.execute(
                text(
                    "INSERT INTO runs (uid, experiment_id, config_id, status, protocol_name, "
                    "protocol_json, provisional, repeat, code_identity_json, hostname, pid, "
                    "started_at, heartbeat_at, reasons_json, valid) VALUES (:uid, 1, 1, "
                    "'FINISHED', 'quick', '{}', :no, :no, '{}', 'h', 1, :at, :at, :reasons, :no)"
                ),
                {"uid": uid, "at": at, "no": False, "reasons": json.dumps(reasons)},
            )
        result = {"capacity_qps": 75.0, "limited_by": "slo", "message": "m", "method": "x"}
        for uid, status, capacity, stored in (
            ("c" * 32, "FINISHED", 75.0, json.dumps(result)),
            ("d" * 32, "RUNNING", None, None),
        ):
            connection.execute(
                text(
                    "INSERT INTO sweeps (uid, experiment_id, config_id, status, mode, "
                    "slo_percentile, slo_ms, protocol_json, strategy_json, code_identity_json, "
                    "hostname, pid, started_at, capacity_qps, result_json) VALUES (:uid, 1, 1, "
                    ":status, 'open', 'p99', 60.0, '{}', '{}', '{}', 'h', 1, :at, :capacity, "
                    ":result)"
                ),
                {"uid": uid, "status": status, "at": at, "capacity": capacity, "result": stored},
            )
        connection.execute(
            text(
                "INSERT INTO sweep_levels (sweep_id, position, run_id, mode, load, purpose, "
                "reused) VALUES (1, 0, 2, 'open', 50.0, 'growth', :no)"
            ),
            {"no": False},
        )
    engine.dispose()


def test_0008_codes_stored_reasons_and_keeps_the_capacity_once(db_url: str) -> None:
    _database_at_0007(db_url)
    assert upgrade(db_url) == ("0007_sweeps", HEAD)
    with Store.open(db_url) as store:
        coded, level = store.get_run(1), store.get_run(2)
        assert coded.reasons == tuple(OLD_REASONS)  # the texts as they were
        assert coded.reason_codes == (
            "interrupted", "few-queries", "generator-behind", "clients-held-up", "other",
        )  # fmt: skip
        assert coded.reason("clients-held-up") == coded.verdict_reasons[3]
        assert level.reasons == level.reason_codes == () and level.reason("saturated") is None
        finished, running = store.list_sweeps()
        assert finished.result is not None and finished.result.capacity_qps == 75.0
        assert [lv.run_id for lv in finished.levels] == [2]  # sweeps was not rebuilt
        assert running.result is None
        # A run stored now keeps its codes beside its texts.
        new = start_run(store, experiment="old")
        final = RunFinal(
            status="FINISHED", reasons=("unstable: x", "y"), reason_codes=("unstable",)
        )
        store.finish_run(new, final)
        assert store.get_run(new).reason_codes == ("unstable", "other")
    engine = make_engine(db_url)
    with engine.connect() as connection:
        columns = {c["name"] for c in inspect(connection).get_columns("sweeps")}
    engine.dispose()
    assert "capacity_qps" not in columns

    command.downgrade(alembic_cfg(db_url), "0007_sweeps")
    engine = make_engine(db_url)
    with engine.connect() as connection:
        capacities = connection.execute(text("SELECT capacity_qps FROM sweeps ORDER BY id"))
        assert list(capacities.scalars()) == [75.0, None]
        columns = {c["name"] for c in inspect(connection).get_columns("runs")}
        levels = connection.execute(text("SELECT count(*) FROM sweep_levels")).scalar_one()
    engine.dispose()
    assert "reason_codes_json" not in columns and levels == 1
    assert upgrade(db_url) == ("0007_sweeps", HEAD)


def test_run_errors_for_bad_input(store: Store) -> None:
    with pytest.raises(NotFoundError, match="not in the database"):
        start_run(store, experiment="ghost")
    save_baseline(store)
    run_id = start_run(store)
    with pytest.raises(ValueError, match="finishes as one of"):
        store.finish_run(run_id, RunFinal(status="RUNNING"))
    with pytest.raises(NotFoundError):
        store.get_run(run_id + 100)
    with pytest.raises(NotFoundError):
        store.heartbeat(run_id + 100)
    with pytest.raises(NotFoundError):
        store.add_windows(run_id + 100, [WindowStats("measure", 0, 1, 0, 1.0)])


def test_mark_crashed(store: Store) -> None:
    save_baseline(store)
    stale, fresh, finished = start_run(store), start_run(store), start_run(store)
    store.finish_run(finished, RunFinal(status="KILLED"))
    long_ago = datetime.now(UTC) - timedelta(hours=2)
    with store.session_scope() as session:
        session.execute(
            update(SqlRun).where(SqlRun.id.in_([stale, finished])).values(heartbeat_at=long_ago)
        )

    assert store.mark_crashed(stale_after_s=600) == [stale]
    crashed = store.get_run(stale)
    assert crashed.status == "CRASHED"
    assert crashed.error_message is not None and "no heartbeat since" in crashed.error_message
    assert store.get_run(fresh).status == "RUNNING"
    assert store.get_run(finished).status == "KILLED"
    assert store.mark_crashed(stale_after_s=600) == []


# -- measurements ---------------------------------------------------------------------


def test_measurements_round_trip(store: Store) -> None:
    save_baseline(store)
    run_id = start_run(store)

    stages = [
        StageStatsRow(
            stage="total",
            phase="measure",
            count=1200,
            histogram="HISTFAAAACl4nJNpmSzMwMDAxQABzFCaEUzOmMBgXwPkA",
            min_ms=0.9,
            mean_ms=3.3,
            stddev_ms=0.7,
            p50_ms=3.1,
            p90_ms=4.2,
            p95_ms=5.0,
            p99_ms=9.4,
            p999_ms=12.5,
            max_ms=13.0,
        ),
        StageStatsRow(stage="forward", phase="warmup", count=0, histogram="HISTFAAAAB..."),
    ]
    store.add_stage_stats(run_id, stages)
    assert store.get_stage_stats(run_id) == stages
    assert store.get_stage_stats(run_id, phase="warmup") == stages[1:]

    windows = [
        WindowStats("measure", 1, 240, 0, 240.0, 3.0, 9.0, 0.2),
        WindowStats("warmup", 0, 100, 1, 100.0, 4.0, 12.0),
        WindowStats("measure", 0, 0, 0, 0.0),  # nothing completed: no latency to report
    ]
    store.add_windows(run_id, windows)
    assert store.get_windows(run_id) == [windows[1], windows[2], windows[0]]
    assert store.get_windows(run_id, phase="measure") == [windows[2], windows[0]]

    gpu = GpuSample(
        index=0,
        util_pct=87.5,
        mem_used_bytes=20 * 2**30,
        mem_total_bytes=80 * 2**30,
        temperature_c=71.0,
        power_w=310.2,
        sm_clock_mhz=1980.0,
        throttle_reasons=("sw_power_cap",),
    )
    samples = [
        ResourceSample(
            phase="measure",
            t_s=0.5,
            cpu_process_pct=180.0,
            cpu_system_pct=45.5,
            cpu_per_core=(50.0, 41.0),
            rss_bytes=3 * 2**30,
            mem_used_bytes=12 * 2**30,
            mem_total_bytes=64 * 2**30,
            iowait_pct=0.1,
            gpus=(gpu, GpuSample(index=1)),
        ),
        ResourceSample(phase="warmup", t_s=0.0),  # nothing readable: every metric stays None
        ResourceSample(phase="measure", t_s=1.5, cpu_process_pct=170.0, gpus=()),
    ]
    store.add_resource_samples(run_id, samples)
    assert store.get_resource_samples(run_id) == [samples[1], samples[0], samples[2]]

    errors = [
        RunErrorCount("TimeoutError", 2, "no response within 1000 ms"),
        RunErrorCount("HTTP 503", 5),
    ]
    store.add_run_errors(run_id, errors)
    assert store.get_run_errors(run_id) == [errors[1], errors[0]]

    # Empty batches are fine and change nothing.
    store.add_windows(run_id, [])
    assert len(store.get_windows(run_id)) == 3


def test_measurement_input_is_checked(store: Store) -> None:
    save_baseline(store)
    run_id = start_run(store)
    with pytest.raises(ValueError, match="phase"):
        store.add_windows(run_id, [WindowStats("cooldown", 0, 1, 0, 1.0)])
    row = StageStatsRow(stage="total", phase="measure", count=1, histogram="h")
    store.add_stage_stats(run_id, [row])
    with pytest.raises(IntegrityError):
        store.add_stage_stats(run_id, [row])  # one row per (run, stage, phase)


def test_measurements_go_with_their_run(store: Store) -> None:
    save_baseline(store)
    run_id = start_run(store)
    store.add_stage_stats(run_id, [StageStatsRow("total", "measure", 1, "h")])
    store.add_windows(run_id, [WindowStats("measure", 0, 1, 0, 1.0)])
    store.add_resource_samples(run_id, [ResourceSample("measure", 0.0)])
    store.add_run_errors(run_id, [RunErrorCount("E", 1)])
    with store.session_scope() as session:
        session.execute(delete(SqlRun).where(SqlRun.id == run_id))
    with store.session_scope() as session:
        assert session.scalars(select(SqlStageStats)).all() == []
    assert store.get_windows(run_id) == []
    assert store.get_resource_samples(run_id) == []
    assert store.get_run_errors(run_id) == []


def test_naive_timestamps_are_refused(store: Store) -> None:
    with pytest.raises(Exception, match="naive datetime"), store.session_scope() as session:
        session.add(SqlExperiment(name="naive", kind="baseline", created_at=datetime(2024, 1, 1)))


def test_concurrent_writers_wait_instead_of_failing(db_url: str) -> None:
    # A runner's heartbeat thread and its measurement writes, plus a second process's
    # crash sweep, all write at once; none may fail with "database is locked".
    with Store.open(db_url) as setup:
        save_baseline(setup)
        run_ids = [start_run(setup) for _ in range(4)]
    failures: list[BaseException] = []

    def work(run_id: int) -> None:
        try:
            with Store.open(db_url) as store:
                for second in range(40):
                    store.heartbeat(run_id)
                    store.add_windows(run_id, [WindowStats("measure", second, 1, 0, 1.0)])
                    store.record_environment({"n": second % 5}, material_hash="m" * 64)
                    store.mark_crashed(stale_after_s=3600)
        except BaseException as exc:  # collected: a thread's exception would be lost
            failures.append(exc)

    run_threads([threading.Thread(target=work, args=(run_id,), daemon=True) for run_id in run_ids])
    assert failures == []
    with Store.open(db_url) as store:
        assert all(len(store.get_windows(run_id)) == 40 for run_id in run_ids)


def test_concurrent_first_opens_create_the_schema_once(db_url: str) -> None:
    failures: list[BaseException] = []

    def open_store() -> None:
        try:
            Store.open(db_url).close()
        except BaseException as exc:
            failures.append(exc)

    run_threads([threading.Thread(target=open_store, daemon=True) for _ in range(4)])
    assert failures == []
    assert current(db_url).up_to_date


def test_failed_upgrade_changes_nothing(db_url: str) -> None:
    command.upgrade(alembic_cfg(db_url), "0001_initial")
    # A table in the way makes 0002 fail after it has created the other three tables.
    execute(db_url, "CREATE TABLE run_errors (id INTEGER PRIMARY KEY)")
    with pytest.raises(StoreError, match="cannot upgrade database") as refused:
        upgrade(db_url)
    assert refused.value.hint is not None and "nothing was changed" in refused.value.hint
    assert current(db_url).revision == "0001_initial"
    assert not {"stage_stats", "run_windows", "resource_samples"} & table_names(db_url)


def test_window_series_of_many_runs_in_one_query(store: Store) -> None:
    save_baseline(store)
    first, second = start_run(store), start_run(store)
    store.add_windows(
        first,
        [
            WindowStats("measure", 1, 5, 0, 5.0, p50_ms=2.0, p99_ms=4.0),
            WindowStats("measure", 0, 3, 0, 3.0, p50_ms=None, p99_ms=None),  # nothing completed
            WindowStats("warmup", 0, 9, 0, 9.0, p50_ms=1.0, p99_ms=1.0),
        ],
    )
    store.add_windows(second, [WindowStats("measure", 0, 7, 0, 7.0, p50_ms=1.5, p99_ms=3.0)])
    series = store.window_series([first, second, 999_999], ("qps", "p50_ms"))
    assert series[first] == {"qps": [3.0, 5.0], "p50_ms": [2.0]}  # time order, None left out
    assert series[second] == {"qps": [7.0], "p50_ms": [1.5]}
    assert series[999_999] == {"qps": [], "p50_ms": []}
    assert store.window_series([], ("qps",)) == {}
    with pytest.raises(ValueError, match="unknown window fields"):
        store.window_series([first], ("qps; DROP TABLE runs",))


def test_a_run_whose_process_is_alive_on_this_host_is_never_marked_crashed(store: Store) -> None:
    # A target that takes minutes to build used to be marked CRASHED by the next `optlab run`
    # after 60 s of silence while its process was alive.
    from optlab.run.runner import process_alive

    save_baseline(store)
    alive, gone, reused = start_run(store), start_run(store), start_run(store)
    sleeper = start_python("import time; time.sleep(600)")  # killed below; alive till then
    finished = start_python("pass")
    finished.wait(60)
    long_ago = datetime.now(UTC) - timedelta(hours=2)
    with store.session_scope() as session:
        session.execute(
            update(SqlRun).where(SqlRun.id == alive).values(pid=sleeper.pid, heartbeat_at=long_ago)
        )
        session.execute(update(SqlRun).where(SqlRun.id == gone).values(pid=finished.pid))
        # A live pid that started after the run did: a reused pid, not the run's process.
        session.execute(
            update(SqlRun)
            .where(SqlRun.id == reused)
            .values(pid=sleeper.pid, started_at=long_ago, heartbeat_at=long_ago)
        )
    try:
        assert store.mark_crashed(stale_after_s=60, pid_alive=process_alive) == [gone, reused]
        assert store.get_run(alive).status == "RUNNING"
    finally:
        sleeper.kill()
        sleeper.wait()
    assert store.mark_crashed(stale_after_s=60, pid_alive=process_alive) == [alive]


# -- sweeps ---------------------------------------------------------------------------


def test_a_sweep_under_token_slos_keeps_every_bound(store: Store) -> None:
    from optlab.config.slo import parse_slo

    save_baseline(store)
    slo = parse_slo("ttft_p99=500ms,tpot_p99=50ms")
    sweep_id = store.create_sweep(
        experiment="baseline",
        mode="open",
        slo_percentile=slo.percentile,
        slo_ms=slo.ms,
        slo_json=slo.model_dump(mode="json"),
        protocol={"name": "quick"},
        strategy={},
        environment_id=None,
        code_identity={},
    )
    found = store.get_sweep(sweep_id).slo
    assert found == slo and found.key == "ttft_p99=500ms,tpot_p99=50ms"
    assert found.same_as(slo) and not found.same_as(parse_slo("ttft_p99=500ms"))
    assert not found.same_as(parse_slo("p99=500ms"))


def test_a_sweep_and_its_levels_round_trip_and_levels_stay_out_of_run_lists(
    store: Store,
) -> None:
    from optlab.store import RunFinal, SweepLevelTag, SweepResult

    save_baseline(store)
    ordinary = start_run(store)
    sweep_id = store.create_sweep(
        experiment="baseline",
        mode="open",
        slo_percentile="p99",
        slo_ms=60.0,
        protocol={"name": "quick", "duration_s": 5},
        strategy={"tolerance": 0.05},
        environment_id=None,
        code_identity={"target": "x"},
    )
    first = start_run(store, level=SweepLevelTag(sweep_id, 0, "open", 50.0, "growth"))
    second = start_run(store, level=SweepLevelTag(sweep_id, 1, "open", 100.0, "growth"))
    store.finish_run(first, RunFinal(status="FINISHED", valid=True))
    store.relabel_level(sweep_id, 1, "sizing")
    result = SweepResult(
        capacity_qps=75.0, limited_by="slo", message="capacity 75/s", method="by the test"
    )
    store.finish_sweep(sweep_id, status="FINISHED", result=result, measured_s=12.5)
    # A later sweep reuses the first level.
    later = store.create_sweep(
        experiment="baseline",
        mode="open",
        slo_percentile="p99",
        slo_ms=60.0,
        protocol={"name": "quick", "duration_s": 5},
        strategy={},
        environment_id=None,
        code_identity={"target": "x"},
    )
    store.add_sweep_level(later, 0, first, "open", 50.0, "growth")

    sweep = store.get_sweep(sweep_id)
    assert (sweep.status, sweep.result, sweep.measured_s) == ("FINISHED", result, 12.5)
    assert sweep.result is not None and sweep.result.capacity_qps == 75.0
    assert sweep.slo.key == "p99=60ms" and store.get_sweep(later).result is None
    assert [(lv.position, lv.run_id, lv.load, lv.purpose, lv.reused) for lv in sweep.levels] == [
        (0, first, 50.0, "growth", False),
        (1, second, 100.0, "sizing", False),
    ]
    assert [lv.reused for lv in store.get_sweep(later).levels] == [True]
    assert [s.id for s in store.list_sweeps("baseline")] == [sweep_id, later]
    assert [r.id for r in store.list_runs()] == [ordinary]
    assert [r.id for r in store.list_runs("baseline", levels=True)] == [ordinary, first, second]
    assert store.level_tags()[first].sweep_id == sweep_id  # the sweep that measured it


def test_a_sweep_of_an_unknown_experiment_or_id_is_refused(store: Store) -> None:
    with pytest.raises(NotFoundError):
        store.get_sweep(42)
    with pytest.raises(NotFoundError):
        store.create_sweep(
            experiment="nope",
            mode="open",
            slo_percentile="p99",
            slo_ms=60.0,
            protocol={},
            strategy={},
            environment_id=None,
            code_identity={},
        )


def test_a_knob_sweep_whose_process_is_gone_is_crashed_and_keeps_its_cells(store: Store) -> None:
    save_baseline(store)
    run_id = start_run(store)
    ours = store.create_knob_sweep(experiment="baseline", knob="threads", metric="qps", spec={})
    gone = store.create_knob_sweep(experiment="baseline", knob="threads", metric="qps", spec={})
    store.set_knob_cell(gone, block=0, arm=1, position=0, run_id=run_id, sweep_id=None,
                        measured_s=5.0)
    with store.session_scope() as session:  # another process of this host, now dead
        session.execute(update(SqlKnobSweep).where(SqlKnobSweep.id == gone).values(pid=2**22 + 7))
    alive = {os.getpid()}
    assert store.mark_knob_sweeps_crashed(lambda pid, started: pid in alive) == [gone]
    record = store.get_knob_sweep(gone)
    assert record.status == "CRASHED" and "is gone" in (record.error_message or "")
    assert [(c.block, c.arm, c.run_id) for c in record.cells] == [(0, 1, run_id)]
    assert store.get_knob_sweep(ours).status == "RUNNING"
    # Measured again, a cell points at the new run; the sweep's cells stay one per arm.
    again = start_run(store)
    store.set_knob_cell(gone, block=0, arm=1, position=2, run_id=again, sweep_id=None,
                        measured_s=6.0)
    assert [(c.run_id, c.position) for c in store.get_knob_sweep(gone).cells] == [(again, 2)]
