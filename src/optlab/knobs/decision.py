"""What a knob sweep's measurements say: each value's effect, the winner or the tie, the
tie-break's pick, the sentence, and which value `--promote` moves: pure functions over the
arms (`metrics.selection`), building docs/sweep-knob-json.md's document."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from optlab.knobs.metric import Metric
from optlab.knobs.spec import value_key
from optlab.metrics.selection import ALPHA, Arm, Selection, effect, select_best

__all__ = ["KNOB_SCHEMA_VERSION", "checked", "decide", "promotable", "sentence", "unjudged"]

KNOB_SCHEMA_VERSION = 1


def checked(document: dict[str, Any]) -> dict[str, Any]:
    """The document as its model (docs/sweep-knob-json.md) says it is: a field the code
    forgot or misnamed fails here, before anything is stored or printed."""
    from optlab.knobs.document import KnobSweepDocument

    return KnobSweepDocument.model_validate(document).model_dump(mode="json")


def _distance(value: Any, parent: Any, asked: Sequence[Any]) -> float:
    """How far a value is from the parent's: on the log scale for positive numbers, else
    the places between them in the list asked for."""
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (value, parent))
    if numbers and value > 0 and parent > 0:
        return float(abs(math.log(value / parent)))
    if numbers:
        return float(abs(value - parent))
    keys = [value_key(v) for v in asked]
    here = keys.index(value_key(value)) if value_key(value) in keys else len(keys)
    there = keys.index(value_key(parent)) if value_key(parent) in keys else -1
    return float(abs(here - there))


def _tie_break(
    tie: Sequence[int],
    values: Sequence[Any],
    asked: Sequence[Any],
    parent: Any,
    rule: str,
    cpu: Sequence[float | None],
) -> tuple[int | None, str]:
    if not tie:
        return None, "no arm has a figure"
    if rule == "best":
        return tie[0], "the best mean of the tie (tie-break best)"
    if 0 in tie:
        return 0, "the parent is in the tie: it stays"
    if rule == "cheapest" and all(cpu[i] is not None for i in tie):
        chosen = min(tie, key=lambda i: cpu[i] or 0.0)
        return chosen, f"cheapest: {cpu[chosen]:.0f}% CPU"
    chosen = min(tie, key=lambda i: (_distance(values[i], parent, asked), i))
    note = "nearest the parent's value"
    if rule == "cheapest":
        note += " (cheapest asked, but a tied arm has no CPU figure)"
    return chosen, note


def _pct(x: float) -> str:
    return f"{x:+.1f}%"


def decide(
    arms: Sequence[Arm],
    *,
    values: Sequence[Any],
    experiments: Sequence[str],
    asked: Sequence[Any],
    parent_value: Any,
    knob: str,
    m: Metric,
    tie_break: str,
    cpu: Sequence[float | None],
    unusable: Sequence[str] = (),
) -> dict[str, Any]:
    """The sweep's answer from its arms (arm 0 the parent): effects, winner, tie, choice;
    `unusable[i]`: why arm i's last cell is not a figure (said for an arm with none)."""
    selection: Selection = select_best(arms, higher_is_better=m.higher_is_better)
    effects = [None] + [effect(arms[0], arm) for arm in arms[1:]]
    by_value = {value_key(v): i for i, v in enumerate(values)}
    rows = []
    for value in asked:
        i = by_value.get(value_key(value), 0)
        logs = [x for x in arms[i].logs if math.isfinite(x)]
        estimate = math.exp(sum(logs) / len(logs)) if logs else None
        e = effects[i]
        row: dict[str, Any] = {
            "value": value,
            "experiment": experiments[i],
            "control": i == 0,
            "estimate": estimate,
            "blocks": len(logs),
            "unusable": None if logs or i >= len(unusable) else unusable[i] or None,
        }
        if i == 0:
            row |= {"effect_pct": 0.0, "interval": [0.0, 0.0], "significant": False}
        elif e is None or not math.isfinite(e.low_pct):
            row |= {
                "effect_pct": None if e is None else e.delta_pct,
                "interval": None,
                "significant": False,
            }
        else:
            row |= {
                "effect_pct": e.delta_pct,
                "interval": [e.low_pct, e.high_pct],
                "significant": e.significant,
            }
        better = row["significant"] and e is not None and (e.delta_pct > 0) == m.higher_is_better
        row["better"] = bool(better)
        rows.append(row)
    chosen, why = _tie_break(selection.tie, values, asked, parent_value, tie_break, cpu)
    winner = selection.winner
    measured = sum(1 for arm in arms for x in arm.logs if math.isfinite(x))
    doc: dict[str, Any] = {
        "schema_version": KNOB_SCHEMA_VERSION,
        "experiment": experiments[0],
        "knob": knob,
        "metric": m.name,
        "higher_is_better": m.higher_is_better,
        "parent_value": parent_value,
        "winner": None if winner is None else values[winner],
        "winner_experiment": None if winner is None else experiments[winner],
        "tie": [values[i] for i in selection.tie] if winner is None else [],
        "chosen": None if chosen is None else values[chosen],
        "chosen_experiment": None if chosen is None else experiments[chosen],
        "tie_break": tie_break,
        "tie_break_note": why if winner is None else None,
        "alpha": ALPHA,
        "values": rows,
        "comparisons": [
            {
                "value": values[t.other],
                "margin_pct": t.margin_pct,
                "blocks": t.blocks,
                "p": t.p,
                "p_holm": t.p_holm,
                "method": t.method,
            }
            for t in selection.tests
        ],
        "best": None if selection.best is None else values[selection.best],
        "unmeasured": [values[i] for i in selection.unmeasured],
        "cells_measured": measured,
    }
    doc["sentence"] = sentence(doc, effects, measured, len(values))
    return doc


