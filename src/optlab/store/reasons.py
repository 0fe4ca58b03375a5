"""Why a run is INVALID: each reason is a code and a text (docs/run-json.md).

The text is what a person reads (`optlab log`, `run --json`, a bundle's `run.reasons`); the
code is what code decides by. Whoever asks "did the load generator fall behind?" or "was the
target saturated?" (the sweep, diagnose) matches codes, never the wording, so a message can
be reworded without changing who is blamed.

The codes are stored beside the texts, in the same order (`runs.reason_codes_json`, a
bundle's optional `run.reason_codes`), so every text output stays as it was. A run stored
before the codes existed got them from its texts once, in migration 0008; a bundle without
them reads every reason as `other`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict

__all__ = [
    "GENERATOR",
    "NODES",
    "NOT_STEADY",
    "REASON_CODES",
    "SATURATION",
    "Reason",
    "ReasonCode",
    "code_of",
    "reasons_of",
]

ReasonCode = Literal[
    "interrupted",  # Ctrl-C (or a signal) ended the measurement
    "stopped-early",  # ended before its time: the target was plainly saturated
    "short",  # measured less than the protocol asked
    "few-queries",  # too few successes for P99 (MLPerf's bound)
    "errors",  # error rate over the protocol's limit
    "saturated",  # open loop: the target could not sustain the offered rate
    "generator-behind",  # open loop: the load generator fell behind its schedule
    "node-behind",  # load from several hosts: a node fell behind its share of the schedule
    "node-lost",  # load from several hosts: a node (or its worker) was lost mid-run
    "clients-held-up",  # closed loop: the clients were held up between calls
    "unstable",  # the halves' QPS differ beyond their noise
    "stuck-clients",  # closed loop: clients still inside a call after the drain
    "throttled",  # a GPU throttled for heat
    "accuracy",  # held-out accuracy lost beyond the SLO's allowance
    "failed",  # the run FAILED
    "other",  # a reason from a bundle that carries no codes
]
REASON_CODES: tuple[ReasonCode, ...] = get_args(ReasonCode)

# The load generator, not the target, set the pace.
GENERATOR: frozenset[ReasonCode] = frozenset(
    {"generator-behind", "clients-held-up", "node-behind", "node-lost"}
)
# A node of a load sent from several hosts did not send its share: whatever the merged
# figures say, the load the target saw was not the load asked for.
NODES: frozenset[ReasonCode] = frozenset({"node-behind", "node-lost"})
# The target could not sustain the offered rate (open loop): judged so, or stopped as plainly so.
SATURATION: tuple[ReasonCode, ...] = ("saturated", "stopped-early")
# The target did not hold a steady state at that load.
NOT_STEADY: frozenset[ReasonCode] = frozenset({*SATURATION, "unstable"})


class Reason(BaseModel):
    """One reason a run is INVALID."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: ReasonCode
    text: str


def code_of(value: str) -> ReasonCode:
    """`value` as a code; `other` when this optlab does not know it."""
    for code in REASON_CODES:
        if code == value:
            return code
    return "other"


def reasons_of(texts: Sequence[str], codes: Sequence[str]) -> tuple[Reason, ...]:
    """The texts with their codes, in order; a text without a code is `other`."""
    return tuple(
        Reason(code=code_of(codes[i]) if i < len(codes) else "other", text=text)
        for i, text in enumerate(texts)
    )
