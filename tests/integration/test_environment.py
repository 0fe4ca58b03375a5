"""Environment fingerprint: real collection on this machine, and the material/immaterial rule."""

from __future__ import annotations

import copy
import importlib.metadata
import json
import os
import shutil
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
    ABSENT,
    EnvComparison,
    compare_fingerprints,
    material_hash,
    material_view,
)


@pytest.fixture(scope="module")
def fp() -> dict[str, Any]:
    return collect_fingerprint()


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


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
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.skipif(_nvml_works(), reason="NVML is usable on this machine")
def test_no_nvml_means_no_gpus_and_a_note(fp: dict[str, Any]) -> None:
    hardware = fp["hardware"]
    assert hardware["gpus"] == []
    assert hardware["gpu_count"] == 0
    assert hardware["cpu_per_gpu"] is None
    assert hardware["gpu_error"]
    assert fp["software"]["nvidia"] == {"driver_version": None, "cuda_driver_version": None}


def test_fingerprint_round_trips_through_json(fp: dict[str, Any]) -> None:
    again = json.loads(json.dumps(fp))
    assert again == fp
    assert compare_fingerprints(fp, again).comparable
    assert material_hash(again) == material_hash(fp)


def test_disk_describes_the_data_dir(tmp_path: Path) -> None:
    disk = collect_fingerprint(data_dir=tmp_path)["hardware"]["disk"]
    usage = psutil.disk_usage(str(tmp_path))
    assert disk["path"] == str(tmp_path)
    assert disk["total_bytes"] == usage.total


# --------------------------------------------------------------------------- comparison


def test_fingerprint_is_comparable_with_itself(fp: dict[str, Any]) -> None:
    result = compare_fingerprints(fp, copy.deepcopy(fp))
    assert result == EnvComparison(material=[], immaterial=[])
    assert result.comparable
    assert result.explain() == ""


def test_torch_version_change_is_material(fp: dict[str, Any]) -> None:
    new = copy.deepcopy(fp)
    new["software"]["packages"]["torch"] = "0.0.1"
    result = compare_fingerprints(fp, new)
    assert not result.comparable
    assert [d.path for d in result.material] == ["software.packages.torch"]
    assert result.material[0].new == "0.0.1"
    old_torch = fp["software"]["packages"]["torch"]
    assert result.explain() == f"software.packages.torch: {old_torch!r} -> '0.0.1'"


def test_runtime_and_provenance_changes_are_immaterial(fp: dict[str, Any]) -> None:
    new = copy.deepcopy(fp)
    new["runtime"]["hostname"] = "elsewhere"
    new["runtime"]["memory_available_bytes"] += 1
    new["provenance"]["git"]["commit"] = "f" * 40
    new["hardware"]["disk"]["free_bytes"] = 1
    new["software"]["python"]["executable"] = "/somewhere/else/python"
    new["warnings"] = ["something"]
    result = compare_fingerprints(fp, new)
    assert result.comparable
    paths = {d.path for d in result.immaterial}
    assert {
        "runtime.hostname",
        "runtime.memory_available_bytes",
        "provenance.git.commit",
        "hardware.disk.free_bytes",
        "software.python.executable",
        "warnings",  # an empty list vs a list is a whole-value difference
    } <= paths
    assert all(not d.material for d in result.immaterial)
    assert material_hash(new) == material_hash(fp)


def test_material_hash_changes_with_material_fields(fp: dict[str, Any]) -> None:
    new = copy.deepcopy(fp)
    new["hardware"]["cpu"]["model"] = "Some Other CPU"
    assert material_hash(new) != material_hash(fp)
    assert len(material_hash(fp)) == 64
    explained = compare_fingerprints(fp, new).explain()
    old_model = fp["hardware"]["cpu"]["model"]
    assert explained == f"hardware.cpu.model: {old_model!r} -> 'Some Other CPU'"


def test_material_view_drops_only_immaterial_fields(fp: dict[str, Any]) -> None:
    view = material_view(fp)
    assert "runtime" not in view and "provenance" not in view and "warnings" not in view
    assert "free_bytes" not in view["hardware"]["disk"]
    assert "executable" not in view["software"]["python"]
    assert view["hardware"]["cpu"] == fp["hardware"]["cpu"]
    assert view["software"]["packages"] == fp["software"]["packages"]
    assert "runtime" in fp  # the input is not modified


