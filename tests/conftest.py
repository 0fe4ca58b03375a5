"""Shared fixtures: a copy of the reference chain in a temporary folder, and a fresh database."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from optlab.cli.main import cli

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def chain_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The reference chain copied to a temporary folder, which is also the working dir."""
    folder = tmp_path / "experiments"
    folder.mkdir()
    for path in (REPO / "experiments").glob("*.yaml"):
        shutil.copy(path, folder / path.name)
    monkeypatch.chdir(tmp_path)
    return folder


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'optlab.db'}"


@pytest.fixture
def invoke(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> Callable[..., Result]:
    """Run the real command group against the temporary database."""
    monkeypatch.delenv("OPTLAB_DB", raising=False)

    def run(*args: str) -> Result:
        return CliRunner().invoke(cli, ["--db", sqlite_url, *args], catch_exceptions=False)

    return run


@pytest.fixture
def synth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The synthetic example chain copied to a temporary folder; the working dir is its parent."""
    folder = tmp_path / "synthetic"
    shutil.copytree(REPO / "experiments" / "examples" / "synthetic", folder)
    monkeypatch.chdir(tmp_path)
    return folder


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path
