"""Run bundles, run uids and pending runs against real databases: SQLite always, PostgreSQL
when OPTLAB_TEST_POSTGRES_URL is set (tests/support/storebuild.py's `db_url`: the team store)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from click.testing import CliRunner, Result
from sqlalchemy import text, update

from optlab.cli.main import cli
from optlab.errors import RefusedError, StoreError
from optlab.metrics.histogram import LatencyHistogram
from optlab.store import SUMMARY_SCHEMA_VERSION, RunFinal, Store, upgrade
from optlab.store.bundle_files import export_file, read_bundle, read_bundles, write_bundle
from optlab.store.database import make_engine
from optlab.store.models import SqlRun
from optlab.store.pending import import_pending, save_pending
from tests.support import storebuild
from tests.support.db import copy_database
from tests.support.legacy import old_experiment
from tests.support.storebuild import alembic_cfg, save_baseline, start_run

# The store tests' databases: SQLite, and PostgreSQL (a fresh database) when a URL is given.
db_url = storebuild.db_url

Invoke = Callable[..., Result]
BASELINE, STEP = "synthetic-baseline", "synthetic-faster-service"


@pytest.fixture
def laptop(
    synthetic_chain: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A copy of the session's measured synthetic pair (baseline -> faster service, conftest's
    synthetic_chain); the working directory is its folder."""
    url = copy_database(synthetic_chain[1], tmp_path, "laptop.db")
    monkeypatch.chdir(tmp_path)
    return url


def contents(url: str) -> dict[str, dict[str, Any]]:
    """Everything stored about each run, by uid, without this database's ids."""
    found = {}
    with Store.open(url) as store:
        for run in store.list_runs():
            fields = asdict(run)
            for local in ("id", "config_id", "environment_id"):
                del fields[local]
            if run.environment_id is not None:
                environment = store.get_environment(run.environment_id)
                fields["environment"] = (environment.fingerprint, environment.material_hash)
            config = store.get_config(run.config_id)
            fields["config"] = (config.config, config.change, config.parent_config_hash)
            fields["stage_stats"] = store.get_stage_stats(run.id)
            fields["windows"] = store.get_windows(run.id)
            fields["samples"] = store.get_resource_samples(run.id)
            fields["errors"] = store.get_run_errors(run.id)
            found[run.uid] = fields
    return found


def test_0004_gives_every_existing_run_a_distinct_uid(db_url: str) -> None:
    command.upgrade(alembic_cfg(db_url), "0003_service_resources")
    at = "2024-05-01 12:00:00+00:00"
    engine = make_engine(db_url)
    with engine.begin() as connection:
        old_experiment(connection, at)
        for _ in range(3):
            connection.execute(
                text(
                    "INSERT INTO runs (experiment_id, config_id, status, protocol_name, "
                    "protocol_json, provisional, repeat, code_identity_json, hostname, pid, "
                    "started_at, heartbeat_at, reasons_json) VALUES (1, 1, 'FINISHED', 'quick', "
                    "'{}', :yes, :no, '{}', 'h', 1, :at, :at, '[]')"
                ),
                {"at": at, "yes": True, "no": False},
            )
        connection.execute(
            text(
                "INSERT INTO run_windows (run_id, phase, t_s, completed, errors, qps) "
                "VALUES (1, 'measure', 0, 5, 0, 5.0), (1, 'measure', 1, 6, 0, 6.0)"
            )
        )
    engine.dispose()

    assert upgrade(db_url) == ("0003_service_resources", storebuild.HEAD)
    with Store.open(db_url) as store:
        uids = [run.uid for run in store.list_runs()]
        assert len(uids) == len(set(uids)) == 3
        assert all(len(uid) == 32 and int(uid, 16) >= 0 for uid in uids)
        # SQLite rebuilds a table to alter it; rebuilding `runs` would have deleted these
        # through ON DELETE CASCADE.
        assert len(store.get_windows(1)) == 2
        new = store.create_run(
            experiment="old",
            protocol_name="quick",
            protocol={},
            provisional=True,
            environment_id=None,
            code_identity={},
            git_commit=None,
            git_dirty=None,
        )
        assert store.get_run(new).uid not in uids


