"""Calibration of metrics.stats on real measurements of the synthetic target (~90 s).

20 A/A trials (the same config measured twice) are judged "within noise" or not, and 10 trials of
a 10% slower service time "P50 worse beyond noise" or not. Twenty trials cannot show a 95% rate
to the percent, so the test fails only on counts that a true rate at the goal would give less
than 1% of the time (binomial tails): 5 or more A/A false alarms (P = 0.26% at a 5% false-alarm
rate), or 5 or more missed regressions (P = 0.16% at a 10% miss rate). The rates themselves come
from benchmarks/calibration.py (100 A/A and 50 regression trials).
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
    assert rates.aa_within >= 16, summary
    assert rates.reg_detected >= 6, summary
