"""Remedies a python, http or command target declares in its experiment file (`target.remedies`,
docs/experiment-files.md "Remedies"): which knob `optlab diagnose` changes, and how, when one of
its rules fires. optlab knows the reference classifier's knobs; a target of the user's own
says what its knobs mean here.

Checked when the file loads: a rule id that exists (`RuleId`, the ids of
`optlab.diagnose.rules.RULES`), exactly one of `set`, `increment`, `multiply`, and (by the target's
kind, `optlab.targets.kind.TargetKind.check_knobs`) a knob the config has.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from optlab.config.knobs import StrictModel

__all__ = ["OPS", "RULE_IDS", "DeclaredRemedy", "RuleId"]

# The diagnosis rules' ids (docs/diagnose.md "Rules"); tests/unit/diagnose keeps them equal.
RuleId = Literal[
    "load-generator",
    "noisy-neighbour",
    "errors",
    "saturated",
    "gc-churn",
    "memory-leak",
    "io-wait",
    "gpu-compute-bound",
    "gpu-starved",
    "gpu-throttled",
    "cpu-bound",
    "gil-bound",
    "serialised",
    "queueing",
    "under-batching",
    "tail-stalls",
    "network",
    "llm-client-bound",
    "llm-queue-bound",
    "llm-prefill-bound",
    "llm-decode-bound",
    "llm-kv-cache-bound",
]
RULE_IDS: tuple[str, ...] = get_args(RuleId)
OPS = ("set", "increment", "multiply")


class DeclaredRemedy(StrictModel):
    """When rule `rule` fires (on `stage`, if given), change `knob`: to `set`, or by
    `increment` or `multiply` up to `max`; `why` is the reason shown with the step."""

    rule: RuleId
    stage: str | None = Field(None, description="only when the finding blames this stage")
    knob: str = Field(min_length=1, description="a top-level knob of the config")
    set: Any = Field(None, description="the knob's new value")
    increment: float | None = Field(None, description="added to a numeric knob")
    multiply: float | None = Field(None, gt=0, description="a numeric knob times this")
    max: float | None = Field(None, description="increment and multiply stop at this bound")
    why: str = Field(min_length=1, description="why the change answers the finding")

    @model_validator(mode="after")
    def _one_op(self) -> DeclaredRemedy:
        given = [op for op in OPS if op in self.model_fields_set]
        if len(given) != 1:
            named = ", ".join(given) or "none"
            raise ValueError(f"give exactly one of set, increment, multiply (given: {named})")
        if self.max is not None and "set" in given:
            raise ValueError("max bounds increment and multiply, not set")
        return self

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # The one op given, and stage and max only when set: the stored form reads back as the
        # same remedy (a `set: null` written out would be a second op).
        data: dict[str, Any] = handler(self)
        for op in OPS:
            if op not in self.model_fields_set:
                data.pop(op, None)
        for name in ("stage", "max"):
            if data.get(name) is None:
                data.pop(name, None)
        return data