def test_laptop_runs_round_trip_through_the_team_store(
    laptop: str, db_url: str, tmp_path: Path
) -> None:
    with Store.open(laptop) as store:
        exported = export_file(store, tmp_path / "laptop.jsonl")
    assert [run.experiment for run in exported.runs] == [BASELINE, STEP]
    header = json.loads((tmp_path / "laptop.jsonl").read_text().splitlines()[0])
    assert header["kind"] == "optlab-bundle" and header["schema_version"] == 1
    assert header["source"] == laptop and header["optlab_version"]

    with Store.open(db_url) as team:
        first = team.import_bundles(read_bundles([tmp_path / "laptop.jsonl"]))
        assert [(r.experiment, r.action) for r in first] == [
            (BASELINE, "imported"),
            (STEP, "imported"),
        ]
        assert [r.run_id for r in first] == [1, 2]  # the rehearsal used up no ids
        again = team.import_bundles(read_bundles([tmp_path / "laptop.jsonl"]))
        assert [r.action for r in again] == ["skipped", "skipped"]
        assert [r.run_id for r in again] == [r.run_id for r in first]
        experiments = [(e.name, e.parent) for e in team.list_experiments()]
        assert experiments == [(BASELINE, None), (STEP, BASELINE)]
        # The imported runs make the same stacked table as on the laptop.
        from optlab.reports.table import stacked_table

        shown = ["experiment", "p50_ms", "p99_ms", "qps", "verdict"]
        with Store.open(laptop) as store:
            expected = stacked_table(store, STEP).to_frame()[shown].to_dict("records")
        assert stacked_table(team, STEP).to_frame()[shown].to_dict("records") == expected
        export_file(team, tmp_path / "team.jsonl")

    back = f"sqlite:///{tmp_path / 'back.db'}"
    with Store.open(back) as store:
        assert [
            r.action for r in store.import_bundles(read_bundles([tmp_path / "team.jsonl"]))
        ] == ["imported"] * 2

    original = contents(laptop)
    assert len(original) == 2
    assert contents(db_url) == original
    assert contents(back) == original
    for uid, fields in contents(db_url).items():
        for stored, source in zip(fields["stage_stats"], original[uid]["stage_stats"], strict=True):
            decoded, reference = (LatencyHistogram.decode(s.histogram) for s in (stored, source))
            assert decoded.count == reference.count > 0
            assert (decoded.counts == reference.counts).all()
            for percentile in (50, 99, 99.9):
                assert decoded.value_at_percentile_ns(percentile) == (
                    reference.value_at_percentile_ns(percentile)
                )


def test_an_experiment_stored_with_another_config_or_parent_is_refused(
    laptop: str, db_url: str, tmp_path: Path
) -> None:
    with Store.open(laptop) as store:
        export_file(store, tmp_path / "laptop.jsonl")
        stored = store.get_experiment(BASELINE)
        assert stored is not None and stored.current_config is not None
        laptop_hash = stored.current_config.config_hash
    with Store.open(db_url) as team:
        save_baseline(team, name=BASELINE, config_hash="f" * 64)
        with pytest.raises(RefusedError) as refused:
            team.import_bundles(read_bundles([tmp_path / "laptop.jsonl"]))
        message = str(refused.value)
        assert BASELINE in message and "f" * 12 in message and laptop_hash[:12] in message
        assert refused.value.hint is not None and "rename the experiment" in refused.value.hint
        assert team.list_runs() == [] and len(team.list_experiments()) == 1

    # The baseline's run alone would import; the step's parent differs, so nothing is.
    other = f"sqlite:///{tmp_path / 'other.db'}"
    with Store.open(other) as team:
        save_baseline(team, name=STEP)
        with pytest.raises(RefusedError, match="with parent None") as refused:
            team.import_bundles(read_bundles([tmp_path / "laptop.jsonl"]))
        assert f"parent {BASELINE!r}" in str(refused.value)
        assert team.list_runs() == []
        assert [e.name for e in team.list_experiments()] == [STEP]


