"""A newcomer's first hour: the demo's retries and hints, a step run from another folder, a
misspelt knob or factory, the default chain head. Each case runs the real command group on
temporary folders and databases: refused with a clear message and exit 2, nothing stored
wrong, no file created where the user did not ask."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from optlab.cli.main import cli
from tests.support.files import write
from tests.support.protocol import QUICK

SYNTHETIC_BASELINE = (
    "name: base\ntarget: {kind: builtin, name: synthetic}\n"
    "knobs: {distribution: fixed, service_ms: 0.2}\n"
    "workload: {load: {mode: closed, concurrency: 4}}\nprotocol: {name: quick}\n"
)


def cli_run(*args: str) -> Result:
    """The command group as a user types it: no --db unless given."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def rows(database: Path, query: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(database) as connection:
        return connection.execute(query).fetchall()


@pytest.fixture
def no_env_db(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPTLAB_DB", raising=False)


# ------------------------------------------------------------------------------ the demo


def test_demo_retries_an_invalid_step_reports_each_retry_and_still_prints_its_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env_db: None
) -> None:
    # A chain whose middle step is INVALID every time (half its requests fail): the demo
    # measures it again twice, says so, then stops with the table of what it measured.
    chains = tmp_path / "chains"
    folder = chains / "cpu"
    folder.mkdir(parents=True)
    write(folder, "baseline.yaml", SYNTHETIC_BASELINE)
    write(folder, "01-errors.yaml", "name: errors\nparent: base\nchange: {error_rate: 0.5}\n")
    write(folder, "04-int8.yaml", "name: faster\nparent: errors\nchange: {service_ms: 0.1}\n")
    monkeypatch.setattr("optlab.demo.experiments_dir", lambda: chains)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "demo"
    result = cli_run("demo", "--chain", "cpu", "--out", str(out), *QUICK[1:])
    assert result.exit_code == 2, result.output
    (database,) = out.glob("demo-*.db")
    stored = rows(
        database,
        "SELECT e.name, r.valid, r.id FROM runs r JOIN experiments e "
        "ON e.id = r.experiment_id ORDER BY r.id",
    )
    # The baseline valid (measured again first if a busy machine made it INVALID), then the
    # step three times, INVALID each time: every run stored.
    assert [(name, valid) for name, valid, _ in stored[-4:]] == [
        ("base", 1),
        ("errors", 0),
        ("errors", 0),
        ("errors", 0),
    ]
    last = stored[-1][2]
    assert f"errors's run {last} is INVALID after 3 tries (" in result.stderr
    assert "error rate" in result.stderr and "the chain stops there" in result.stderr
    # The hint names the demo's own database, not the current folder's default.
    assert f"optlab --db sqlite:///{database} log" in result.stderr
    # Every retry is reported under the table, with the reasons of the run it replaced.
    assert result.stdout.count("measured again: errors's run") == 2
    assert "stacked gains: errors" in result.stdout and "INCOMPLETE" in result.stdout
    assert "errors" in result.stdout and "base" in result.stdout
    assert not (tmp_path / ".optlab").exists()  # nothing beside the demo's own folder


# ------------------------------------------------------------- --quick supports a P99


def test_quick_without_a_duration_measures_until_a_p99_is_supported() -> None:
    from optlab.config.models import Protocol
    from optlab.config.protocol import (
        QUICK_MIN_QUERIES,
        effective_protocol,
        protocol_label,
    )
    from optlab.run.validity import P99_MIN_QUERIES

    assert QUICK_MIN_QUERIES == P99_MIN_QUERIES  # the config layer cannot import the run's
    run = effective_protocol(Protocol(), quick=True, until_queries=True)
    assert (run.duration_s, run.min_queries, run.max_duration_s) == (5.0, 662, 60.0)
    assert "longer until 662 queries (at most 60 s)" in protocol_label(run.as_dict())
    # The cap only decides whether a slow target's run ends short of its queries: a run
    # stored under the earlier 30 s cap compares with today's; the queries themselves count.
    from optlab.chain.comparability import same_protocol

    earlier = {**run.as_dict(), "max_duration_s": 30.0}
    assert same_protocol(earlier, run.as_dict())
    assert not same_protocol({**earlier, "min_queries": 100}, run.as_dict())
    assert not same_protocol({**earlier, "duration_s": 10.0}, run.as_dict())
    # An explicit --duration is what the user asked for; a sweep sizes its own levels; the
    # full protocol and the stored form of other protocols are unchanged.
    for other in (
        effective_protocol(Protocol(), quick=True, duration_s=5.0, until_queries=True),
        effective_protocol(Protocol(), quick=True),
        effective_protocol(Protocol(), until_queries=True),
    ):
        assert other.min_queries == 0 and "min_queries" not in other.as_dict()


