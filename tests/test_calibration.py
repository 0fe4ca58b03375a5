"""Calibration of metrics.stats on real measurements of the synthetic target (~90 s).

20 A/A trials (the same config measured twice) must come out "within noise" at least 19 times,
and 10 trials of a 10% slower service time must show P50 worse beyond noise at least 9 times.
benchmarks/calibration.py runs the same trials at a larger scale and prints the rates.
"""

from __future__ import annotations

import pytest
from benchmarks.calibration import CONFIDENCE, MIN_EFFECT_PCT, rates_of, run_trials


@pytest.mark.slow
def test_aa_within_noise_and_a_10pct_slower_service_detected() -> None:
    trials = run_trials(20, 10, duration_s=1.5, window_s=0.1, seed=12345)
    rates = rates_of(trials, confidence=CONFIDENCE, min_effect_pct=MIN_EFFECT_PCT)
    summary = f"A/A {rates.aa_within}/20 within noise, {rates.reg_detected}/10 detected"
    assert rates.aa_trials == 20 and rates.reg_trials == 10
    assert rates.aa_within >= 19, summary
    assert rates.reg_detected >= 9, summary
