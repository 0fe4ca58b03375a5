"""The target kinds behind the registry: one module each, found by name, the reference workload
loaded only when a kind that builds it is used."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from optlab.config.models import BaselineFile
from optlab.errors import ConfigError
from optlab.targets.identity import code_identity
from optlab.targets.registry import KIND_MODULES, find_kind, kind_named, kind_of
from optlab.targets.service_env import describe_service, service_environment

WORKLOAD = {"load": {"mode": "closed", "concurrency": 1}}


def _target(target: dict[str, object]) -> BaselineFile:
    return BaselineFile.model_validate({"name": "b", "target": target, "workload": WORKLOAD})


@pytest.mark.parametrize(
    ("target", "name", "in_process"),
    [
        ({"kind": "builtin"}, "builtin", True),
        ({"kind": "builtin", "name": "synthetic"}, "synthetic", True),
        ({"kind": "python", "factory": "m:build"}, "python", True),
        ({"kind": "http", "url": "http://127.0.0.1:9/"}, "http", False),
        ({"kind": "command", "command": ["x"], "url": "http://127.0.0.1:9/"}, "command", False),
    ],
)
def test_each_file_kind_finds_its_module(
    target: dict[str, object], name: str, in_process: bool
) -> None:
    kind = kind_of(_target(target).target)
    assert kind.name == name and kind.in_process is in_process
    assert type(kind).__module__ == KIND_MODULES[name]
    stored = _target(target).target.model_dump(mode="json")
    assert find_kind(stored) is kind


def test_a_kind_this_optlab_does_not_know_keeps_its_declared_identity(tmp_path: Path) -> None:
    stored = {"kind": "grpc", "code_version": "v7"}
    assert find_kind(stored) is None
    assert code_identity(stored, [tmp_path]) == {"kind": "grpc", "declared": "v7"}
    assert service_environment(stored, tmp_path) is None
    assert describe_service(None, "grpc") is None
    assert find_kind({"kind": "synthetic"}) is None  # a registry name, not a file's kind
    with pytest.raises(ConfigError, match="not a kind of target"):
        kind_named("grpc")


SERVING = ("queue", "preprocess", "infer", "postprocess")


@pytest.mark.parametrize(
    ("target", "starts_service"),
    [
        ({"kind": "builtin"}, False),
        ({"kind": "builtin", "name": "synthetic"}, False),
        ({"kind": "python", "factory": "m:build"}, False),
        ({"kind": "http", "url": "http://127.0.0.1:9/"}, False),
        ({"kind": "command", "command": ["x"], "url": "http://127.0.0.1:9/"}, True),
    ],
)
def test_what_each_kind_tells_diagnose(target: dict[str, object], starts_service: bool) -> None:
    kind = kind_of(_target(target).target)
    # Every kind lists a serving pipeline's stages in request order (the classifier's, and a
    # service's Server-Timing stages: `optlab serve` reports these names), the others by name.
    assert kind.stage_order == SERVING and kind.starts_service is starts_service
    # The documented convention (docs/run-json.md "batching"): the `queue` stage, the
    # `batching` figures.
    assert (kind.batch_wait_stage, kind.batch_figures) == ("queue", "batching")


def test_a_service_kind_checks_its_templates_and_its_declared_remedies() -> None:
    remedy = {"rule": "serialised", "knob": "workers", "increment": 1, "why": "w"}
    for target in (
        {"kind": "http", "url": "http://127.0.0.1:9/{knobs.path}", "remedies": [remedy]},
        {"kind": "command", "command": ["x"], "url": "http://127.0.0.1:9/{knobs.path}",
         "remedies": [remedy]},
    ):  # fmt: skip
        spec = _target(target).target
        kind_of(spec).check_knobs(spec, {"path": "p", "workers": 2})
        with pytest.raises(ConfigError, match="'workers' is not a knob"):
            kind_of(spec).check_knobs(spec, {"path": "p"})
        with pytest.raises(ConfigError, match="path"):
            kind_of(spec).check_knobs(spec, {"workers": 2})


def test_a_module_of_the_same_name_from_another_folder_is_not_reused(tmp_path: Path) -> None:
    # Two experiments' folders each with their own `twin_target.py`, used in one process (a
    # notebook, the CLI's tests): the second folder's code is hashed and built, not the first's.
    from optlab.targets.references import import_reference, module_origin

    first, second = tmp_path / "a", tmp_path / "b"
    for folder, answer in ((first, 1), (second, 2)):
        folder.mkdir()
        (folder / "twin_target.py").write_text(f"def build(knobs):\n    return {answer}\n")
    try:
        assert import_reference("twin_target:build", [first], "target.factory")({}) == 1
        assert module_origin("twin_target", [second]) == second / "twin_target.py"
        assert import_reference("twin_target:build", [second], "target.factory")({}) == 2
    finally:
        sys.modules.pop("twin_target", None)