def test_a_quick_run_of_a_slow_target_is_long_enough_for_its_p99(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ~100 requests/s: 5 s would give ~500 answers, short of the 662 a P99 needs.
    monkeypatch.chdir(tmp_path)
    write(
        tmp_path,
        "slow.yaml",
        "name: slow\ntarget: {kind: builtin, name: synthetic}\n"
        "knobs: {distribution: fixed, service_ms: 10}\n"
        "workload: {load: {mode: closed, concurrency: 1}}\nprotocol: {name: full}\n",
    )
    database = tmp_path / "q.db"
    result = cli_run("--db", f"sqlite:///{database}", "run", "slow.yaml", "--quick", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["valid"], summary["reasons"]
    assert summary["requests"] >= 662
    assert 5.0 < summary["duration_s"] < 30.0


# ------------------------------------------------------- a step run from another folder


def test_a_step_run_from_another_folder_uses_its_projects_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env_db: None
) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "experiments").mkdir(parents=True)
    elsewhere.mkdir()
    write(project / "experiments", "baseline.yaml", SYNTHETIC_BASELINE)
    write(project / "experiments", "step.yaml", "name: step\nparent: base\nchange: {sigma: 0.1}\n")
    monkeypatch.chdir(project)
    assert cli_run("run", "experiments/baseline.yaml", *QUICK).exit_code == 0
    database = project / ".optlab" / "optlab.db"
    assert database.is_file()
    monkeypatch.chdir(elsewhere)
    result = cli_run("run", str(project / "experiments" / "step.yaml"), *QUICK)
    assert result.exit_code == 0, result.output
    assert f"using the database sqlite:///{database}" in result.stderr
    assert not (elsewhere / ".optlab").exists()  # no new empty database here
    names = rows(database, "SELECT e.name FROM runs r JOIN experiments e ON e.id = r.experiment_id")
    assert sorted(n for (n,) in names) == ["base", "step"]


def test_a_step_whose_parent_has_no_database_anywhere_leaves_no_file_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env_db: None
) -> None:
    # The parent's file is elsewhere and no database holds it: refused, and the default
    # database the command would have made here is not left behind empty.
    lone, here = tmp_path / "lone", tmp_path / "here"
    lone.mkdir()
    here.mkdir()
    write(lone, "step.yaml", "name: step\nparent: base\nchange: {sigma: 0.1}\n")
    monkeypatch.chdir(here)
    for command in ("run", "diff"):
        result = cli_run(command, str(lone / "step.yaml"))
        assert result.exit_code == 2, result.output
        assert "parent 'base' not found" in result.stderr
        assert "`--db URL` names the one that holds its parent's runs" in result.stderr
        assert sorted(p.name for p in here.iterdir()) == []
        assert sorted(p.name for p in lone.iterdir()) == ["step.yaml"]


def test_the_current_folders_database_wins_and_the_other_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env_db: None
) -> None:
    project, here = tmp_path / "project", tmp_path / "here"
    project.mkdir()
    write(project, "baseline.yaml", SYNTHETIC_BASELINE)
    monkeypatch.chdir(project)
    assert cli_run("diff", "baseline.yaml").exit_code == 0
    monkeypatch.chdir(here.parent)
    here.mkdir()
    monkeypatch.chdir(here)
    assert cli_run("db", "upgrade").exit_code == 0  # a database of its own here
    result = cli_run("diff", str(project / "baseline.yaml"))
    assert result.exit_code == 0, result.output
    assert f"using the database here, sqlite:///{here / '.optlab' / 'optlab.db'}" in result.stderr
    assert f"has another, sqlite:///{project / '.optlab' / 'optlab.db'}" in result.stderr


# ---------------------------------------------------------------- a misspelt knob


PYTHON_BASELINE = (
    "name: base\ntarget: {kind: python, factory: 'echo_target:build'}\n"
    "knobs: {batch_size: 1, threads: 2}\nworkload: {load: {mode: closed, concurrency: 1}}\n"
)


