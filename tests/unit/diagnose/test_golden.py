"""`optlab diagnose`'s outputs byte for byte on constructed evidence: `--json`
(docs/diagnose-json.md), the terminal text and markdown (docs/diagnose.md), and every next step
the reference classifier's knobs give (docs/diagnose.md "From a finding to the next step").
Golden files in tests/golden/."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from optlab.diagnose import Diagnosis, diagnose
from optlab.diagnose.findings import Fired
from optlab.diagnose.remedies import suggest
from optlab.diagnose.rules import RULES
from optlab.reports.diagnose import render_diagnosis, render_diagnosis_markdown, run_line
from optlab.store.summary import BatchingEvidence
from tests.support.evidence import OPEN, Run, reasons
from tests.support.golden import check_golden

RNG = np.random.default_rng(11)
# A 4 ms lock under 8 clients, handed over unfairly: a quarter go straight through.
HELD = np.concatenate([np.full(600, 4.1), 4.1 * RNG.integers(2, 16, 1800)])
CLASSIFIER = {
    "engine": "torch",
    "precision": "fp32",
    "batching": {"mode": "off"},
    "preprocess": "python",
    "cache": {"mode": "off"},
    "threads": 1,
    "instances": 1,
    "device": "cpu",
}


def _cases() -> dict[str, Diagnosis]:
    lag = 60.0
    late = reasons(
        "load generator",
        send_lag_p99_ms=lag,
        total_p99_ms=8.0,
        send_lag_p99_low_ms=lag,
        in_flight_max=3,
        in_flight_limit=1000,
    )
    batching = {"mode": "dynamic", "max_batch_size": 8, "max_wait_ms": 10, "max_queue": 1024}
    return {
        "locked-classifier": diagnose(
            Run(kind="builtin", knobs=CLASSIFIER, stage_ms=HELD, qps=231.0, cpu_pct=7.0).evidence()
        ),
        "late-service": diagnose(
            Run(kind="http", load=OPEN, reasons=late, send_lag_ms=lag).evidence()
        ),
        "under-batched-classifier": diagnose(
            Run(
                kind="builtin",
                knobs={**CLASSIFIER, "batching": batching},
                more_stages={"queue": np.full(2000, 9.0)},
                recorded={
                    "batching": BatchingEvidence(
                        mean_batch=1.5,
                        max_batch=8,
                        fill_ratio=0.1875,
                        wait_ms_mean=9.0,
                        wait_ms_p99=9.5,
                    )
                },
            ).evidence()
        ),
        "no-series": diagnose(Run(load=OPEN, send_lag_ms=None, start_lag_ms=None).evidence()),
    }


def test_the_json_the_text_and_the_markdown_are_unchanged() -> None:
    cases = _cases()
    document = {name: d.to_json() for name, d in cases.items()}
    check_golden("diagnose.json", json.dumps(document, indent=2, allow_nan=False) + "\n")
    text = "".join(
        f"== {name}\n{render_diagnosis(d, d.knobs)}\n-- markdown\n"
        f"{render_diagnosis_markdown(d, d.knobs)}\n-- run line\n{run_line(d, d.knobs)}\n"
        for name, d in cases.items()
    )
    check_golden("diagnose.txt", text)


KNOB_CASES: dict[str, dict[str, Any]] = {
    "defaults": CLASSIFIER,
    "numpy": {**CLASSIFIER, "preprocess": "numpy"},
    "pooled-cuda": {**CLASSIFIER, "preprocess": "numpy-pooled", "device": "cuda"},
    "torch-cuda": {**CLASSIFIER, "preprocess": "torch", "device": "cuda"},
    "fp16-cuda": {**CLASSIFIER, "device": "cuda", "precision": "fp16"},
    "tensorrt-cuda": {**CLASSIFIER, "device": "cuda", "precision": "fp16", "engine": "tensorrt"},
    "onnx": {**CLASSIFIER, "engine": "onnxruntime"},
    "onnx-int8": {**CLASSIFIER, "engine": "onnxruntime", "precision": "int8"},
    "onnx-int8-2-threads": {
        **CLASSIFIER,
        "engine": "onnxruntime",
        "precision": "int8",
        "threads": 2,
    },
    "batching": {
        **CLASSIFIER,
        "batching": {"mode": "dynamic", "max_batch_size": 8, "max_wait_ms": 10, "max_queue": 1024},
        "instances": 2,
    },
    "short-wait": {**CLASSIFIER, "batching": {"mode": "dynamic", "max_wait_ms": 0.5}},
    "empty": {},
}


def test_every_next_step_of_the_classifier_is_unchanged() -> None:
    lines = []
    for label, knobs in KNOB_CASES.items():
        for skew in (None, 1.1):
            inputs = {"repeat_skew": skew} if skew else {}
            evidence = Run(kind="builtin", knobs=knobs, inputs=inputs).evidence()
            for rule in RULES:
                for stage in (None, "preprocess", "infer", "queue"):
                    fired = Fired(stage, 0.9, (), "")
                    found = suggest(rule, fired, evidence)
                    if found is not None:
                        said = json.dumps(found.to_json(), sort_keys=True)
                        lines.append(f"{label} skew={skew} {rule.id} {stage}: {said}\n")
    # Other kinds have no knob model optlab knows: no step unless they declare one.
    for kind in ("python", "http", "command", "synthetic"):
        evidence = Run(kind=kind, knobs=CLASSIFIER).evidence()
        for rule in RULES:
            assert suggest(rule, Fired("infer", 0.9, (), ""), evidence) is None, (kind, rule.id)
    check_golden("diagnose-steps.txt", "".join(lines))
