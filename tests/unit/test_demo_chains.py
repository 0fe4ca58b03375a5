"""`optlab demo` before it measures: the shipped chains, a fresh database each time, and the
GPU chain refused without CUDA (the demo itself, measured, is tests/e2e/test_demo.py)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from optlab.cli.main import cli
from optlab.demo import CHAINS, experiments_dir, fresh_database
from tests.support.capabilities import without_cuda


@without_cuda()
def test_gpu_chain_without_cuda_is_a_clear_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["demo", "--chain", "gpu", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "the gpu chain needs CUDA" in result.output
    assert not list(tmp_path.glob("*.db"))  # refused before any database was made


def test_shipped_chains_exist_and_databases_are_never_reused(tmp_path: Path) -> None:
    for chain, head in CHAINS.items():
        assert (experiments_dir() / chain / head).is_file()
        assert (experiments_dir() / chain / "baseline.yaml").is_file()
    first = fresh_database(tmp_path)
    first.touch()
    assert fresh_database(tmp_path) != first