@pytest.fixture
def python_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    write(tmp_path, "echo_target.py", "def build(knobs):\n    return lambda request: request\n")
    write(tmp_path, "baseline.yaml", PYTHON_BASELINE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def experiments_in(database: Path) -> list[str]:
    return sorted(name for (name,) in rows(database, "SELECT name FROM experiments"))


def test_a_misspelt_knob_is_refused_with_the_closest_one(
    python_project: Path, no_env_db: None
) -> None:
    database = python_project / "k.db"
    url = f"sqlite:///{database}"
    write(python_project, "step.yaml", "name: step\nparent: base\nchange: {batchsize: 8}\n")
    for command in ("diff", "run"):
        result = cli_run("--db", url, command, "step.yaml")
        assert result.exit_code == 2, result.output
        assert "step.yaml:3: refused: batchsize is not a knob of 'base'" in result.stderr
        assert "did you mean 'batch_size'?" in result.stderr and "new_knob: true" in result.stderr
        assert experiments_in(database) == ["base"]  # the step's config is not stored
        assert rows(database, "SELECT count(*) FROM runs") == [(0,)]
    # A knob added on purpose says so; the marker on a step that adds none is refused.
    write(
        python_project,
        "step.yaml",
        "name: step\nparent: base\nnew_knob: true\nchange: {batchsize: 8}\n",
    )
    added = cli_run("--db", url, "diff", "step.yaml")
    assert added.exit_code == 0, added.output
    assert "batchsize: (absent) -> 8" in added.stdout
    write(
        python_project,
        "other.yaml",
        "name: other\nparent: base\nnew_knob: true\nchange: {threads: 4}\n",
    )
    wrong = cli_run("--db", url, "diff", "other.yaml")
    assert wrong.exit_code == 2 and "`new_knob: true` but the change only sets" in wrong.stderr
    assert "other" not in experiments_in(database)


# ------------------------------------------------------------- a misspelt factory


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        ("echo_target:biuld", "did you mean echo_target:build?"),
        ("echo_targte:build", "did you mean 'echo_target'?"),
    ],
)
def test_a_misspelt_factory_is_refused_at_diff_before_anything_is_stored(
    python_project: Path, no_env_db: None, factory: str, expected: str
) -> None:
    write(python_project, "baseline.yaml", PYTHON_BASELINE.replace("echo_target:build", factory))
    write(python_project, "step.yaml", "name: step\nparent: base\nchange: {threads: 4}\n")
    database = python_project / "f.db"
    for command in ("diff", "run"):
        result = cli_run("--db", f"sqlite:///{database}", command, "step.yaml")
        assert result.exit_code == 2, result.output
        assert "baseline.yaml:2: target.factory:" in result.stderr
        assert expected in result.stderr
        assert experiments_in(database) == []
        assert rows(database, "SELECT count(*) FROM runs") == [(0,)]  # no FAILED run
    # Without --db: refused, and no default database is left in the folder.
    assert cli_run("diff", "step.yaml").exit_code == 2
    assert not (python_project / ".optlab").exists()


# --------------------------------------------------------------- the default chain head


def test_a_diff_never_moves_the_default_head_and_the_head_used_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_env_db: None
) -> None:
    monkeypatch.chdir(tmp_path)
    write(tmp_path, "baseline.yaml", SYNTHETIC_BASELINE)
    write(tmp_path, "step.yaml", "name: step\nparent: base\nchange: {sigma: 0.1}\n")
    db = ("--db", f"sqlite:///{tmp_path / 'h.db'}")
    assert cli_run(*db, "run", "step.yaml", "--chain", *QUICK).exit_code == 0

    def head() -> tuple[str, str]:
        result = cli_run(*db, "table", "--format", "json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)["head"], result.stderr

    assert head() == ("step", head()[1])
    assert "HEAD not given: 'step', the newest measured chain head" in head()[1]
    # A step only diffed (never measured), its file then deleted: the head stays put.
    draft = write(tmp_path, "draft.yaml", "name: draft\nparent: step\nchange: {sigma: 0.2}\n")
    assert cli_run(*db, "diff", "draft.yaml").exit_code == 0
    draft.unlink()
    assert head()[0] == "step"
    # A measured step whose file is deleted may stay the head, but never silently.
    later = write(tmp_path, "later.yaml", "name: later\nparent: step\nchange: {sigma: 0.2}\n")
    assert cli_run(*db, "run", "later.yaml", *QUICK).exit_code == 0
    later.unlink()
    name, note = head()
    assert name == "later"
    assert f"its file {later} no longer exists" in note
