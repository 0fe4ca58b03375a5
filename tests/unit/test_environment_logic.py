"""The environment fingerprint's material/immaterial rule and its hazard warnings, on a
fingerprint recorded once from a real collection (tests/fixtures/env/fingerprint.json: a 2-core
CPU-only Linux machine, its host, paths and commit made up) and on hand-built ones: nothing is
collected here."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from optlab.env.collect import hazard_warnings
from optlab.env.compare import (
    ABSENT,
    EnvComparison,
    compare_fingerprints,
    material_hash,
    material_view,
)

RECORDED = Path(__file__).parents[1] / "fixtures" / "env" / "fingerprint.json"


@pytest.fixture
def fp() -> dict[str, Any]:
    recorded: dict[str, Any] = json.loads(RECORDED.read_text(encoding="utf-8"))
    return recorded


def test_fingerprint_round_trips_through_json(fp: dict[str, Any]) -> None:
    again = json.loads(json.dumps(fp))
    assert again == fp
    assert compare_fingerprints(fp, again).comparable
    assert material_hash(again) == material_hash(fp)


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
