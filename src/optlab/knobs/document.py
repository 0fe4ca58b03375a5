"""The `optlab sweep-knob --json` and `optlab tune --json` documents as pydantic models
(docs/sweep-knob-json.md).

`knobs.decision.decide` and `knobs.tune_run.tune_document` build the documents; each is
validated against these models before it is stored or printed, the JSON Schemas in
docs/schemas/ are generated from them, and the tests check real output against those.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["KnobComparison", "KnobSweepDocument", "KnobValue", "TuneDocument", "TuneStepEntry"]

Value = Any  # a knob's value as the experiment file holds it (number, string, bool, mapping)
Status = Literal["RUNNING", "FINISHED", "FAILED", "KILLED", "CRASHED"]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KnobValue(_Closed):
    """One value asked for: its experiment, its figure and its paired change against the
    parent with the interval."""

    value: Value
    experiment: str = Field(description="the sibling step (the parent's own name for its value)")
    control: bool = Field(description="this value is the parent's: the control arm")
    estimate: float | None = Field(description="geometric mean of its blocks' figures")
    blocks: int = Field(ge=0, description="blocks with a valid measurement of it")
    effect_pct: float | None = Field(description="% change against the parent (0 for the parent)")
    interval: tuple[float, float] | None = Field(
        description="95% interval of effect_pct; null without blocks or windows to say"
    )
    significant: bool = Field(description="beyond noise: the interval excludes 0, >= 1%")
    better: bool = Field(description="significant, and in the metric's better direction")
    unusable: str | None = Field(
        default=None,
        description="with no valid measurement (blocks 0): why, from its last cell "
        "('run 8 INVALID: ...'); null otherwise",
    )


class KnobComparison(_Closed):
    """The best value against another (multiple comparisons with the best)."""

    value: Value
    margin_pct: float = Field(description="how much better the best is, %")
    blocks: int = Field(ge=1)
    p: float = Field(ge=0, le=1, description="two-sided p of the paired difference")
    p_holm: float = Field(ge=0, le=1, description="Holm-adjusted over the comparisons")
    method: str


class KnobSweepDocument(_Closed):
    """`optlab sweep-knob --json`'s last line (docs/sweep-knob-json.md)."""

    schema_version: Literal[1]
    experiment: str = Field(description="the parent: the control arm, measured in every block")
    knob: str
    metric: Literal[
        "qps", "p50", "p99", "ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99", "tok_s", "capacity"
    ]
    higher_is_better: bool
    parent_value: Value
    winner: Value | None = Field(
        description="named only when it beats every other value beyond noise; null otherwise"
    )
    winner_experiment: str | None
    tie: list[Value] = Field(description="without a winner: the values not told apart")
    chosen: Value | None = Field(description="the winner, or the tie-break's pick from the tie")
    chosen_experiment: str | None
    tie_break: Literal["nearest", "cheapest", "best"]
    tie_break_note: str | None
    alpha: float
    values: list[KnobValue]
    comparisons: list[KnobComparison]
    best: Value | None = Field(description="the value with the best mean, beyond noise or not")
    unmeasured: list[Value] = Field(description="values with no valid measurement at all")
    cells_measured: int = Field(ge=0)
    sentence: str
    knob_sweep_id: int
    status: Status
    blocks: int = Field(ge=1)
    measured_s: float = Field(ge=0)
    promoted: str | None = Field(description="the step file --promote wrote")
    promoted_experiment: str | None


class TuneStepEntry(_Closed):
    purpose: Literal["ofat", "interaction check", "2x2"]
    knob: str
    knob_sweep_id: int | None
    winner: Value | None
    tie: list[Value]
    promoted: Value | None = Field(description="the value this sweep moved the config to")
    sentence: str


class TuneDocument(_Closed):
    """`optlab tune --json`'s last line (docs/sweep-knob-json.md)."""

    schema_version: Literal[1]
    experiment: str
    final: str = Field(description="the experiment file of the tuned config")
    steps: list[TuneStepEntry]
    flags: list[str] = Field(description='"order-dependent gain: ..." (the re-sweep, the 2x2)')
    interaction: dict[str, Any] | None = Field(
        description="the 2x2 of the two biggest gains: contrast_pct, interval, beyond_noise, "
        "flips (B's preferred value differs between A's two values: flagged)"
    )
    measured_s: float = Field(ge=0)
    stopped: str | None
