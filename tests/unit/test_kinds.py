"""The target kinds behind the registry: one module each, found by name, the reference workload
loaded only when a kind that builds it is used."""

from __future__ import annotations

import json
import subprocess
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


def test_the_reference_workload_loads_only_with_a_kind_that_builds_it() -> None:
    script = """
import json, sys
from optlab.targets.registry import kind_named
from optlab.targets.resolve import resolve_baseline
for name in ("python", "http", "command"):
    kind_named(name)
before = sorted(m for m in sys.modules if m.startswith("optlab.reference"))
model = kind_named("synthetic").knob_model(None, [])
after = sorted(m for m in sys.modules if m.startswith("optlab.reference"))
print(json.dumps([before, after, model.__name__]))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    before, after, model = json.loads(done.stdout.strip().splitlines()[-1])
    assert before == []
    assert "optlab.reference.synthetic" in after and model == "SyntheticKnobs"


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
