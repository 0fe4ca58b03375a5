"""The reference classifier's shipped weights, run for real: they reach the accuracy bar."""

from __future__ import annotations

from optlab.reference.classifier import accuracy


def test_shipped_weights_reach_the_accuracy_bar() -> None:
    report = accuracy.evaluate(
        accuracy.reference_predict, count=200, reference=accuracy.reference_predict
    )
    assert report.n == 200
    assert report.top1 >= 0.95
    assert report.agreement == 1.0
