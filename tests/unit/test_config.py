"""Loading experiment files: every mistake names the file, the line, the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from optlab.config.loading import load_experiment
from optlab.config.merge import deep_merge
from optlab.config.models import BaselineFile, StepFile
from optlab.errors import ConfigError
from optlab.targets.resolve import resolve_baseline
from tests.support.files import write

BASELINE = """\
name: base
target: {kind: builtin, name: image-classifier}
knobs:
  engine: torch
  precision: fp32
  batching: {mode: off}
  threads: 2
workload:
  load: {mode: closed, concurrency: 4}
"""


def test_reference_chain_loads(chain_dir: Path) -> None:
    base = load_experiment(chain_dir / "baseline.yaml")
    assert isinstance(base.spec, BaselineFile)
    step = load_experiment(chain_dir / "01-dynamic-batch.yaml")
    assert isinstance(step.spec, StepFile)
    assert step.parent == "baseline"
    assert step.spec.change["batching"]["max_batch_size"] == 8


def test_resolved_baseline_is_full_and_canonical(tmp_path: Path) -> None:
    config = resolve_baseline(load_experiment(write(tmp_path, "b.yaml", BASELINE)))
    # Unquoted `off` stays the string "off" (YAML 1.2), and defaults fill every knob.
    assert config["knobs"]["batching"] == {"mode": "off"}
    assert config["knobs"]["cache"] == {"mode": "off"}
    assert config["knobs"]["device"] == "cpu"
    assert config["protocol"]["name"] == "full"
    assert config["workload"]["load"] == {"mode": "closed", "concurrency": 4}


def _error(tmp_path: Path, text: str, name: str = "b.yaml") -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_and_resolve(write(tmp_path, name, text))
    return info.value


def load_and_resolve(path: Path) -> None:
    experiment = load_experiment(path)
    if isinstance(experiment.spec, BaselineFile):
        resolve_baseline(experiment)


def test_knob_typo_names_line_field_and_suggestion(tmp_path: Path) -> None:
    error = _error(tmp_path, BASELINE.replace("  precision: fp32", "  precison: fp16"))
    assert f"{tmp_path / 'b.yaml'}:5: knobs.precison: unknown key 'precison'" in error.message
    assert error.hint is not None and "did you mean 'precision'" in error.hint


def test_wrong_type_names_line_and_field(tmp_path: Path) -> None:
    error = _error(tmp_path, BASELINE.replace("threads: 2", "threads: two"))
    assert ":7: knobs.threads:" in error.message
    assert "valid integer" in error.message and "'two'" in error.message


def test_bad_choice_suggests_the_closest_value(tmp_path: Path) -> None:
    error = _error(tmp_path, BASELINE.replace("precision: fp32", "precision: fp61"))
    assert "knobs.precision: 'fp61' is not allowed" in error.message
    assert error.hint is not None and "did you mean 'fp16'" in error.hint


def test_group_field_typo_inside_a_variant(tmp_path: Path) -> None:
    text = BASELINE.replace("{mode: off}", "{mode: dynamic, max_batchsize: 8}")
    error = _error(tmp_path, text)
    assert "knobs.batching.max_batchsize: unknown key" in error.message
    assert error.hint is not None and "did you mean 'max_batch_size'" in error.hint


def test_unknown_variant_suggests_the_closest(tmp_path: Path) -> None:
    error = _error(tmp_path, BASELINE.replace("{mode: off}", "{mode: dynamc}"))
    assert "knobs.batching: 'dynamc' is not allowed" in error.message
    assert error.hint is not None and "did you mean 'dynamic'" in error.hint


def test_a_batch_of_one_is_a_setting_and_zero_is_refused(tmp_path: Path) -> None:
    """max_batch_size 1 is the baseline of a batch-size sweep (every request alone, through
    the batcher); 0 would batch nothing at all and is refused with the field and its bound."""
    one = BASELINE.replace("{mode: off}", "{mode: dynamic, max_batch_size: 1}")
    config = resolve_baseline(load_experiment(write(tmp_path, "one.yaml", one)))
    assert config["knobs"]["batching"]["max_batch_size"] == 1
    error = _error(tmp_path, BASELINE.replace("{mode: off}", "{mode: dynamic, max_batch_size: 0}"))
    assert "b.yaml:6: knobs.batching.max_batch_size:" in error.message
    assert "greater than or equal to 1" in error.message


def test_top_level_typo_and_missing_field(tmp_path: Path) -> None:
    text = BASELINE.replace("name: base", "name: base\ndescripton: x").replace(
        "workload:\n  load: {mode: closed, concurrency: 4}\n", ""
    )
    error = _error(tmp_path, text)
    assert "2 problems" in error.message
    assert ":2: descripton: unknown key" in error.message
    assert "workload: required field is missing" in error.message
    assert error.hint is not None and "did you mean 'description'" in error.hint


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    text = BASELINE.replace("threads: 2", "threads: 0").replace("engine: torch", "engine: trt")
    error = _error(tmp_path, text)
    assert "2 problems" in error.message
    assert "knobs.threads" in error.message and "knobs.engine" in error.message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("name: [unclosed\n", "not valid YAML"),
        ("", "empty file"),
        ("- a\n- b\n", "expected a mapping"),
        ("name: a\nname: b\n", "key 'name' appears twice"),
    ],
)
def test_malformed_files(tmp_path: Path, text: str, expected: str) -> None:
    error = _error(tmp_path, text)
    assert str(tmp_path / "b.yaml") in error.message
    assert expected in error.message


def test_missing_file_and_folder(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_experiment(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="is a folder"):
        load_experiment(tmp_path)


def test_step_may_not_carry_baseline_sections(tmp_path: Path) -> None:
    error = _error(tmp_path, "name: s\nparent: base\nknobs: {precision: fp16}\n", name="s.yaml")
    assert ":3:" in error.message and "'knobs'" in error.message
    assert error.hint is not None and "change" in error.hint


def test_step_cannot_be_its_own_parent(tmp_path: Path) -> None:
    error = _error(tmp_path, "name: s\nparent: s\nchange: {precision: fp16}\n", name="s.yaml")
    assert "names itself as its parent" in error.message


def test_deep_merge_replaces_a_group_whose_variant_changes() -> None:
    dynamic = {"batching": {"mode": "dynamic", "max_batch_size": 8, "max_wait_ms": 10.0}}
    assert deep_merge(dynamic, {"batching": {"mode": "off"}}) == {"batching": {"mode": "off"}}
    merged = deep_merge(dynamic, {"batching": {"max_batch_size": 16}})
    assert merged["batching"] == {"mode": "dynamic", "max_batch_size": 16, "max_wait_ms": 10.0}
    assert dynamic["batching"]["max_batch_size"] == 8  # the parent is never mutated
