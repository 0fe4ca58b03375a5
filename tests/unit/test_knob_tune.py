"""The knob sweep's decision (`knobs.search.decide`) and the tune's procedure (`knobs.tune`) on
fake measurements: pure, exact truths."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pytest

from optlab.knobs.decision import promotable, unjudged
from optlab.knobs.spec import sibling_name, value_key
from optlab.knobs.tune import interaction_of, tune
from tests.support.knobs import knob_doc


def test_a_clear_winner_is_named_with_its_sentence() -> None:
    doc = knob_doc({1: 100.0, 2: 150.0, 4: 120.0}, parent=1)
    assert doc["winner"] == 2 and doc["tie"] == []
    row = next(r for r in doc["values"] if r["value"] == 2)
    assert row["interval"][0] < 50.0 < row["interval"][1] and row["better"]
    assert doc["sentence"].startswith("In 12 measurements across 3 values of k, 2 is 50.")
    assert promotable(doc) == 2


def test_a_value_without_a_valid_cell_is_apart_and_said_with_why() -> None:
    doc = knob_doc({1: 100.0, 2: 150.0, 4: None}, parent=1)
    assert doc["winner"] == 2 and doc["unmeasured"] == [4]
    rows = {r["value"]: r for r in doc["values"]}
    assert rows[4]["blocks"] == 0 and rows[4]["unusable"] == "run 2 INVALID: too short"
    assert rows[2]["unusable"] is None and rows[1]["unusable"] is None
    assert "(4: no valid measurement), 2 is 50." in doc["sentence"]
    assert unjudged(doc) == [
        "k = 4 (a value, e4): no valid measurement in 4 blocks, not judged; the last: "
        "run 2 INVALID: too short"
    ]
    assert unjudged(knob_doc({1: 100.0, 2: 150.0}, parent=1)) == []


def test_a_parent_without_a_valid_cell_is_compared_with_nothing() -> None:
    doc = knob_doc({1: None, 2: 150.0, 4: 120.0}, parent=1)
    # 2 beats 4 beyond noise, but nothing says it beats the parent: nothing to promote.
    assert doc["winner"] == 2 and promotable(doc) is None
    assert "the parent's k = 1 has no valid measurement: no value is compared" in doc["sentence"]
    assert [line.split(":")[0] for line in unjudged(doc)] == ["k = 1 (the parent, e1)"]


def test_lower_is_better_for_latency() -> None:
    doc = knob_doc({1: 10.0, 2: 7.0, 4: 12.0}, parent=1, metric="p99")
    assert doc["winner"] == 2
    assert "better than the parent on p99" in doc["sentence"]


def test_no_value_beats_the_parent_so_it_stays() -> None:
    doc = knob_doc({1: 100.0, 2: 100.0, 4: 100.0}, parent=1, noise=0.02)
    assert doc["winner"] is None and doc["chosen"] == 1
    assert "no value beats the parent" in doc["sentence"]
    assert promotable(doc) is None


def test_the_tie_break_picks_the_nearest_or_the_cheapest() -> None:
    # 8 and 16 tie, both far better than the parent 1.
    truths = {1: 100.0, 8: 200.0, 16: 200.5}
    nearest = knob_doc(truths, parent=1)
    assert nearest["winner"] is None and set(nearest["tie"]) == {8, 16}
    assert nearest["chosen"] == 8  # nearer 1 on the log scale
    assert promotable(nearest) == 8  # beats the parent beyond noise: promoted
    cheapest = knob_doc(truths, parent=1, tie_break="cheapest", cpu=[50.0, 90.0, 60.0])
    assert cheapest["chosen"] == 16 and "cheapest" in cheapest["tie_break_note"]
    # A tied arm without a CPU figure: nearest, and said so.
    fallback = knob_doc(truths, parent=1, tie_break="cheapest", cpu=[50.0, None, 60.0])
    assert fallback["chosen"] == 8 and "no CPU figure" in fallback["tie_break_note"]


def test_string_values_are_near_by_their_place_in_the_list() -> None:
    doc = knob_doc({"a": 100.0, "b": 150.0, "c": 150.2, "d": 150.1}, parent="a")
    assert doc["winner"] is None and doc["chosen"] == "b"


# -- tune ---------------------------------------------------------------------------------


def _surface(interaction: bool):  # type: ignore[no-untyped-def]
    """Capacity of (batch, servers): the best batch is 8 at any server count, or, with the
    interaction, 8 at 1 server and 4 at 4."""

    def capacity(c: dict[str, Any]) -> float:
        b, s = c["batch"], c["servers"]
        best = 8 if not interaction or s == 1 else 4
        return s * 100.0 * math.exp(-((math.log2(b) - math.log2(best)) ** 2) / 4)

    return capacity


def _run_tune(interaction: bool, seed: int = 0):  # type: ignore[no-untyped-def]
    capacity = _surface(interaction)
    calls = []

    def sweep(
        config: dict[str, Any], knob: str, values: Sequence[Any], purpose: str
    ) -> dict[str, Any]:
        calls.append((purpose, knob, dict(config)))
        truths = {v: capacity({**config, knob: v}) for v in values}
        truths.setdefault(config[knob], capacity(config))
        return knob_doc(truths, parent=config[knob], seed=seed + len(calls))

    result = tune(
        {"batch": 1, "servers": 1},
        [("batch", (1, 2, 4, 8, 16)), ("servers", (1, 2, 4))],
        sweep=sweep,
        derive=lambda c, k, v: {**c, k: v},
        value_of=lambda c, k: c[k],
    )
    return result, calls


def test_tune_finds_the_optimum_and_flags_the_planted_interaction() -> None:
    result, calls = _run_tune(interaction=True)
    assert result.final == {"batch": 4, "servers": 4}
    assert any(
        f.startswith("order-dependent gain: batch's best value moved from 8 to 4")
        for f in result.flags
    )
    assert [c[0] for c in calls][:3] == ["ofat", "ofat", "interaction check"]
    assert result.interaction is not None and result.interaction["beyond_noise"]


def test_tune_flags_nothing_on_an_additive_surface() -> None:
    result, calls = _run_tune(interaction=False)
    assert result.final == {"batch": 8, "servers": 4}
    assert result.flags == []
    assert result.interaction is not None
    assert abs(result.interaction["contrast_pct"]) < 5 and not result.interaction["beyond_noise"]
    assert "2x2" in [c[0] for c in calls]


def test_the_budget_stops_the_tune_and_says_so() -> None:
    capacity = _surface(False)

    def sweep(
        config: dict[str, Any], knob: str, values: Sequence[Any], purpose: str
    ) -> dict[str, Any]:
        truths = {v: capacity({**config, knob: v}) for v in values}
        return knob_doc(truths, parent=config[knob])

    result = tune(
        {"batch": 1, "servers": 1},
        [("batch", (1, 8)), ("servers", (1, 4))],
        sweep=sweep,
        derive=lambda c, k, v: {**c, k: v},
        value_of=lambda c, k: c[k],
        budget_s=1.0,
    )
    assert len(result.steps) == 1 and result.stopped is not None and "servers" in result.stopped


def test_interaction_contrast_is_the_difference_of_log_effects() -> None:
    at_final = knob_doc({4: 100.0, 8: 80.0}, parent=4, noise=0.001)
    at_other = knob_doc({4: 50.0, 8: 50.0}, parent=4, noise=0.001)
    found = interaction_of(at_final, at_other, b0=8, b1=4)
    assert found is not None
    assert found["contrast_pct"] == pytest.approx((0.8 / 1.0 - 1) * 100, abs=0.5)
    assert found["beyond_noise"]


def test_only_a_flipped_preference_is_order_dependent() -> None:
    from optlab.knobs.tune import _preference_flips

    # The sweeps' parent is b1 = 4; b0 = 8 is worse at the final config.
    at_final = knob_doc({4: 100.0, 8: 80.0}, parent=4, noise=0.001)
    flips = knob_doc({4: 50.0, 8: 60.0}, parent=4, noise=0.001)  # 8 better at a0: flipped
    smaller = knob_doc({4: 50.0, 8: 45.0}, parent=4, noise=0.001)  # 8 worse there too
    assert _preference_flips(at_final, flips, b0=8)
    assert not _preference_flips(at_final, smaller, b0=8)
    found = interaction_of(at_final, smaller, b0=8, b1=4)
    assert found is not None and found["beyond_noise"]  # a real size difference, not a flip


def test_a_value_and_its_float_form_are_one_sibling() -> None:
    """tune's 2x2 asks for the parent's value as stored (2.0) where the user typed 2: one
    value, so one sibling file and one experiment name, not two copies of one config."""
    assert value_key(2) == value_key(2.0)
    assert sibling_name("syn", ["service_ms"], 2.0) == sibling_name("syn", ["service_ms"], 2)
    assert sibling_name("syn", ["service_ms"], 2.0) == "syn.service_ms-2"
    assert sibling_name("syn", ["service_ms"], 2.5) == "syn.service_ms-2.5"
    assert sibling_name("syn", ["flag"], True) != sibling_name("syn", ["flag"], 1)
