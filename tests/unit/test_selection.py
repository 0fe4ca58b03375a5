"""The knob sweep's statistics (optlab.metrics.selection) against scipy and brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from optlab.metrics.selection import Arm, effect, holm, select_best


def _arm(logs: list[float], se: float = math.nan, df: float = math.nan) -> Arm:
    return Arm(logs, [se] * len(logs), [df] * len(logs))


def test_holm_matches_the_step_down_definition() -> None:
    rng = np.random.default_rng(3)
    for _ in range(200):
        p = list(rng.uniform(0, 0.2, rng.integers(1, 7)))
        m = len(p)
        order = np.argsort(p)
        expected = np.empty(m)
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (m - rank) * p[i]))
            expected[i] = running
        got = holm(p)
        assert np.allclose(got, expected)
        # Holm rejects at alpha exactly where the step-down procedure does.
        alpha = 0.05
        rejected = set()
        for rank, i in enumerate(order):
            if p[i] <= alpha / (m - rank):
                rejected.add(i)
            else:
                break
        assert {i for i, q in enumerate(got) if q <= alpha} == rejected


def test_pair_p_value_is_scipys_paired_t_two_sided() -> None:
    rng = np.random.default_rng(7)
    best = rng.normal(0.10, 0.02, 5)
    other = rng.normal(0.0, 0.02, 5)
    sel = select_best([_arm(list(other)), _arm(list(best))], higher_is_better=True)
    assert sel.best == 1
    test = sel.tests[0]
    expected = stats.ttest_rel(best, other, alternative="two-sided").pvalue
    assert test.p == pytest.approx(expected, rel=1e-9)
    assert test.margin_pct == pytest.approx(math.expm1(float(np.mean(best - other))) * 100)


def test_a_clear_winner_is_named_and_a_close_pair_is_a_tie() -> None:
    rng = np.random.default_rng(11)
    noise = lambda: list(rng.normal(0, 0.01, 4))  # noqa: E731
    base = noise()
    clear = [x + 0.10 for x in noise()]
    sel = select_best([_arm(base), _arm(clear), _arm(noise())], higher_is_better=True)
    assert sel.winner == 1 and sel.tie == (1,)
    close = [x + 0.002 for x in clear]
    sel = select_best([_arm(base), _arm(clear), _arm(close)], higher_is_better=True)
    assert sel.winner is None
    assert set(sel.tie) == {1, 2}


def test_lower_is_better_picks_the_smallest() -> None:
    arms = [_arm([math.log(10)] * 3, 0.01, 50), _arm([math.log(7)] * 3, 0.01, 50)]
    sel = select_best(arms, higher_is_better=False)
    assert sel.best == 1 and sel.winner == 1


def test_within_run_error_keeps_one_block_honest() -> None:
    # One block: no between-block spread; the runs' own errors decide.
    noisy = select_best([_arm([0.0], 0.05, 30), _arm([0.03], 0.05, 30)], higher_is_better=True)
    assert noisy.winner is None
    sure = select_best([_arm([0.0], 0.002, 30), _arm([0.03], 0.002, 30)], higher_is_better=True)
    assert sure.winner == 1
    # No error at all: never a winner.
    blind = select_best([_arm([0.0]), _arm([0.5])], higher_is_better=True)
    assert blind.winner is None


def test_missing_blocks_are_left_out_and_an_unmeasured_arm_is_apart() -> None:
    nan = math.nan
    arms = [
        _arm([0.0, 0.01, nan, -0.01], 0.005, 20),
        _arm([0.2, 0.21, 0.19, nan], 0.005, 20),
        _arm([nan, nan, nan, nan]),
    ]
    sel = select_best(arms, higher_is_better=True)
    assert sel.best == 1
    assert sel.tests[0].blocks == 2  # blocks 0 and 1 have both
    # Arm 2 was never measured: it is reported apart, and 1 beats the parent.
    assert sel.unmeasured == (2,) and 2 not in sel.tie
    assert sel.winner == 1


def test_false_winners_stay_under_alpha_for_equal_arms() -> None:
    """A/A by simulation: six equal arms, four blocks, paired noise: the rate of naming a
    winner is at most alpha (5%) plus the simulation's own error."""
    rng = np.random.default_rng(2024)
    wins = 0
    trials = 1500
    for _ in range(trials):
        drift = rng.normal(0, 0.05, 4)  # shared by a block's arms: must cancel
        arms = [_arm(list(drift + rng.normal(0, 0.02, 4)), 0.015, 20) for _ in range(6)]
        wins += select_best(arms, higher_is_better=True).winner is not None
    assert wins / trials <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / trials)


def test_effect_interval_is_the_paired_t_interval_on_logs() -> None:
    rng = np.random.default_rng(5)
    control = rng.normal(0, 0.03, 6)
    arm = control + 0.08 + rng.normal(0, 0.01, 6)
    e = effect(_arm(list(control)), _arm(list(arm)), confidence=0.95)
    assert e is not None
    d = arm - control
    half = stats.t.ppf(0.975, 5) * d.std(ddof=1) / math.sqrt(6)
    assert e.delta_pct == pytest.approx(math.expm1(d.mean()) * 100)
    assert e.low_pct == pytest.approx(math.expm1(d.mean() - half) * 100)
    assert e.high_pct == pytest.approx(math.expm1(d.mean() + half) * 100)
    assert e.significant


def test_an_error_the_blocks_share_is_not_divided_down_by_them() -> None:
    # Four blocks, each arm's error 3% a block, the arms 6% apart with no spread between
    # blocks: averaged out, 6% is sure; an error every block repeats (a capacity sweep's
    # resolution) leaves it a tie.
    logs_a, logs_b = [0.0] * 4, [0.06] * 4
    shared = [Arm(logs_a, [0.03] * 4, [1e6] * 4, averages_out=False),
              Arm(logs_b, [0.03] * 4, [1e6] * 4, averages_out=False)]
    own = [Arm(logs_a, [0.03] * 4, [1e6] * 4), Arm(logs_b, [0.03] * 4, [1e6] * 4)]
    assert select_best(own, higher_is_better=True).winner == 1
    assert select_best(shared, higher_is_better=True).winner is None
    test = select_best(shared, higher_is_better=True).tests[0]
    assert test.se == pytest.approx(math.hypot(0.03, 0.03))