def test_gpu_list_is_flattened_by_index() -> None:
    gpu: dict[str, Any] = {
        "index": 0,
        "name": "NVIDIA H100",
        "memory_total_bytes": 80 << 30,
        "uuid": "GPU-a",
    }
    old: dict[str, Any] = {"hardware": {"gpus": [gpu], "gpu_count": 1}}
    new = copy.deepcopy(old)
    new["hardware"]["gpus"][0]["name"] = "NVIDIA A100"
    new["hardware"]["gpus"][0]["uuid"] = "GPU-b"
    result = compare_fingerprints(old, new)
    assert [d.path for d in result.material] == ["hardware.gpus.0.name"]
    # Another physical card of the same model is the same hardware.
    assert [d.path for d in result.immaterial] == ["hardware.gpus.0.uuid"]

    added = copy.deepcopy(old)
    added["hardware"]["gpus"].append({**gpu, "index": 1, "uuid": "GPU-c"})
    added["hardware"]["gpu_count"] = 2
    paths = {d.path for d in compare_fingerprints(old, added).material}
    assert {"hardware.gpus.1.name", "hardware.gpu_count"} <= paths


def test_older_schema_fingerprint_compares_without_crashing(fp: dict[str, Any]) -> None:
    old = copy.deepcopy(fp)
    old["schema"] = 0
    del old["software"]["packages"]["tensorrt"]
    del old["hardware"]["cpu"]
    old["hardware"]["gpus"] = "not-a-list"
    result = compare_fingerprints(old, fp)
    assert not result.comparable
    by_path = {d.path: d for d in result.material}
    assert by_path["software.packages.tensorrt"].old is ABSENT
    assert by_path["hardware.cpu.logical_cores"].old is ABSENT
    assert by_path["schema"].old == 0
    assert "<absent>" in result.explain()
    # And the other way round: keys only the old one has.
    assert any(d.new is ABSENT for d in compare_fingerprints(fp, old).material)


def test_empty_list_versus_missing_key_is_a_difference() -> None:
    result = compare_fingerprints({"hardware": {"gpus": []}}, {"hardware": {}})
    assert [(d.path, d.old, d.new) for d in result.material] == [("hardware.gpus", [], ABSENT)]
    # An empty section states no facts, so it matches a missing one.
    assert compare_fingerprints({"hardware": {}}, {}).comparable


def test_value_type_change_is_a_difference() -> None:
    result = compare_fingerprints({"a": 1}, {"a": True})
    assert [d.path for d in result.material] == ["a"]


# --------------------------------------------------------------------------- hazards


def _software(**packages: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "torch": None,
        "torch_cuda": None,
        "onnxruntime": None,
        "onnxruntime_gpu": None,
    }
    base.update(packages)
    return {"packages": base, "nvidia": {"driver_version": None, "cuda_driver_version": None}}


def test_both_onnxruntime_packages_warn(fp: dict[str, Any]) -> None:
    edited = copy.deepcopy(fp)
    edited["software"]["packages"]["onnxruntime"] = "1.17.0"
    edited["software"]["packages"]["onnxruntime_gpu"] = "1.17.0"
    warnings = hazard_warnings(edited)
    assert any("onnxruntime-gpu" in w and "Uninstall both" in w for w in warnings)
    edited["software"]["packages"]["onnxruntime_gpu"] = None
    assert not any("Uninstall both" in w for w in hazard_warnings(edited))


def test_torch_cuda_newer_than_driver_warns() -> None:
    fp = {"hardware": {"gpu_count": 1}, "software": _software(torch="2.3.0", torch_cuda="12.4")}
    fp["software"]["nvidia"]["cuda_driver_version"] = "12.2"
    assert any("driver supports at most CUDA 12.2" in w for w in hazard_warnings(fp))
    fp["software"]["nvidia"]["cuda_driver_version"] = "12.10"  # numeric, not string, comparison
    assert hazard_warnings(fp) == []


def test_gpu_with_cpu_builds_warns() -> None:
    fp = {"hardware": {"gpu_count": 2}, "software": _software(torch="2.3.0+cpu", onnxruntime="1")}
    warnings = hazard_warnings(fp)
    assert len(warnings) == 2
    assert any("CPU build" in w for w in warnings)
    assert any("install onnxruntime-gpu" in w for w in warnings)
    fp["hardware"]["gpu_count"] = 0
    assert hazard_warnings(fp) == []


def test_hazard_warnings_tolerate_a_sparse_fingerprint() -> None:
    assert hazard_warnings({}) == []


def test_collected_warnings_match_the_pure_helper(fp: dict[str, Any]) -> None:
    assert fp["warnings"] == hazard_warnings(fp)


# --------------------------------------------------------------------------- provenance

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


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
