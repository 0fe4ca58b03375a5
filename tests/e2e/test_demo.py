"""`optlab demo`: the README's main command, end to end on the CPU chain (about 2 minutes)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from optlab.cli.main import cli
from optlab.demo import CHAINS, cuda_available, experiments_dir, fresh_database
from optlab.reports.table import stacked_table
from optlab.store import Store


@pytest.mark.slow
def test_demo_measures_the_cpu_chain_and_prints_its_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, engine_cache: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPTLAB_CACHE_DIR", str(engine_cache))
    monkeypatch.delenv("OPTLAB_DB", raising=False)
    out = tmp_path / "demo"
    result = CliRunner().invoke(cli, ["demo", "--chain", "cpu", "--out", str(out)])
    assert result.exit_code == 0, result.output
    names = ["cpu-baseline", "cpu-preprocess", "cpu-dynamic-batch", "cpu-onnxruntime", "cpu-int8"]
    assert "stacked gains: cpu-int8" in result.stdout
    for name in names:
        assert name in result.stdout
    assert "preprocess: python -> numpy-pooled" in result.stdout
    databases = list(out.glob("demo-*.db"))
    assert len(databases) == 1
    store = Store.open(f"sqlite:///{databases[0]}")
    table = stacked_table(store, "cpu-int8").set_index("experiment")
    assert list(table.index) == names
    assert table["valid"].all() and table["provisional"].all()
    # Each step's gain shows in the stage it changed (gaps of 3x to 10x here: not noise).
    assert table.loc["cpu-preprocess", "preprocess_p50_ms"] < (
        table.loc["cpu-baseline", "preprocess_p50_ms"] / 2
    )
    assert table.loc["cpu-onnxruntime", "infer_ms_per_request"] < (
        table.loc["cpu-dynamic-batch", "infer_ms_per_request"]
    )
    assert table.loc["cpu-dynamic-batch", "mean_batch_size"] > 1
    assert table.loc["cpu-int8", "qps"] > 2 * table.loc["cpu-baseline", "qps"]
    # int8 keeps accuracy within a point of the fp32 baseline, measured and stored.
    drop = table.loc["cpu-baseline", "accuracy_top1"] - table.loc["cpu-int8", "accuracy_top1"]
    assert drop <= 0.01


def test_gpu_chain_without_cuda_is_a_clear_error(tmp_path: Path) -> None:
    if cuda_available():
        pytest.skip("this machine has CUDA: the gpu chain would run")
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
