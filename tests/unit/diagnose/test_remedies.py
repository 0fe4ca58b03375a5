"""Remedies a python, http or command target declares in its experiment file (`target.remedies`,
docs/experiment-files.md "Remedies"; docs/diagnose.md "From a finding to the next step"): the
knob a finding changes and how, checked at load; and a stored config that no longer parses, read
as partial evidence instead of an error."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from optlab.config.loading import load_experiment
from optlab.config.models import BaselineFile, PythonTarget
from optlab.diagnose import diagnose
from optlab.diagnose.evidence import evidence_of
from optlab.errors import ConfigError
from optlab.reports.diagnose import render_diagnosis
from optlab.targets.registry import kind_of
from optlab.targets.resolve import resolve_baseline
from tests.support.evidence import Run
from tests.support.files import write

RNG = np.random.default_rng(4)
# A 4 ms lock under 8 clients, handed over unfairly: a quarter go straight through.
HELD = np.concatenate([np.full(600, 4.1), 4.1 * RNG.integers(2, 16, 1800)])
WORKERS = {
    "rule": "serialised",
    "knob": "workers",
    "increment": 1,
    "max": 8,
    "why": "another worker takes requests while one waits",
}


def target(*remedies: dict[str, Any], kind: str = "python") -> dict[str, Any]:
    if kind == "python":
        return {"kind": "python", "factory": "m:build", "remedies": list(remedies)}
    return {"kind": kind, "url": "http://127.0.0.1:1/", "remedies": list(remedies)}


def locked(knobs: dict[str, Any], *remedies: dict[str, Any], kind: str = "python") -> Run:
    return Run(
        kind=kind,
        target=target(*remedies, kind=kind),
        knobs=knobs,
        stage_ms=HELD,
        qps=231.0,
        cpu_pct=7.0,
    )


def test_a_declared_remedy_is_the_serialised_findings_next_step() -> None:
    d = diagnose(locked({"workers": 2}, WORKERS).evidence())
    top = d.top
    assert top is not None and top.rule.id == "serialised", d.findings
    assert top.suggestion is not None
    assert (top.suggestion.knob, top.suggestion.value) == ("workers", 3)
    assert top.suggestion.why == WORKERS["why"]
    assert "next step: workers: 2 -> 3" in render_diagnosis(d, d.knobs)
    assert top.to_json()["suggestion"] == {"knob": "workers", "value": 3, "why": WORKERS["why"]}


POOL = {"rule": "serialised", "knob": "pool", "set": "lifo", "why": "w"}
SHORTER = {"rule": "serialised", "knob": "batch_ms", "multiply": 0.25, "why": "w"}
SCALED = {"rule": "serialised", "knob": "workers", "why": "w"}  # and its multiply


@pytest.mark.parametrize(
    ("knobs", "declared", "value"),
    [
        ({"workers": 7}, {**WORKERS, "increment": 2}, 8),  # stops at max
        ({"workers": 8}, WORKERS, None),  # at max already: no step
        ({"workers": 2}, {**WORKERS, "rule": "cpu-bound"}, None),  # another rule's
        ({"workers": 2}, {**WORKERS, "stage": "preprocess"}, None),  # another stage's
        ({"workers": 2}, {**WORKERS, "stage": "infer"}, 3),  # the finding's stage
        ({"pool": "fifo"}, POOL, "lifo"),
        ({"pool": "lifo"}, POOL, None),  # set already
        ({"batch_ms": 10.0}, SHORTER, 2.5),
        ({"workers": 10}, WORKERS, None),  # past max already: max never moves it back
        ({"workers": 4}, {**SCALED, "multiply": 0.5}, 2),
        ({"workers": 3}, {**SCALED, "multiply": 1.5}, 4),  # an integer knob stays one
        ({"workers": 1}, {**SCALED, "multiply": 1.2}, None),  # less than one worker more
        ({"batch_ms": 1.7e308}, {**SHORTER, "multiply": 10.0}, None),  # not finite
    ],
)
def test_each_op_its_bound_and_its_filters(
    knobs: dict[str, Any], declared: dict[str, Any], value: Any
) -> None:
    top = diagnose(locked(knobs, declared).evidence()).top
    assert top is not None and top.rule.id == "serialised"
    found = top.suggestion.value if top.suggestion is not None else None
    assert found == value and type(found) is type(value), (found, value)


def test_a_service_declares_them_too_and_the_classifier_keeps_its_own() -> None:
    served = locked({"workers": 2}, WORKERS, kind="http").evidence()
    top = diagnose(served).top
    assert top is not None and top.suggestion is not None and top.suggestion.value == 3
    # Nothing declared: prose only, as before.
    bare = diagnose(Run(stage_ms=HELD, qps=231.0, cpu_pct=7.0, knobs={"workers": 2}).evidence())
    assert bare.top is not None and bare.top.suggestion is None and bare.top.advice


def _load(remedies: list[dict[str, Any]], knobs: dict[str, Any]) -> None:
    spec = BaselineFile.model_validate(
        {
            "name": "b",
            "target": {"kind": "python", "factory": "m:build", "remedies": remedies},
            "knobs": knobs,
            "workload": {"load": {"mode": "closed", "concurrency": 1}},
        }
    )
    kind_of(spec.target).check_knobs(spec.target, dict(spec.knobs))


def test_declared_remedies_are_checked_when_the_file_loads() -> None:
    _load([WORKERS], {"workers": 2})
    with pytest.raises(ConfigError, match=r"target.remedies\[0\].knob: 'workers' is not a knob"):
        _load([WORKERS], {"threads": 2})
    with pytest.raises(ConfigError, match="not a number to increment"):
        _load([WORKERS], {"workers": "two"})
    with pytest.raises(ValidationError, match="exactly one of set, increment, multiply"):
        _load([{**WORKERS, "set": 4}], {"workers": 2})
    with pytest.raises(ValidationError, match="exactly one of"):
        _load([{k: v for k, v in WORKERS.items() if k != "increment"}], {"workers": 2})
    with pytest.raises(ValidationError, match="serialised"):  # the ids it may name, listed
        _load([{**WORKERS, "rule": "serialized"}], {"workers": 2})


def test_a_remedy_naming_a_missing_knob_is_refused_at_its_own_line(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "b.yaml",
        "name: b\n"
        "target:\n"
        "  kind: python\n"
        "  factory: m:build\n"
        "  remedies:\n"
        "    - {rule: serialised, knob: workers, increment: 1, why: w}\n"
        "knobs: {threads: 2}\n"
        "workload: {load: {mode: closed, concurrency: 1}}\n",
    )
    with pytest.raises(ConfigError) as refused:
        resolve_baseline(load_experiment(path))
    assert refused.value.message.startswith(f"{path}:6: target.remedies[0].knob:"), refused.value


def test_no_remedies_leave_the_stored_config_as_it_was() -> None:
    plain = PythonTarget.model_validate({"kind": "python", "factory": "m:build"})
    assert "remedies" not in plain.model_dump(mode="json")
    declared = PythonTarget.model_validate(target(WORKERS))
    stored = declared.model_dump(mode="json")
    assert stored["remedies"] == [
        {"rule": "serialised", "knob": "workers", "increment": 1.0, "max": 8.0,
         "why": WORKERS["why"]}
    ]  # fmt: skip
    assert PythonTarget.model_validate(stored).model_dump(mode="json") == stored


def test_a_stored_config_that_no_longer_parses_is_partial_evidence() -> None:
    built = Run().evidence()
    odd = {"target": {"kind": "teleport"}, "knobs": {}, "workload": {"load": {"mode": "x"}}}
    evidence = evidence_of(built.run, odd, stages=built.stages, partial="the run FAILED: x")
    assert evidence.config is None and evidence.kind is None and evidence.mode is None
    assert evidence.partial is not None and evidence.partial.startswith("the run FAILED: x; ")
    assert "its stored config no longer parses (target" in evidence.partial
    d = diagnose(replace(evidence, fastest=built.fastest, windows=built.windows))
    assert d.partial == evidence.partial and d.knobs == {}
    assert all(f.suggestion is None for f in d.findings)
    # A newer field elsewhere (a bundle from another optlab): the kind and the load still read.
    newer = {**Run().config(), "protocol": {"name": "quick", "warp": 9}}
    mostly = evidence_of(built.run, newer, stages=built.stages)
    assert mostly.config is None and mostly.partial is not None and "protocol" in mostly.partial
    assert mostly.kind is not None and mostly.kind.name == "python" and mostly.in_process
    assert mostly.mode is not None and not mostly.open_loop and mostly.clients == 8
