"""The `optlab diagnose --json` document (docs/diagnose-json.md) as pydantic models: it IS the
output (`Diagnosis.to_document()` builds it, `to_json()` dumps it), and the JSON Schema in
docs/schemas/ is generated from it.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from optlab.diagnose.findings import Resource

__all__ = [
    "Bottleneck",
    "DiagnoseDocument",
    "DiagnoseFinding",
    "EvidenceEntry",
    "NotEvaluated",
    "Suggestion",
]


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Bottleneck(_Closed):
    stage: str | None = Field(description="the target's stage; null when no stage is to blame")
    resource: Resource


class EvidenceEntry(_Closed):
    metric: str
    value: float | None = Field(description="what the run measured (null: not finite)")
    threshold: float | None = Field(description="the rule's threshold; null: shown for context")
    op: Literal[">=", "<="] = Field(description="the direction that counts as the symptom")
    unit: str


class Suggestion(_Closed):
    knob: str
    value: Any = Field(description="the knob's new value, as a step file's `change` holds it")
    why: str


class DiagnoseFinding(_Closed):
    rule: str = Field(description="the rule's id (docs/diagnose.md lists the catalogue)")
    title: str
    bottleneck: Bottleneck
    confidence: float = Field(ge=0, le=1)
    summary: str
    evidence: list[EvidenceEntry]
    suggestion: Suggestion | None = Field(
        description="the one knob to change; null where optlab knows no knob for it"
    )
    advice: str | None = Field(description="what to try, in prose")


class NotEvaluated(_Closed):
    rule: str
    missing: str = Field(description="the evidence the run lacks, and how to get it")


class DiagnoseDocument(_Closed):
    """The last stdout line of `optlab diagnose --json`."""

    schema_version: Literal[1]
    run_id: int
    experiment: str
    status: str
    valid: bool | None
    healthy: bool = Field(
        description="true when no rule fired on a valid run whose core rules were all evaluated"
    )
    state: Literal["healthy", "findings", "undecided", "no-data"] = Field(
        description="findings: a rule fired; undecided: none fired but a core rule could not "
        "be evaluated or the run is INVALID; no-data: no request to read (a FAILED, CRASHED or "
        "KILLED run without one, or a RUNNING run whose process is gone)"
    )
    state_reason: str | None = Field(description="why undecided or no-data; null otherwise")
    partial: bool = Field(description="the run's evidence is incomplete (not FINISHED/VALID)")
    partial_reason: str | None
    source: str | None = Field(description="how the run was chosen, when not by its id")
    findings: list[DiagnoseFinding] = Field(description="ranked; the first is the bottleneck")
    not_evaluated: list[NotEvaluated]