def sentence(doc: dict[str, Any], effects: Sequence[Any], measured: int, arms: int) -> str:
    """ "In N measurements across M values of KEY, V is X% [a, b] better than the parent"."""
    knob, label = doc["knob"], doc["metric"]
    head = f"In {measured} measurements across {arms} values of {knob}"
    pick = doc["winner"] if doc["winner"] is not None else doc["chosen"]
    row = next((r for r in doc["values"] if value_key(r["value"]) == value_key(pick)), None)
    if pick is None:
        return f"{head}, nothing was measured to compare"
    if doc["unmeasured"]:
        missing = ", ".join(str(v) for v in doc["unmeasured"])
        head += f" ({missing}: no valid measurement)"
    parent = next((r for r in doc["values"] if r["control"]), None)
    if parent is not None and parent["blocks"] == 0:
        return (
            f"{head}, the parent's {knob} = {doc['parent_value']} has no valid measurement: "
            "no value is compared with it"
        )
    if row is None or row["control"] or not row["better"]:
        tie = ", ".join(str(v) for v in doc["tie"]) or str(pick)
        if doc["winner"] is not None and value_key(doc["winner"]) == value_key(doc["parent_value"]):
            return f"{head}, the parent's {knob} = {doc['parent_value']} is best beyond noise"
        return (
            f"{head}, no value beats the parent ({knob} = {doc['parent_value']}) on "
            f"{label} beyond noise (tied: {tie})"
        )
    low, high = row["interval"]
    better = "better" if doc["higher_is_better"] == (row["effect_pct"] > 0) else "worse"
    size = abs(row["effect_pct"])
    lo, hi = sorted((abs(low), abs(high)))
    verdict = (
        "the winner" if doc["winner"] is not None else f"chosen from the tie ({doc['tie_break']})"
    )
    return (
        f"{head}, {pick} is {size:.1f}% [{lo:.1f}, {hi:.1f}] {better} than the parent on "
        f"{label} ({verdict})"
    )


def unjudged(document: dict[str, Any]) -> list[str]:
    """A line for each value (the parent's too) with no valid measurement in any block: its
    effect is not judged (`optlab sweep-knob` then exits 4, docs/exit-codes.md)."""
    lines = []
    for row in document["values"]:
        if row["blocks"] == 0:
            what = "the parent" if row["control"] else "a value"
            lines.append(
                f"{document['knob']} = {row['value']} ({what}, {row['experiment']}): no valid "
                f"measurement in {document.get('blocks', '?')} blocks, not judged"
                + (f"; the last: {row['unusable']}" if row.get("unusable") else "")
            )
    return lines


def promotable(document: dict[str, Any]) -> Any | None:
    """The value to promote: the winner, or the tie-break's choice where it is better than
    the parent beyond noise; None when the parent stays."""
    pick = document["winner"] if document["winner"] is not None else document["chosen"]
    if pick is None:
        return None
    row = next((r for r in document["values"] if value_key(r["value"]) == value_key(pick)), None)
    if row is None or row["control"] or not row["better"]:
        return None
    return pick
