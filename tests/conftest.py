"""Shared fixtures: a copy of the reference chain in a temporary folder, a fresh database, and
the synthetic chain measured once for the session (`measured_chain`, `chain_copy`).

Helpers a test module imports live in tests/support/ (never in another test module); the names
re-exported below are kept for modules not yet switched to tests.support."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from optlab.cli.main import cli
from tests.support.chain import MeasuredChain, measure_chain
from tests.support.db import copy_database
from tests.support.paths import REPO

# A suite started with `&` from a non-interactive shell (a CI script, `nohup make test &`)
# inherits SIGINT ignored, and so would every `optlab run` a test spawns: the tests that press
# Ctrl-C (SIGINT to the run's process group, as a terminal does to its foreground job) would
# then watch the run finish its whole duration. A terminal's foreground job has SIGINT at its
# default, so the suite gives its children that.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def chain_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The reference chain copied to a temporary folder, which is also the working dir."""
    folder = tmp_path / "experiments"
    folder.mkdir()
    for path in (REPO / "experiments").glob("*.yaml"):
        shutil.copy(path, folder / path.name)
    monkeypatch.chdir(tmp_path)
    return folder


@pytest.fixture(scope="session")
def engine_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's one folder for exported and quantised models, never the user's home: the
    demo, the engine and the pipeline tests build the same artefacts, each built once.
    OPTLAB_TEST_ENGINES names a folder shared by concurrent sessions (scripts/test.sh runs the
    integration and e2e lanes side by side; engine builds are safe against each other)."""
    shared = os.environ.get("OPTLAB_TEST_ENGINES")
    return Path(shared) if shared else tmp_path_factory.getbasetemp() / "engines"


@pytest.fixture(scope="session")
def measured_chain(tmp_path_factory: pytest.TempPathFactory) -> MeasuredChain:
    """The synthetic chain measured once for the session (tests/support/chain.py): baseline
    (2 ms) -> faster (1 ms) -> {slower (4 ms), back (2 ms)}, each run `COMPARED`. Read it,
    never write to it: a test that adds runs or files takes `chain_copy`."""
    return measure_chain(tmp_path_factory.mktemp("measured-chain"))


@pytest.fixture
def chain_copy(
    measured_chain: MeasuredChain,
    sqlite_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> MeasuredChain:
    """The session's measured chain with its own copy of the database, at `sqlite_url` (so
    `invoke` reads and writes the copy); the test's folder is the working directory and
    OPTLAB_DB is unset. The experiment files are the session's: write new steps in tmp_path."""
    database = Path(sqlite_url.removeprefix("sqlite:///"))
    copy_database(measured_chain.database, database.parent, database.name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPTLAB_DB", raising=False)
    return MeasuredChain(measured_chain.folder, database, measured_chain.lines, measured_chain.pair)


@pytest.fixture(scope="session")
def synthetic_chain(measured_chain: MeasuredChain) -> tuple[Path, Path]:
    """The measured chain's first two runs (baseline -> faster): its folder and the `pair`
    database (read it, copy it before adding to it)."""
    return measured_chain.folder, measured_chain.pair


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's folder as the working directory, its python files importable (a python
    target's factory module is written there). A module may define its own `folder`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


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
