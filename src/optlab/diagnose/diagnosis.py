"""Every rule on one run's evidence: the findings ranked, and the JSON scripts parse
(docs/diagnose-json.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from optlab.diagnose.document import (
    Bottleneck,
    DiagnoseDocument,
    DiagnoseFinding,
    EvidenceEntry,
    NotEvaluated,
    Suggestion,
)
from optlab.diagnose.evidence import Evidence, gather
from optlab.diagnose.findings import Fired, Measure, Passed, Unevaluable
from optlab.diagnose.remedies import advice_for, suggest
from optlab.diagnose.rules import RULES, Rule
from optlab.store import Store
from optlab.store.summary import ProfileEvidence
from optlab.targets.remedies import Remedy

__all__ = ["DIAGNOSE_SCHEMA_VERSION", "Diagnosis", "Finding", "diagnose", "diagnose_run"]

DIAGNOSE_SCHEMA_VERSION: Final = 1


@dataclass(frozen=True)
class Finding:
    rule: Rule
    stage: str | None
    confidence: float
    evidence: tuple[Measure, ...]
    summary: str
    suggestion: Remedy | None
    advice: str

    @property
    def resource(self) -> str:
        return self.rule.resource

    @property
    def bottleneck(self) -> str:
        return f"{self.stage} · {self.resource}" if self.stage else self.resource

    def to_document(self) -> DiagnoseFinding:
        return DiagnoseFinding(
            rule=self.rule.id,
            title=self.rule.title,
            bottleneck=Bottleneck(stage=self.stage, resource=self.rule.resource),
            confidence=self.confidence,
            summary=self.summary,
            evidence=[
                EvidenceEntry(
                    metric=m.metric,
                    value=_finite(m.value),
                    threshold=_finite(m.threshold),
                    op=m.op,
                    unit=m.unit,
                )
                for m in self.evidence
            ],
            suggestion=(
                Suggestion(**self.suggestion.to_json()) if self.suggestion is not None else None
            ),
            advice=self.advice or None,
        )

    def to_json(self) -> dict[str, Any]:
        return self.to_document().model_dump(mode="json")


def _finite(value: float | None) -> float | None:
    if value is None or value != value or value in (float("inf"), float("-inf")):
        return None
    return round(float(value), 4)


@dataclass(frozen=True)
class Diagnosis:
    run_id: int
    experiment: str
    status: str
    valid: bool | None
    partial: str | None  # why the evidence is incomplete
    findings: tuple[Finding, ...]
    passed: tuple[tuple[str, tuple[Measure, ...]], ...]  # rule id, what it read
    not_evaluated: tuple[tuple[str, str], ...]  # rule id, what evidence is missing
    source: str | None = None  # e.g. "sweep 3, the level at the knee"
    profile: ProfileEvidence | None = None  # `optlab run --profile`: shown beside the findings
    knobs: dict[str, Any] | None = None  # the run's knobs: a suggestion shown as old -> new
    no_data: str | None = None  # why there is nothing to diagnose
    undecided: tuple[str, ...] = ()  # core rules that could not be evaluated

    @property
    def state(self) -> Literal["healthy", "findings", "undecided", "no-data"]:
        """healthy only when every core rule was evaluated on a valid run with requests and
        none fired; no-data for a run with no request to read; undecided when nothing fired
        but a core rule could not run, or the run is INVALID."""
        if self.no_data is not None:
            return "no-data"
        if self.findings:
            return "findings"
        if self.undecided or self.valid is False:
            return "undecided"
        return "healthy"

    @property
    def state_reason(self) -> str | None:
        state = self.state
        if state == "no-data":
            return self.no_data
        if state != "undecided":
            return None
        parts = []
        if self.undecided:
            missing = dict(self.not_evaluated)
            parts.append(
                "no rule fired, but "
                + "; ".join(
                    f"{r} could not be evaluated ({missing.get(r, '?')})" for r in self.undecided
                )  # fmt: skip
            )
        if self.valid is False:
            parts.append(
                "no rule fired, but the run is INVALID: its figures are not a valid "
                "measurement to call healthy"
            )
        return "; ".join(parts)

    @property
    def healthy(self) -> bool:
        return self.state == "healthy"

    @property
    def top(self) -> Finding | None:
        return self.findings[0] if self.findings else None

    def to_document(self) -> DiagnoseDocument:
        """The `--json` document (docs/diagnose-json.md)."""
        return DiagnoseDocument(
            schema_version=DIAGNOSE_SCHEMA_VERSION,
            run_id=self.run_id,
            experiment=self.experiment,
            status=self.status,
            valid=self.valid,
            healthy=self.healthy,
            state=self.state,
            state_reason=self.state_reason,
            partial=self.partial is not None,
            partial_reason=self.partial,
            source=self.source,
            findings=[f.to_document() for f in self.findings],
            not_evaluated=[NotEvaluated(rule=r, missing=why) for r, why in self.not_evaluated],
        )

    def to_json(self) -> dict[str, Any]:
        return self.to_document().model_dump(mode="json")


def diagnose(
    evidence: Evidence,
    params: Mapping[str, Mapping[str, float]] | None = None,
    source: str | None = None,
) -> Diagnosis:
    """Every rule of the catalogue on `evidence`; `params` overrides thresholds by rule id."""
    findings: list[Finding] = []
    passed: list[tuple[str, tuple[Measure, ...]]] = []
    missing: list[tuple[str, str]] = []
    for rule in RULES:
        outcome = rule.check(evidence, (params or {}).get(rule.id))
        if isinstance(outcome, Fired):
            findings.append(
                Finding(
                    rule=rule,
                    stage=outcome.stage,
                    confidence=outcome.confidence,
                    evidence=outcome.evidence,
                    summary=outcome.summary,
                    suggestion=suggest(rule, outcome, evidence),
                    advice=advice_for(rule, evidence),
                )
            )
        elif isinstance(outcome, Unevaluable):
            missing.append((rule.id, outcome.missing))
        elif isinstance(outcome, Passed) and outcome.applies:
            passed.append((rule.id, outcome.evidence))
    covered = {r for f in findings for r in f.rule.subsumes}
    findings = [f for f in findings if f.rule.id not in covered]
    order = {rule.id: i for i, rule in enumerate(RULES)}
    # Ranked by confidence; a tie goes to the rule listed first (measurement rules lead).
    findings.sort(key=lambda f: (-f.confidence, order[f.rule.id]))
    run = evidence.run
    undecided = tuple(r for r, _ in missing if _rule(r).core)
    if evidence.no_data is not None:
        findings = []  # nothing measured: a rule that fired read no request
    return Diagnosis(
        run_id=run.id,
        experiment=run.experiment,
        status=run.status,
        valid=run.valid,
        partial=evidence.partial,
        findings=tuple(findings),
        passed=tuple(passed),
        not_evaluated=tuple(missing),
        source=source,
        profile=evidence.recorded.profile if evidence.recorded is not None else None,
        knobs=evidence.knobs,
        no_data=evidence.no_data,
        undecided=undecided,
    )


def _rule(rule_id: str) -> Rule:
    return next(r for r in RULES if r.id == rule_id)


def diagnose_run(store: Store, run_id: int, source: str | None = None) -> Diagnosis:
    """Diagnose a stored run (NotFoundError when there is none)."""
    return diagnose(gather(store, run_id), source=source)
