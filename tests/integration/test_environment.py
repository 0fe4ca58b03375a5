"""Environment fingerprint: real collection on this machine, and the material/immaterial rule."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from optlab.env.collect import (
    FINGERPRINT_SCHEMA,
    collect_fingerprint,
    git_provenance,
    hazard_warnings,
)
from optlab.env.compare import (
    compare_fingerprints,
)
from tests.support.capabilities import needs_git, without_nvml
from tests.support.proc import run_python


@pytest.fixture(scope="module")
def fp() -> dict[str, Any]:
    return collect_fingerprint()


# --------------------------------------------------------------------------- collection


def test_collect_describes_this_machine(fp: dict[str, Any]) -> None:
    assert fp["schema"] == FINGERPRINT_SCHEMA
    cpu = fp["hardware"]["cpu"]
    assert cpu["logical_cores"] == os.cpu_count()
    assert isinstance(cpu["model"], str) and cpu["model"]
    if hasattr(os, "sched_getaffinity"):
        assert cpu["affinity_cores"] == len(os.sched_getaffinity(0))
    assert fp["hardware"]["memory"]["total_bytes"] == psutil.virtual_memory().total
    assert fp["software"]["python"]["executable"] == sys.executable
    assert fp["software"]["python"]["version"].startswith(
        f"{sys.version_info.major}.{sys.version_info.minor}."
    )


def test_package_versions_come_from_metadata(fp: dict[str, Any]) -> None:
    packages = fp["software"]["packages"]
    assert packages["torch"] == importlib.metadata.version("torch")
    assert packages["numpy"] == importlib.metadata.version("numpy")
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("onnxruntime-gpu")
    assert packages["onnxruntime_gpu"] is None
    if "+cpu" in packages["torch"]:
        assert packages["torch_cuda"] is None


def test_collect_does_not_import_heavy_modules() -> None:
    # A fresh interpreter: this test process may already have imported torch elsewhere.
    code = (
        "import sys; from optlab.env.collect import collect_fingerprint; collect_fingerprint();"
        "print(sorted(m for m in ('torch', 'onnxruntime', 'tensorrt') if m in sys.modules))"
    )
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@without_nvml()
def test_no_nvml_means_no_gpus_and_a_note(fp: dict[str, Any]) -> None:
    hardware = fp["hardware"]
    assert hardware["gpus"] == []
    assert hardware["gpu_count"] == 0
    assert hardware["cpu_per_gpu"] is None
    assert hardware["gpu_error"]
    assert fp["software"]["nvidia"] == {"driver_version": None, "cuda_driver_version": None}


def test_disk_describes_the_data_dir(tmp_path: Path) -> None:
    disk = collect_fingerprint(data_dir=tmp_path)["hardware"]["disk"]
    usage = psutil.disk_usage(str(tmp_path))
    assert disk["path"] == str(tmp_path)
    assert disk["total_bytes"] == usage.total


def test_collected_warnings_match_the_pure_helper(fp: dict[str, Any]) -> None:
    assert fp["warnings"] == hazard_warnings(fp)


# --------------------------------------------------------------------------- provenance


def _git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        [
            "git",
            "-C",
            str(repo),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


@needs_git
def test_provenance_in_a_git_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    _git(tmp_path, "init", "-q", "-b", "trunk")
    (tmp_path / "model.py").write_text("x = 1\n")
    _git(tmp_path, "add", "model.py")
    _git(tmp_path, "commit", "-q", "-m", "first")
    head = _git(tmp_path, "rev-parse", "HEAD")

    clean = git_provenance(tmp_path)
    assert clean == {"commit": head, "dirty": False, "branch": "trunk"}

    (tmp_path / "model.py").write_text("x = 2\n")
    dirty = collect_fingerprint(repo_dir=tmp_path)["provenance"]["git"]
    assert dirty == {"commit": head, "dirty": True, "branch": "trunk"}


@needs_git
def test_provenance_outside_a_repo_is_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert git_provenance(tmp_path) == {"commit": None, "dirty": None, "branch": None}


def test_provenance_for_a_missing_directory_is_none(tmp_path: Path) -> None:
    assert git_provenance(tmp_path / "does-not-exist") == {
        "commit": None,
        "dirty": None,
        "branch": None,
    }


def test_performance_environment_variables_are_material(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = collect_fingerprint()
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    after = collect_fingerprint()
    assert after["software"]["env"]["OMP_NUM_THREADS"] == "3"
    comparison = compare_fingerprints(before, after)
    assert not comparison.comparable
    assert [d.path for d in comparison.material] == ["software.env.OMP_NUM_THREADS"]