def test_complete_run_stores_everything_once_and_can_be_retried(
    laptop: str, db_url: str, tmp_path: Path
) -> None:
    with Store.open(laptop) as store:
        measured = store.export_run(store.list_runs()[0].id)
    with Store.open(db_url) as store:
        save_baseline(store)
        run_id = start_run(store)
        flushed = measured.windows[:2]
        store.add_windows(run_id, flushed)  # the runner's 5 s flush
        store.add_resource_samples(run_id, measured.samples[:1])
        final = measured.final
        arguments: dict[str, Any] = {
            "final": final,
            "stage_stats": measured.stage_stats,
            "windows": measured.windows,
            "samples": measured.samples,
            "run_errors": [*measured.errors],
        }
        for _attempt in range(2):  # a retry stores the same thing, without UNIQUE errors
            store.complete_run(run_id, **arguments)
            run = store.get_run(run_id)
            assert (run.status, run.requests, run.qps) == ("FINISHED", final.requests, final.qps)
            assert run.summary is not None and final.summary is not None
            # The same summary, as a run of this database's experiment.
            moved = {"run_id": run_id, "experiment": "baseline"}
            assert run.summary.to_json() == final.summary.to_json() | moved
            assert run.finished_at is not None
            assert store.get_windows(run_id) == list(measured.windows)
            assert store.get_resource_samples(run_id) == list(measured.samples)
            assert store.get_stage_stats(run_id) == list(measured.stage_stats)
        with pytest.raises(ValueError, match="already stored"):
            store.complete_run(run_id, **{**arguments, "windows": measured.windows[2:]})
        assert store.get_windows(run_id) == list(measured.windows)


def test_a_running_run_is_completed_from_its_pending_bundle(laptop: str, db_url: str) -> None:
    with Store.open(laptop) as store:
        measured = store.export_run(store.list_runs()[0].id)
        chain = store.export_run(store.list_runs()[0].id)
    with Store.open(db_url) as store:
        store.import_bundle(chain)  # the experiments and a first run
        run_id = start_run(store, experiment=BASELINE)
        snapshot = store.export_run(run_id)  # as the runner takes it when the run starts
        store.add_windows(run_id, measured.windows[:1])
        bundle = snapshot.completed(
            final=measured.final,
            stage_stats=measured.stage_stats,
            windows=measured.windows,
            samples=measured.samples,
            errors=measured.errors,
        )
        path = save_pending(bundle, store.url)
        assert path == Path.cwd() / ".optlab" / "pending" / f"{snapshot.uid}.jsonl"
        assert read_bundle(path) == [bundle]

        results = import_pending(store)
        assert [(r.run_id, r.action, r.path) for r in results] == [(run_id, "completed", path)]
        run = store.get_run(run_id)
        assert (run.status, run.uid, run.requests) == (
            "FINISHED",
            snapshot.uid,
            measured.run["requests"],
        )
        assert run.finished_at is not None
        assert store.get_windows(run_id) == list(measured.windows)
        assert store.get_stage_stats(run_id) == list(measured.stage_stats)
        assert not path.exists() and (path.parent / "imported" / path.name).exists()
        assert import_pending(store) == []
        assert store.import_bundle(bundle).action == "skipped"


