"""The notebook in notebooks/ runs, cell by cell, against a results database the test builds."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from tests.conftest import REPO

Invoke = Callable[..., Result]


@pytest.mark.slow
def test_explore_results_notebook_runs(
    tmp_path: Path, invoke: Invoke, sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("matplotlib")
    folder = tmp_path / "synthetic"
    shutil.copytree(REPO / "experiments" / "examples" / "synthetic", folder)
    monkeypatch.chdir(tmp_path)
    step = folder / "01-faster-service.yaml"
    result = invoke("run", str(step), "--quick", "--duration", "3", "--warmup", "0.3", "--chain")
    assert result.exit_code == 0, result.output
    monkeypatch.setenv("OPTLAB_DB", sqlite_url)  # the kernel inherits it
    notebook = nbformat.read(REPO / "notebooks" / "explore_results.ipynb", as_version=4)
    nbclient.NotebookClient(
        notebook, timeout=120, kernel_name="python3", resources={"metadata": {"path": tmp_path}}
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    text = "\n".join(str(o.get("data", {}).get("text/plain", "")) for o in outputs)
    assert "synthetic-faster-service" in text and "gain" in text  # the table was built
    assert any("image/png" in o.get("data", {}) for o in outputs)  # and plotted
