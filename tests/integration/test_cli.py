"""The command line against the real command group and a temporary database."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from click.testing import Result

from optlab._version import __version__
from optlab.cli.main import cli
from tests.support.files import write

Invoke = Callable[..., Result]


def test_diff_names_the_one_variable(chain_dir: Path, invoke: Invoke) -> None:
    result = invoke("diff", "experiments/01-dynamic-batch.yaml")
    assert result.exit_code == 0, result.output
    assert "chain: baseline -> dynamic-batch" in result.stdout
    assert (
        "batching: {mode: off} -> {mode: dynamic, max_batch_size: 8, max_wait_ms: 10.0, "
        "max_queue: 1024}" in result.stdout
    )
    assert "config of dynamic-batch: stored" in result.stderr
    again = invoke("diff", "experiments/01-dynamic-batch.yaml")
    assert again.exit_code == 0 and "stored" not in again.stderr


def test_diff_json(chain_dir: Path, invoke: Invoke) -> None:
    result = invoke("diff", "--json", "experiments/02-fp16.yaml")
    assert result.exit_code == 0
    payload = json.loads(result.stdout)
    assert payload["variable"]["name"] == "precision"
    assert (payload["variable"]["old"], payload["variable"]["new"]) == ("fp32", "fp16")
    assert [c["experiment"] for c in payload["chain"]] == ["baseline", "dynamic-batch", "fp16"]


def test_two_variables_exit_2_naming_both(chain_dir: Path, invoke: Invoke) -> None:
    write(
        chain_dir,
        "two.yaml",
        "name: two\nparent: baseline\nchange:\n  batching: {mode: dynamic}\n  precision: fp16\n",
    )
    result = invoke("diff", "experiments/two.yaml")
    assert result.exit_code == 2
    assert "changes 2 variables" in result.stderr
    assert "batching:" in result.stderr and "precision: fp32 -> fp16" in result.stderr
    assert "optlab split" in result.stderr
    assert result.stdout == ""


def test_typo_exit_2_suggests(chain_dir: Path, invoke: Invoke) -> None:
    write(chain_dir, "typo.yaml", "name: typo\nparent: baseline\nchange:\n  precison: fp16\n")
    result = invoke("diff", "experiments/typo.yaml")
    assert result.exit_code == 2
    assert "typo.yaml:4: change.precison: unknown key 'precison'" in result.stderr
    assert "did you mean 'precision'" in result.stderr


def test_missing_file_exit_2(chain_dir: Path, invoke: Invoke) -> None:
    result = invoke("diff", "experiments/nope.yaml")
    assert result.exit_code == 2 and "no such file" in result.stderr


def test_split_writes_a_chain_that_passes(chain_dir: Path, invoke: Invoke) -> None:
    original = write(
        chain_dir,
        "two.yaml",
        "name: two\nparent: baseline\nhypothesis: both help\nchange:\n"
        "  precision: fp16\n  batching: {mode: dynamic, max_batch_size: 4}\n",
    )
    dry = invoke("split", "--dry-run", "experiments/two.yaml")
    assert dry.exit_code == 0 and "name: two-precision" in dry.stdout
    assert not (chain_dir / "two-precision.yaml").exists()
    result = invoke("split", "experiments/two.yaml")
    assert result.exit_code == 0, result.output
    first = invoke("diff", "experiments/two-precision.yaml")
    assert first.exit_code == 0 and "precision: fp32 -> fp16" in first.stdout
    second = invoke("diff", "experiments/two.yaml")
    assert second.exit_code == 0, second.output
    assert "chain: baseline -> two-precision -> two" in second.stdout
    assert "batching: {mode: off} -> {mode: dynamic, max_batch_size: 4" in second.stdout
    assert "hypothesis: both help" in original.read_text()
    assert (chain_dir / "two.yaml.orig").read_text().count("precision: fp16") == 1
    refused = invoke("split", "experiments/two.yaml")
    assert refused.exit_code == 2 and "nothing to split" in refused.stderr


def test_env_json_has_hardware_software_and_code(chain_dir: Path, invoke: Invoke) -> None:
    result = invoke("env", "--json", "experiments/baseline.yaml")
    assert result.exit_code == 0
    fp = json.loads(result.stdout)
    assert fp["hardware"]["cpu"]["logical_cores"] >= 1
    assert fp["software"]["packages"]["torch"]
    assert fp["code"]["optlab"] == __version__
    assert fp["code"]["target"]["kind"] == "builtin"
    assert len(fp["material_hash"]) == 64


def test_env_table(invoke: Invoke) -> None:
    result = invoke("env")
    assert result.exit_code == 0
    assert "CPU" in result.stdout and "torch" in result.stdout


def test_db_current_and_upgrade(invoke: Invoke, sqlite_url: str) -> None:
    upgraded = invoke("db", "upgrade")
    assert upgraded.exit_code == 0, upgraded.output
    assert "upgraded database from empty to" in upgraded.stdout
    again = invoke("db", "upgrade")
    assert "already at" in again.stdout
    current = invoke("db", "current")
    assert current.exit_code == 0 and "up to date" in current.stdout


def test_db_url_from_environment(chain_dir: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    url = f"sqlite:///{tmp_path / 'env.db'}"
    result = CliRunner().invoke(cli, ["diff", "experiments/baseline.yaml"], env={"OPTLAB_DB": url})
    assert result.exit_code == 0, result.output
    assert (tmp_path / "env.db").exists()


def test_default_database_under_working_dir(chain_dir: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    result = CliRunner().invoke(cli, ["diff", "experiments/baseline.yaml"], env={"OPTLAB_DB": None})
    assert result.exit_code == 0, result.output
    assert (tmp_path / ".optlab" / "optlab.db").exists()
