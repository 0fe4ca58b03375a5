"""The notebook in notebooks/ runs, cell by cell, against a measured results database."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.support.capabilities import module
from tests.support.paths import REPO


def test_explore_results_notebook_runs(
    tmp_path: Path,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
    synthetic_chain: tuple[Path, Path],
) -> None:
    nbformat = module("nbformat")
    nbclient = module("nbclient")
    module("matplotlib")
    # The session's measured chain (baseline -> faster service, 3 s runs), in a copy.
    shutil.copy(synthetic_chain[1], sqlite_url.removeprefix("sqlite:///"))
    monkeypatch.chdir(tmp_path)
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
