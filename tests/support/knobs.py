"""Knob-sweep documents from exact truths: what the decision says of arms measured with a
known noise (tests of the decision, the tune and the renderers)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from optlab.knobs.decision import decide
from optlab.knobs.document import KnobSweepDocument
from optlab.knobs.metric import METRICS
from optlab.metrics.selection import Arm

BLOCKS = 4


def knob_doc(
    truths: dict[Any, float | None],
    parent: Any,
    *,
    noise: float = 0.01,
    seed: int = 0,
    tie_break: str = "nearest",
    cpu: Sequence[float | None] | None = None,
    metric: str = "qps",
) -> dict[str, Any]:
    """A sweep document from exact truths measured with `noise` (log-sd) per cell, the
    parent first as the search puts it; a truth of None: no cell of that value was valid."""
    rng = np.random.default_rng(seed)
    values = [parent, *[v for v in truths if v != parent]]
    arms = []
    for v in values:
        truth = truths[v]
        logs = list(
            [math.nan] * BLOCKS if truth is None else math.log(truth) + rng.normal(0, noise, BLOCKS)
        )
        arms.append(Arm(logs, [noise] * BLOCKS, [30.0] * BLOCKS))
    doc = decide(
        arms,
        values=values,
        experiments=[f"e{v}" for v in values],
        asked=list(truths),
        parent_value=parent,
        knob="k",
        m=METRICS[metric],
        tie_break=tie_break,
        cpu=list(cpu) if cpu is not None else [None] * len(values),
        unusable=[f"run {i} INVALID: too short" for i in range(len(values))],
    )
    doc |= {
        "knob_sweep_id": 1,
        "status": "FINISHED",
        "blocks": BLOCKS,
        "measured_s": float(len(values) * BLOCKS),
        "promoted": None,
        "promoted_experiment": None,
    }
    KnobSweepDocument.model_validate(doc)  # the documented shape, whatever the case
    return doc
