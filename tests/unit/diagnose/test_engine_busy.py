"""How busy a target's engine was, read from the figures it reports about itself through its
kind (`TargetKind.engine_busy`): the reference classifier's `infer.busy_ms` over `instances`, in
process or served by `optlab serve`; a kind that reports no such figure gives no reading."""

from __future__ import annotations

from typing import Any

import pytest

from optlab.diagnose import readings
from optlab.targets.kinds.builtin import classifier_engine_busy
from tests.support.evidence import Run

FIGURES = {"engine": "torch fp32", "instances": 2, "infer": {"busy_ms": 6000.0, "passes": 10}}


@pytest.mark.parametrize(
    ("kind", "reading"),
    [
        # 6 s busy over 2 instances in a 5 s measured phase: each 60% of the time.
        ("builtin", (0.6, 2)),
        # A service of the classifier (`optlab serve`'s /metrics as metrics_url) reports the same.
        ("http", (0.6, 2)),
        ("command", (0.6, 2)),
        # Kinds that report no engine figures: not read, whatever their metrics() hold.
        ("python", None),
        ("synthetic", None),
    ],
)
def test_the_engine_busy_share_is_its_kinds_reading(
    kind: str, reading: tuple[float, int] | None
) -> None:
    found = readings.busy_engine(Run(kind=kind, target_figures=FIGURES).evidence())
    if reading is None:
        assert found is None
    else:
        assert found == (pytest.approx(reading[0]), reading[1])


@pytest.mark.parametrize(
    ("figures", "read"),
    [
        ({"infer": {"busy_ms": 250}}, (250.0, 1)),  # no instance count: one
        ({"infer": {"busy_ms": 250.5}, "instances": 0}, (250.5, 1)),
        ({"infer": {"busy_ms": 250.5}, "instances": 4}, (250.5, 4)),
        ({"infer": {"passes": 3}, "instances": 4}, None),  # no busy time reported
        ({"infer": "busy"}, None),
        ({"batching": {"mean_batch_size": 2.0}}, None),
        (None, None),
    ],
)
def test_the_classifiers_figures(figures: Any, read: tuple[float, int] | None) -> None:
    assert classifier_engine_busy(figures) == read


def test_a_run_without_figures_has_no_reading() -> None:
    assert readings.busy_engine(Run(kind="builtin").evidence()) is None
