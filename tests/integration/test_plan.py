"""The one-variable rule and the lineage of stored configs, through the library API."""

from __future__ import annotations

from pathlib import Path

import pytest

from optlab.chain.lineage import prepare
from optlab.errors import ConfigError, NotFoundError, RefusedError
from optlab.store import Store
from tests.support.files import write


@pytest.fixture
def store(sqlite_url: str) -> Store:
    return Store.open(sqlite_url)


def _add_run(store: Store, experiment: str) -> int:
    return store.create_run(
        experiment=experiment,
        protocol_name="quick",
        protocol={"name": "quick"},
        provisional=True,
        environment_id=None,
        code_identity={},
        git_commit=None,
        git_dirty=None,
    )


def test_reference_chain_plans_one_variable_each(chain_dir: Path, store: Store) -> None:
    expected = {
        "01-dynamic-batch.yaml": "batching",
        "02-fp16.yaml": "precision",
        "03-preprocess.yaml": "preprocess",
    }
    for filename, variable in expected.items():
        plan = prepare(chain_dir / filename, store).plan
        assert plan.variable is not None and plan.variable.name == variable
    prepared = prepare(chain_dir / "03-preprocess.yaml", store)
    assert [link.name for link in prepared.chain] == [
        "baseline",
        "dynamic-batch",
        "fp16",
        "preprocess",
    ]
    assert {link.action for link in prepared.chain} == {"unchanged"}
    fp16 = store.get_experiment("fp16")
    assert fp16 is not None and fp16.current_config is not None
    # The stored config is the parent's stored config plus the change, fully resolved.
    assert fp16.current_config.config["knobs"]["batching"]["mode"] == "dynamic"
    assert fp16.current_config.config["knobs"]["precision"] == "fp16"


def test_two_variables_refused_naming_both(chain_dir: Path, store: Store) -> None:
    path = write(
        chain_dir,
        "bad.yaml",
        "name: two\nparent: baseline\nchange:\n  batching: {mode: dynamic}\n  precision: fp16\n",
    )
    with pytest.raises(RefusedError) as info:
        prepare(path, store)
    message, hint = info.value.message, info.value.hint or ""
    assert "changes 2 variables" in message
    assert (
        "batching: {mode: off} -> {mode: dynamic, max_batch_size: 8, max_wait_ms: 10.0, "
        "max_queue: 1024}" in message
    )
    assert "precision: fp32 -> fp16" in message
    assert "bad-batching.yaml: name two-batching, parent baseline" in hint
    assert "bad.yaml: name two, parent two-batching, change {precision: fp16}" in hint
    assert store.get_experiment("two") is None  # refused before anything was stored


def test_setting_a_knob_to_its_current_value_is_not_a_variable(
    chain_dir: Path, store: Store
) -> None:
    path = write(
        chain_dir,
        "s.yaml",
        "name: s\nparent: baseline\nchange: {precision: fp32, threads: 4}\n",
    )
    plan = prepare(path, store).plan
    assert plan.variable is not None and plan.variable.name == "threads"


def test_no_change_refused_unless_repeat(chain_dir: Path, store: Store) -> None:
    path = write(chain_dir, "r.yaml", "name: r\nparent: baseline\nchange: {precision: fp32}\n")
    with pytest.raises(RefusedError, match="changes no variable") as info:
        prepare(path, store)
    assert "repeat: true" in (info.value.hint or "")
    write(chain_dir, "r.yaml", "name: r\nparent: baseline\nrepeat: true\n")
    plan = prepare(path, store).plan
    assert plan.repeat and plan.variable is None


@pytest.mark.parametrize(
    "change",
    [
        "workload: {load: {mode: closed, concurrency: 8}}",
        "protocol: {name: quick}",
        "target: {kind: http, url: 'http://127.0.0.1:9'}",
        "slo: {p99_ms: 20}",
    ],
)
def test_baseline_sections_cannot_change_in_a_step(
    chain_dir: Path, store: Store, change: str
) -> None:
    path = write(chain_dir, "h.yaml", f"name: h\nparent: baseline\nchange:\n  {change}\n")
    section = change.split(":")[0]
    with pytest.raises(RefusedError) as info:
        prepare(path, store)
    assert f"h.yaml:4: refused: the change sets {section}" in info.value.message
    assert "new baseline" in (info.value.hint or "")


def test_typo_in_a_step_change_points_at_the_step_file(chain_dir: Path, store: Store) -> None:
    path = write(chain_dir, "t.yaml", "name: t\nparent: baseline\nchange:\n  precison: fp16\n")
    with pytest.raises(ConfigError) as info:
        prepare(path, store)
    assert f"{path}:4: change.precison: unknown key" in info.value.message
    assert "did you mean 'precision'" in (info.value.hint or "")


def test_missing_parent_suggests_names(chain_dir: Path, store: Store) -> None:
    path = write(chain_dir, "m.yaml", "name: m\nparent: baseline.yaml\nchange: {threads: 4}\n")
    with pytest.raises(NotFoundError) as info:
        prepare(path, store)
    assert "parent 'baseline.yaml' not found" in info.value.message
    assert "did you mean 'baseline'" in (info.value.hint or "")


