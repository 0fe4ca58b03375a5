"""Python targets' knobs, and the target-scoped code identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from optlab.config.loading import load_experiment, search_paths
from optlab.errors import ConfigError
from optlab.run.fingerprint import code_section
from optlab.targets.identity import code_identity
from optlab.targets.resolve import resolve_baseline
from tests.support.files import write

MODULE = """\
from pydantic import BaseModel, ConfigDict


class Knobs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch: int = 1
    mode: str = "eager"


def build(knobs):
    return lambda request: request


def inputs(workload):
    return [b"x"] * 4
"""


def _baseline(folder: Path, module: str, knobs_model: bool, knobs: str) -> Path:
    model = f'  knobs_model: "{module}:Knobs"\n' if knobs_model else ""
    return write(
        folder,
        "base.yaml",
        f'name: base\ntarget:\n  kind: python\n  factory: "{module}:build"\n'
        f'  inputs: "{module}:inputs"\n{model}knobs: {knobs}\n'
        "workload: {load: {mode: closed, concurrency: 1}}\n",
    )


def test_python_target_knob_model_validates(tmp_path: Path) -> None:
    write(tmp_path, "mytarget_a.py", MODULE)
    config = resolve_baseline(
        load_experiment(_baseline(tmp_path, "mytarget_a", True, "{batch: 4}"))
    )
    assert config["knobs"] == {"batch": 4, "mode": "eager"}
    with pytest.raises(ConfigError) as info:
        resolve_baseline(load_experiment(_baseline(tmp_path, "mytarget_a", True, "{btch: 4}")))
    assert "knobs.btch: unknown key" in info.value.message
    assert "did you mean 'batch'" in (info.value.hint or "")


def test_python_target_free_form_knobs(tmp_path: Path) -> None:
    write(tmp_path, "mytarget_b.py", MODULE)
    path = _baseline(tmp_path, "mytarget_b", False, "{anything: [1, 2], nested: {a: b}}")
    config = resolve_baseline(load_experiment(path))
    assert config["knobs"] == {"anything": [1, 2], "nested": {"a": "b"}}


def test_knob_model_import_errors_name_the_field(tmp_path: Path) -> None:
    path = _baseline(tmp_path, "no_such_module_xyz", True, "{}")
    with pytest.raises(ConfigError, match="target.knobs_model: cannot import module"):
        resolve_baseline(load_experiment(path))
    write(tmp_path, "broken_mod.py", "raise RuntimeError('boom')\n")
    with pytest.raises(ConfigError, match="raised RuntimeError: boom"):
        resolve_baseline(load_experiment(_baseline(tmp_path, "broken_mod", True, "{}")))


def test_code_identity_follows_the_target_code_only(tmp_path: Path) -> None:
    module = write(tmp_path, "mytarget_c.py", MODULE)
    path = _baseline(tmp_path, "mytarget_c", False, "{}")
    target = load_experiment(path).spec.model_dump(mode="json")["target"]
    paths = search_paths(load_experiment(path).source)
    before = code_identity(target, paths)
    assert before["modules"]["mytarget_c"] is not None
    write(tmp_path, "another-experiment.yaml", "name: other\nparent: base\n")
    assert code_identity(target, paths) == before  # a new experiment file changes nothing
    module.write_text(MODULE + "\n# tuned\n")
    assert code_identity(target, paths) != before  # editing the code under test does


def test_package_identity_covers_sibling_modules(tmp_path: Path) -> None:
    package = tmp_path / "mypkg_d"
    package.mkdir()
    write(package, "__init__.py", "")
    write(package, "serve.py", MODULE)
    helper = write(package, "helper.py", "X = 1\n")
    target = {"kind": "python", "factory": "mypkg_d.serve:build"}
    before = code_identity(target, [tmp_path])
    helper.write_text("X = 2\n")
    assert code_identity(target, [tmp_path]) != before


def test_builtin_and_http_identity(chain_dir: Path) -> None:
    section = code_section(chain_dir / "baseline.yaml")
    assert section["target"]["kind"] == "builtin"
    assert section["target"]["optlab"] == section["optlab"]
    http = code_identity({"kind": "http", "url": "http://127.0.0.1:1", "code_version": "v7"}, [])
    assert http == {"kind": "http", "declared": "v7"}