def test_a_pending_bundle_is_stored_by_the_next_command(laptop: str, tmp_path: Path) -> None:
    def optlab(*args: str) -> Result:
        return CliRunner().invoke(cli, ["--db", laptop, *args], catch_exceptions=False)

    with Store.open(laptop) as store:
        measured = store.export_run(1)
        run_id = start_run(store, experiment=BASELINE)
        # The next `optlab run` found its process gone.
        with store.session_scope() as session:
            session.execute(update(SqlRun).where(SqlRun.id == run_id).values(status="CRASHED"))
        bundle = store.export_run(run_id).completed(
            final=measured.final,
            stage_stats=measured.stage_stats,
            windows=measured.windows,
            samples=measured.samples,
            errors=measured.errors,
        )
        path = save_pending(bundle, store.url)
        # A run meant for another database stays pending.
        elsewhere = save_pending(store.export_run(1), f"sqlite:///{tmp_path / 'elsewhere.db'}")

    # The next command that opens the database stores it, a reading one too, and shows it.
    reading = optlab("log")
    assert reading.exit_code == 0, reading.output
    assert f"stored pending run {run_id} from .optlab/pending/{bundle.uid}.jsonl" in reading.stderr
    assert f"{run_id}  {BASELINE}" in reading.stdout and "FINISHED" in reading.stdout
    imported = path.parent / "imported" / path.name
    assert not path.exists() and imported.exists() and elsewhere.exists()
    with Store.open(laptop) as store:
        assert store.get_run(run_id).status == "FINISHED"
        assert store.get_windows(run_id) == list(measured.windows)
    # Importing the same file by hand again adds nothing.
    again = optlab("import", str(imported))
    assert again.exit_code == 0, again.output
    assert "1 run: 0 imported, 0 completed, 1 skipped" in again.stdout
    assert "stored pending" not in again.stderr


def test_cli_export_and_import(laptop: str, tmp_path: Path) -> None:
    def optlab(db: str, *args: str) -> Result:
        return CliRunner().invoke(cli, ["--db", db, *args], catch_exceptions=False)

    with Store.open(laptop) as store:
        running = start_run(store, experiment=STEP)
    chain = optlab(laptop, "export", "-o", "chain.jsonl")  # the newest chain head
    assert chain.exit_code == 0, chain.output
    assert "wrote 2 runs to chain.jsonl" in chain.stdout
    assert f"left out run {running} {STEP}: still RUNNING" in chain.stderr
    one = optlab(laptop, "export", BASELINE, "-o", "base.jsonl", "--json")
    payload = json.loads(one.stdout)
    assert [r["experiment"] for r in payload["runs"]] == [BASELINE]
    assert len(read_bundle(tmp_path / "base.jsonl")) == 1
    assert len(read_bundle(tmp_path / "chain.jsonl")) == 2
    refused = optlab(laptop, "export", "--runs", str(running), "-o", "x.jsonl")
    assert refused.exit_code == 2 and "still RUNNING" in refused.stderr
    both = optlab(laptop, "export", BASELINE, "--all", "-o", "x.jsonl")
    assert both.exit_code == 2 and "choose one of" in both.stderr
    assert optlab(laptop, "export", "--runs", "a,b", "-o", "x.jsonl").exit_code == 2
    assert not (tmp_path / "x.jsonl").exists()

    team = f"sqlite:///{tmp_path / 'team.db'}"
    first = optlab(team, "import", "chain.jsonl")
    assert first.exit_code == 0, first.output
    assert f"run 1 {BASELINE}: imported" in first.stdout
    assert "2 runs: 2 imported, 0 completed, 0 skipped" in first.stdout
    again = json.loads(optlab(team, "import", "chain.jsonl", "base.jsonl", "--json").stdout)
    assert (again["imported"], again["completed"], again["skipped"]) == (0, 0, 3)

    clash = f"sqlite:///{tmp_path / 'clash.db'}"
    with Store.open(clash) as store:
        save_baseline(store, name=BASELINE)
    refused = optlab(clash, "import", "chain.jsonl")
    assert refused.exit_code == 2 and "rename the experiment" in refused.stderr
    with Store.open(clash) as store:
        assert store.list_runs() == []