def test_cycle_refused(chain_dir: Path, store: Store) -> None:
    write(chain_dir, "a.yaml", "name: a\nparent: b\nchange: {threads: 4}\n")
    path = write(chain_dir, "b.yaml", "name: b\nparent: a\nchange: {threads: 8}\n")
    with pytest.raises(ConfigError, match="loops back: b -> a -> b"):
        prepare(path, store)


def test_duplicate_names_in_a_folder_refused(chain_dir: Path, store: Store) -> None:
    write(chain_dir, "copy.yaml", (chain_dir / "baseline.yaml").read_text())
    with pytest.raises(ConfigError, match="'baseline' is defined by"):
        prepare(chain_dir / "01-dynamic-batch.yaml", store)


def test_edited_baseline_with_runs_is_refused(chain_dir: Path, store: Store) -> None:
    prepare(chain_dir / "01-dynamic-batch.yaml", store)
    _add_run(store, "baseline")
    baseline = chain_dir / "baseline.yaml"
    original = baseline.read_text()
    baseline.write_text(original.replace("threads: 2", "threads: 4"))
    with pytest.raises(RefusedError) as info:
        prepare(chain_dir / "01-dynamic-batch.yaml", store)
    assert "has 1 stored run" in info.value.message
    assert "knobs.threads: 2 -> 4" in info.value.message
    assert "new baseline" in (info.value.hint or "") and "baseline-v2" in (info.value.hint or "")
    stored = store.get_experiment("baseline")
    assert stored is not None and stored.current_config is not None
    assert stored.current_config.config["knobs"]["threads"] == 2  # nothing stored was lost
    baseline.write_text(original + "\n# a comment does not change the config\n")
    assert prepare(chain_dir / "baseline.yaml", store).head.action == "unchanged"


def test_edited_baseline_without_runs_is_replaced(chain_dir: Path, store: Store) -> None:
    prepare(chain_dir / "baseline.yaml", store)
    baseline = chain_dir / "baseline.yaml"
    baseline.write_text(baseline.read_text().replace("threads: 2", "threads: 4"))
    prepared = prepare(chain_dir / "01-dynamic-batch.yaml", store)
    assert prepared.chain[0].action == "replaced (no runs yet)"
    assert prepared.plan.config["knobs"]["threads"] == 4


def test_same_name_from_another_file_is_refused(
    chain_dir: Path, store: Store, tmp_path: Path
) -> None:
    prepare(chain_dir / "baseline.yaml", store)
    other = tmp_path / "other"
    other.mkdir()
    text = (chain_dir / "baseline.yaml").read_text().replace("threads: 2", "threads: 8")
    with pytest.raises(RefusedError, match="already used by"):
        prepare(write(other, "baseline.yaml", text), store)


def test_parent_known_only_to_the_database(chain_dir: Path, store: Store) -> None:
    prepare(chain_dir / "01-dynamic-batch.yaml", store)
    (chain_dir / "baseline.yaml").unlink()
    prepared = prepare(chain_dir / "01-dynamic-batch.yaml", store)
    assert prepared.chain[0].action == "from database"
    assert prepared.plan.variable is not None and prepared.plan.variable.name == "batching"


# -- comparability: the one rule for protocol, environment and code ----------------------

FINGERPRINT = {
    "hardware": {"cpu": {"model": "x", "cores": 2}},
    "software": {"python": {"version": "3.12.1", "executable": "/usr/bin/python3"}},
    "runtime": {"load_avg": 0.5},
}


def test_protocols_compare_by_every_field_but_the_derived_provisional() -> None:
    from optlab.chain.comparability import protocol_key, same_protocol

    quick = {"name": "quick", "duration_s": 5.0, "warmup": "fixed", "provisional": True}
    assert same_protocol(quick, {**quick, "provisional": False})
    assert same_protocol(quick, dict(reversed(list(quick.items()))))  # key order is no field
    assert not same_protocol(quick, {**quick, "duration_s": 10.0})
    assert not same_protocol(quick, {k: v for k, v in quick.items() if k != "warmup"})
    assert protocol_key(quick) == (("duration_s", 5.0), ("name", "quick"), ("warmup", "fixed"))


def test_environments_differ_only_by_material_fields() -> None:
    from optlab.chain.comparability import NO_ENVIRONMENT, environment_difference

    moved = {**FINGERPRINT, "runtime": {"load_avg": 3.0}}
    moved["software"] = {"python": {"version": "3.12.1", "executable": "/opt/python3"}}
    assert environment_difference(FINGERPRINT, moved) is None  # immaterial fields only
    assert environment_difference(None, None) is None
    assert environment_difference(FINGERPRINT, None) == NO_ENVIRONMENT
    assert environment_difference(None, FINGERPRINT) == NO_ENVIRONMENT
    upgraded = {**FINGERPRINT, "software": {"python": {"version": "3.13.0"}}}
    found = environment_difference(FINGERPRINT, upgraded)
    assert found is not None
    assert found.splitlines()[0] == "software.python.version: '3.12.1' -> '3.13.0'"


def test_code_differences_are_named_field_by_field() -> None:
    from optlab.chain.comparability import code_difference

    code = {"target": "builtin:synthetic", "sha256": "a" * 8}
    assert code_difference(code, dict(code)) is None
    found = code_difference(code, {**code, "sha256": "b" * 8})
    assert found is not None and found.splitlines() == ["code.sha256: aaaaaaaa -> bbbbbbbb"]
