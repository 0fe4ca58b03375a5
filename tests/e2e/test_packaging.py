"""The wheel ships the migrations, so `optlab db upgrade` works after a non-editable install."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support.paths import REPO


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            str(REPO),
        ],
        check=True,
        timeout=300,
    )
    (found,) = out.glob("optlab-*.whl")
    return found


def test_wheel_contains_migrations(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert "optlab/_migrations/env.py" in names
    assert "optlab/_migrations/script.py.mako" in names
    assert any(n.startswith("optlab/_migrations/versions/0001") for n in names)
    assert "optlab/cli/main.py" in names
    assert "optlab/reference/classifier/classifier.pt" in names  # the reference weights ship too
    # ... and the chains `optlab demo` runs.
    assert "optlab/_experiments/cpu/baseline.yaml" in names
    assert "optlab/_experiments/gpu/03-preprocess.yaml" in names


def test_installed_wheel_upgrades_a_database(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        timeout=300,
    )
    workdir = tmp_path / "work"
    workdir.mkdir()
    # PYTHONPATH puts the installed copy ahead of the editable checkout.
    env = {**os.environ, "PYTHONPATH": str(target)}
    env.pop("OPTLAB_DB", None)

    def optlab(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "optlab", *args],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )

    where = subprocess.run(
        [sys.executable, "-c", "import optlab.store as s; print(s.migrations_dir())"],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.strip().startswith(str(target))
    upgraded = optlab("db", "upgrade")
    assert upgraded.returncode == 0, upgraded.stderr
    assert "upgraded database from empty" in upgraded.stdout
    assert (workdir / ".optlab" / "optlab.db").exists()
    current = optlab("db", "current")
    assert current.returncode == 0 and "up to date" in current.stdout


def test_the_notebook_extra_installs_what_the_readme_tells_a_user_to_start() -> None:
    # The README and the notebook say to start Jupyter: the extra they name must install a
    # Jupyter frontend (the `jupyter lab` command), not only a kernel.
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    frontends = [r for r in extras["notebook"] if r.split(">")[0].strip() == "jupyterlab"]
    assert frontends, extras["notebook"]
    readme = (REPO / "README.md").read_text()
    assert "-e '.[notebook]'" in readme
    assert "jupyter lab notebooks/explore_results.ipynb" in " ".join(readme.split())