def test_a_bundle_from_before_summary_versions_imports_the_same(
    laptop: str, tmp_path: Path
) -> None:
    """A bundle carries each run's summary whole, with its schema_version; one written before
    summaries had a version (the same fields, no schema_version) reads and stores the same."""
    with Store.open(laptop) as store:
        runs = store.list_runs()
        path = write_bundle(tmp_path / "new.jsonl", store.export_runs([r.id for r in runs]), laptop)
    header, *lines = path.read_text().splitlines()
    old_lines = []
    for line in lines:
        value = json.loads(line)
        assert value["run"]["summary"]["schema_version"] == SUMMARY_SCHEMA_VERSION
        assert value["run"]["summary"]["latency_ms"]["total"]["count"] > 0
        del value["run"]["summary"]["schema_version"]
        old_lines.append(json.dumps(value))
    old = tmp_path / "old.jsonl"
    old.write_text("\n".join([header, *old_lines]) + "\n")

    for name, bundle_file in (("from-new", path), ("from-old", old)):
        url = f"sqlite:///{tmp_path / name}.db"
        with Store.open(url) as store:
            results = store.import_bundles(read_bundles([bundle_file]))
            assert [r.action for r in results] == ["imported", "imported"]
            imported = store.list_runs()
        assert [r.summary for r in imported] == [r.summary for r in runs]
        assert imported[-1].summary is not None and imported[-1].summary.parent is not None


def test_bundle_files_that_cannot_be_read_are_refused(laptop: str, tmp_path: Path) -> None:
    with Store.open(laptop) as store:
        bundles = store.export_runs([1, 2])
    path = write_bundle(tmp_path / "good.jsonl", bundles, laptop)
    header, first, second = path.read_text().splitlines()

    newer = tmp_path / "newer.jsonl"
    newer.write_text(header.replace('"schema_version": 1', '"schema_version": 2') + "\n" + first)
    with pytest.raises(StoreError, match="schema version 2, written by a newer optlab") as refused:
        read_bundle(newer)
    assert refused.value.hint is not None and "upgrade optlab" in refused.value.hint
    result = CliRunner().invoke(cli, ["--db", laptop, "import", str(newer)])
    assert result.exit_code == 2 and "newer optlab" in result.stderr

    other = tmp_path / "other.jsonl"
    other.write_text('{"kind": "optlab-table", "schema_version": 1}\n')
    with pytest.raises(StoreError, match="not an optlab run bundle"):
        read_bundle(other)

    damaged = tmp_path / "damaged.jsonl"
    damaged.write_text(f"{header}\n{first}\n{second[: len(second) // 2]}\n")
    with pytest.raises(StoreError, match=r"damaged.jsonl:3: malformed run bundle"):
        read_bundle(damaged)
    wrong = json.loads(first)
    wrong["experiments"][0]["parent"] = "somebody"
    damaged.write_text(f"{header}\n{json.dumps(wrong)}\n")
    with pytest.raises(StoreError, match=r"damaged.jsonl:2: .*has parent 'somebody'"):
        read_bundle(damaged)
    wrong = json.loads(first)
    wrong["run"]["summary"]["schema_version"] = SUMMARY_SCHEMA_VERSION + 1  # a newer optlab's
    damaged.write_text(f"{header}\n{json.dumps(wrong)}\n")
    version = SUMMARY_SCHEMA_VERSION + 1
    too_new = rf"damaged.jsonl:2: .*does not fit: run summary schema_version {version}"
    with pytest.raises(StoreError, match=too_new):
        read_bundle(damaged)
    del wrong["run"]["summary"]["schema_version"], wrong["run"]["summary"]["status"]
    damaged.write_text(f"{header}\n{json.dumps(wrong)}\n")
    with pytest.raises(StoreError, match=r"damaged.jsonl:2: .*run.summary does not fit"):
        read_bundle(damaged)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(StoreError, match="empty"):
        read_bundle(tmp_path / "empty.jsonl")

    with pytest.raises(TypeError, match="colour"):
        RunFinal(status="FINISHED", colour=1)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="finishes as one of"):
        RunFinal(status="RUNNING")
