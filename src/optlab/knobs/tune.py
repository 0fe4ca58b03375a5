"""`optlab tune`: adaptive one-factor-at-a-time as a chain of knob sweeps, then a check for
the interactions that one-factor-at-a-time cannot see.

1. Each knob in the order given is swept at the current config (`optlab sweep-knob`), and the
   value it promotes (the winner, or the tie-break's choice where that beats the parent beyond
   noise: `knobs.decision.promotable`) becomes the current config: each step of the chain
   changes one knob, and every step's gain is a measured, paired comparison (Frey, Engelhardt
   & Greitzer, "An evaluation of adaptive one-factor-at-a-time experimentation", Research in
   Engineering Design 14, 2003: under controlled noise aOFAT keeps most of the available
   improvement; its weakness is interactions).
2. The interaction check, while the budget lasts: the first knob is swept again at the final
   config. If a value other than its current one now wins (beats it beyond noise), the first
   knob's optimum moved when the later knobs changed: "order-dependent gain" is flagged and
   that value is promoted too.
3. Then, budget left, a 2x2 of the two knobs that gained most (A: a0 -> a1, B: b0 -> b1): B's
   effect (b1 against b0) is measured at the final config (A = a1) and at the final config with
   A = a0, each as a paired knob sweep; the interaction is the difference of the two log
   effects, with the errors of both (`interaction`, reported whatever it is). "Order-dependent
   gain" is flagged where B's preferred value itself flips: b1 better beyond noise at A = a1,
   b0 better beyond noise at A = a0. A gain that only differs in size between a0 and a1 does
   not move an optimum, and a capacity measured by quick sweeps carries biases of several %
   between configs (benchmarks/README.md), which a size difference cannot be told from: on the
   benchmark's additive surface, flagging any contrast beyond noise flagged 2 of 20 tunes.

The loop is generic over what a config is (an experiment file for the command, a mapping of
knob values for benchmarks/knob_search.py), so the command and the benchmark run one procedure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from optlab.knobs.decision import promotable
from optlab.knobs.spec import value_key
from optlab.metrics.stats import beyond_noise, ratio_interval

__all__ = ["TuneResult", "TuneStep", "interaction_of", "tune"]

C = TypeVar("C")
Z_CONF = 1.959963984540054  # the 2x2 interval: 95%, as the knob sweeps' effects


@dataclass
class TuneStep:
    """One knob sweep of the tune: why it was run, its document, what it promoted."""

    purpose: str  # "ofat", "interaction check", "2x2"
    knob: str
    document: dict[str, Any]
    promoted: Any | None


@dataclass
class TuneResult(Generic[C]):
    final: C
    steps: list[TuneStep] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    interaction: dict[str, Any] | None = None
    measured_s: float = 0.0
    stopped: str | None = None  # why the tune stopped short (the budget, Ctrl-C)


def _effect_log(doc: dict[str, Any], value: Any) -> tuple[float, float] | None:
    """(log effect against the sweep's parent, its standard error) of `value`'s row."""
    row = next((r for r in doc["values"] if value_key(r["value"]) == value_key(value)), None)
    if row is None or row["interval"] is None or row["effect_pct"] is None:
        return None
    low, high = row["interval"]
    if low <= -100 or high <= -100:
        return None
    se = (math.log1p(high / 100) - math.log1p(low / 100)) / (2 * Z_CONF)
    return math.log1p(row["effect_pct"] / 100), se


def interaction_of(
    at_final: dict[str, Any], at_other: dict[str, Any], b0: Any, b1: Any
) -> dict[str, Any] | None:
    """B's effect (b1 against b0) at A = a1 (`at_final`, parent b1) and at A = a0 (`at_other`,
    parent b1): each sweep's parent is b1, so b0's row is the effect of going back to b0; the
    interaction is the difference of the two log effects, in %, with a 95% interval."""
    one = _effect_log(at_final, b0)
    other = _effect_log(at_other, b0)
    if one is None or other is None:
        return None
    # ln(y(a1,b0)/y(a1,b1)) - ln(y(a0,b0)/y(a0,b1)): zero when the knobs' effects multiply.
    diff = one[0] - other[0]
    se = math.hypot(one[1], other[1])
    delta, low, high = ratio_interval(diff, Z_CONF * se)
    return {
        "contrast_pct": delta,
        "interval": [low, high],
        "beyond_noise": bool(beyond_noise(delta, low, high)),
    }


def _preference_flips(at_final: dict[str, Any], at_other: dict[str, Any], b0: Any) -> bool:
    """B's preferred value differs between the two values of A, each beyond noise: going back
    to b0 is worse at the final config and better at the other (the sweeps' parent is b1)."""
    rows = [
        next((r for r in doc["values"] if value_key(r["value"]) == value_key(b0)), None)
        for doc in (at_final, at_other)
    ]
    if rows[0] is None or rows[1] is None:
        return False
    worse_here = rows[0]["significant"] and not rows[0]["better"]
    better_there = rows[1]["significant"] and rows[1]["better"]
    return bool(worse_here and better_there)


def tune(
    start: C,
    knobs: Sequence[tuple[str, Sequence[Any]]],
    *,
    sweep: Callable[[C, str, Sequence[Any], str], dict[str, Any]],
    derive: Callable[[C, str, Any], C],
    value_of: Callable[[C, str], Any],
    budget_s: float | None = None,
) -> TuneResult[C]:
    """Adaptive one-factor-at-a-time from `start` over `knobs` (each with its values), then
    the interaction check and the 2x2 while `budget_s` measured seconds last (see the module
    docstring). `sweep(config, knob, values, purpose)` is a knob sweep's document;
    `derive(config, knob, value)` the config with one knob changed; `value_of(config, knob)`
    a knob's value."""
    result: TuneResult[C] = TuneResult(start)
    current = start
    gains: list[tuple[float, str, Any, Any]] = []  # (log gain, knob, old, new)

    def left() -> bool:
        return budget_s is None or result.measured_s < budget_s

    def run(purpose: str, config: C, knob: str, values: Sequence[Any]) -> TuneStep:
        doc = sweep(config, knob, values, purpose)
        result.measured_s += float(doc.get("measured_s") or 0.0)
        step = TuneStep(purpose, knob, doc, promotable(doc))
        result.steps.append(step)
        return step

    for knob, values in knobs:
        if not left():
            result.stopped = f"the budget ({budget_s:g} s) was spent before {knob} was swept"
            break
        old = value_of(current, knob)
        step = run("ofat", current, knob, values)
        if step.promoted is not None:
            effect = _effect_log(step.document, step.promoted)
            gains.append((effect[0] if effect else 0.0, knob, old, step.promoted))
            current = derive(current, knob, step.promoted)
    first_knob, first_values = knobs[0]
    moved_since = any(g[1] != first_knob for g in gains)
    if len(knobs) > 1 and moved_since and left():
        before = value_of(current, first_knob)
        step = run("interaction check", current, first_knob, first_values)
        if step.promoted is not None:
            result.flags.append(
                f"order-dependent gain: {first_knob}'s best value moved from {before} to "
                f"{step.promoted} once "
                + ", ".join(sorted({g[1] for g in gains if g[1] != first_knob}))
                + " changed"
            )
            current = derive(current, first_knob, step.promoted)
            # The 2x2 compares the values tune ended with: the first knob's gain is now from
            # where it started to where the check moved it.
            gains = [(g[0], g[1], g[2], step.promoted) if g[1] == first_knob else g for g in gains]
    if len(gains) >= 2 and left():
        (_, knob_a, a0, a1), (_, knob_b, b0, b1) = sorted(gains, key=lambda g: -abs(g[0]))[:2]
        if value_key(value_of(current, knob_a)) == value_key(a1) and value_key(
            value_of(current, knob_b)
        ) == value_key(b1):
            at_final = run("2x2", current, knob_b, [b0, b1])
            other = derive(current, knob_a, a0)
            at_other = run("2x2", other, knob_b, [b0, b1]) if left() else None
            if at_other is not None:
                found = interaction_of(at_final.document, at_other.document, b0, b1)
                if found is not None:
                    found |= {"knobs": [knob_a, knob_b], "a": [a0, a1], "b": [b0, b1]}
                    result.interaction = found
                    flip = _preference_flips(at_final.document, at_other.document, b0)
                    found["flips"] = flip
                    if flip:
                        result.flags.append(
                            f"order-dependent gain: {knob_b} prefers {b1} at {knob_a} = {a1} "
                            f"but {b0} at {knob_a} = {a0} (its effect differs by "
                            f"{found['contrast_pct']:+.1f}% [{found['interval'][0]:+.1f}, "
                            f"{found['interval'][1]:+.1f}])"
                        )
    result.final = current
    return result
