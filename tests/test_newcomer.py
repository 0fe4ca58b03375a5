"""A newcomer's first hour: the demo's retries and hints, a step run from another folder, a
misspelt knob or factory, the default chain head. Each case runs the real command group on
temporary folders and databases: refused with a clear message and exit 2, nothing stored
wrong, no file created where the user did not ask."""

from __future__ import annotations

import json
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
    assert (run.duration_s, run.min_queries, run.max_duration_s) == (5.0, 662, 30.0)
    assert "longer until 662 queries (at most 30 s)" in protocol_label(run.as_dict())
    # An explicit --duration is what the user asked for; a sweep sizes its own levels; the
    # full protocol and the stored form of other protocols are unchanged.
    for other in (
        effective_protocol(Protocol(), quick=True, duration_s=5.0, until_queries=True),
        effective_protocol(Protocol(), quick=True),
        effective_protocol(Protocol(), until_queries=True),
    ):
        assert other.min_queries == 0 and "min_queries" not in other.as_dict()


@pytest.mark.slow
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
