"""A newcomer's first hour: the demo's retries and hints, a step run from another folder, a
misspelt knob or factory, the default chain head. Each case runs the real command group on
temporary folders and databases: refused with a clear message and exit 2, nothing stored
wrong, no file created where the user did not ask."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from optlab.cli.main import cli
from tests.conftest import write

FAST = ("--duration", "1.5", "--warmup", "0.2")
SYNTHETIC_BASELINE = (
    "name: base\ntarget: {kind: builtin, name: synthetic}\n"
    "knobs: {distribution: fixed, service_ms: 0.2}\n"
    "workload: {load: {mode: closed, concurrency: 4}}\nprotocol: {name: quick}\n"
)


def cli_run(*args: str) -> Result:
    """The command group as a user types it: no --db unless given."""
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def rows(database: Path, query: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(database) as connection:
        return connection.execute(query).fetchall()


@pytest.fixture
def no_env_db(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPTLAB_DB", raising=False)


# ------------------------------------------------------------------------------ the demo


@pytest.mark.slow
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
    monkeypatch.setattr("optlab.demo.DEMO_DURATION_S", 1.5)
    monkeypatch.setattr("optlab.demo.DEMO_WARMUP_S", 0.2)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "demo"
    result = cli_run("demo", "--chain", "cpu", "--out", str(out))
    assert result.exit_code == 2, result.output
    (database,) = out.glob("demo-*.db")
    assert "errors's run 4 is INVALID after 3 tries (error rate" in result.stderr
    assert "the chain stops there" in result.stderr
    # The hint names the demo's own database, not the current folder's default.
    assert f"optlab --db sqlite:///{database} log" in result.stderr
    # Every retry is reported under the table, with the reasons of the run it replaced.
    assert result.stdout.count("measured again: errors's run") == 2
    assert "stacked gains: errors" in result.stdout and "INCOMPLETE" in result.stdout
    assert "errors" in result.stdout and "base" in result.stdout
    stored = rows(
        database,
        "SELECT e.name, r.valid FROM runs r JOIN experiments e "
        "ON e.id = r.experiment_id ORDER BY r.id",
    )
    assert stored == [("base", 1), ("errors", 0), ("errors", 0), ("errors", 0)]
    assert not (tmp_path / ".optlab").exists()  # nothing beside the demo's own folder
