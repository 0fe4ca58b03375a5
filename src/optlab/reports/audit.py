"""`optlab audit`: which change paid off, by how much, with what confidence, measured by whom,
when, from which commit, on what environment; which runs were INVALID or PROVISIONAL; which
steps could not be stacked (environment drift, another protocol)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from optlab.metrics.stats import MIN_EFFECT_PCT, beyond_noise
from optlab.reports.capacity import most_headroom
from optlab.reports.export import plain
from optlab.reports.format import (
    bound,
    capacity_value,
    cumulative_delta,
    percent,
    step_delta,
)

if TYPE_CHECKING:
    from optlab.reports.stacked import CapacitySlo, StackedTable, TableRow
    from optlab.store import Store


@dataclass
class AuditStep:
    experiment: str
    change: str | None
    hypothesis: str | None
    verdict: str | None
    outcome: str
    qps_share_pct: float | None  # this step's share of the chain's total QPS gain
    qps_share_low_pct: float | None
    qps_share_high_pct: float | None
    p99_share_pct: float | None
    who: str | None
    when: str | None
    commit: str | None
    flags: list[str] = field(default_factory=list)
    missing: str | None = None
    decided_by: list[str] = field(default_factory=list)  # the metrics that decided the verdict
    # The level of its change's interval (pairs or repeats have their own: `metrics.stats`).
    confidence: float | None = None
    # Capacity under the table's SLO (a swept chain): requests/s, and what this step bought.
    capacity_qps: float | None = None
    capacity_interval: list[float] | None = None
    capacity_step_pct: float | None = None
    capacity_step_interval: list[float] | None = None
    capacity_significant: bool | None = None  # its Δ step beyond noise
    capacity_verdict: str | None = None  # capacity's own verdict: gain, within noise, regressed
    capacity_text: str | None = None  # `912.0 [880.1, 940.2]/s, Δ step +95% [+80,+110] ...`
    capacity_reason: str | None = None


@dataclass
class Audit:
    head: str
    protocol: str
    environment: str
    total_qps_pct: float | None
    total_p99_pct: float | None
    steps: list[AuditStep]
    questionable_runs: list[str]  # INVALID or PROVISIONAL runs of the chain's experiments
    confidence: float | None = None
    # The totals' intervals (baseline -> head), and why shares of a total were left out.
    total_qps_interval: list[float] | None = None
    total_p99_interval: list[float] | None = None
    notes: list[str] = field(default_factory=list)
    # Capacity (a swept chain only): the SLO, the head's change against the baseline, and the
    # step whose own capacity gain was the largest.
    capacity_slo: str | None = None
    capacity_loop: str | None = None  # "open" or "closed": the sweeps' loop
    total_capacity_pct: float | None = None
    total_capacity_interval: list[float] | None = None
    total_capacity_significant: bool | None = None
    most_headroom: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _num(value: Any) -> float | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def _share(part: float | None, total: float | None) -> float | None:
    if part is None or total is None or total == 0:
        return None
    return part / total * 100.0


# A total smaller than this is never shared out: the table never calls a change under 1%
# significant, and a share of next to nothing reads as 600% and -500%.
SHARE_MIN_TOTAL_PCT = MIN_EFFECT_PCT


def _interval(row: TableRow, metric: str) -> list[float] | None:
    low = _num(row.get(f"{metric}_cumulative_low_pct"))
    high = _num(row.get(f"{metric}_cumulative_high_pct"))
    return None if low is None or high is None else [low, high]


def _noise_note(label: str, total: float | None, interval: list[float] | None) -> str | None:
    """Why the chain's total of a metric is not shared out among its steps, or None when it
    is beyond noise: its interval lies on one side of zero and it is at least 1%."""
    if total is None:
        return None
    within = percent(total, missing="-")
    if interval is not None:
        within += f" [{bound(interval[0], 1)}, {bound(interval[1], 1)}]"
    if interval is not None and interval[0] <= 0.0 <= interval[1]:
        why = "its interval spans zero"
    elif abs(total) < SHARE_MIN_TOTAL_PCT:
        why = f"under {SHARE_MIN_TOTAL_PCT:g}%"
    elif interval is not None and not beyond_noise(total, interval[0], interval[1]):
        why = "not beyond noise"
    else:
        return None
    return (
        f"the chain's total {label} change {within} is within noise ({why}): no step's share "
        f"of it is given; each step's own change is in its outcome"
    )


def build_audit(store: Store, table: StackedTable) -> Audit:
    rows = list(table.rows)
    header = table.header
    measured = [r for r in rows if _num(r.get("qps")) is not None]
    last = measured[-1] if measured else None
    total_qps, total_p99 = _chain_totals(measured)
    last_qps, qps_interval = _cumulative(last, "qps")
    last_p99, p99_interval = _cumulative(last, "p99")
    qps_note = _noise_note("QPS", last_qps, qps_interval)
    p99_note = _noise_note("P99", last_p99, p99_interval)
    if qps_note:
        total_qps = None  # no shares of a total that is noise
    if p99_note:
        total_p99 = None
    audit = Audit(
        head=header.head,
        protocol=header.protocol_label,
        environment=header.environment.summary,
        total_qps_pct=last_qps,
        total_p99_pct=last_p99,
        steps=_audit_steps(rows, total_qps, total_p99),
        questionable_runs=_questionable_runs(store, [row.experiment for row in rows]),
        confidence=header.confidence,
        total_qps_interval=qps_interval,
        total_p99_interval=p99_interval,
        notes=[note for note in (qps_note, p99_note) if note],
    )
    if header.capacity is not None:
        _add_capacity(audit, rows, header.capacity)
    return audit


def _pair(row: TableRow, low: str, high: str) -> list[float] | None:
    a, b = _num(row.get(low)), _num(row.get(high))
    return None if a is None or b is None else [a, b]


def _bool(value: Any) -> bool | None:
    value = plain(value)
    return value if isinstance(value, bool) else None


def _noise(significant: bool | None) -> str:
    if significant is None:
        return "not judged"
    return "beyond noise" if significant else "within noise"


def _add_capacity(audit: Audit, rows: list[TableRow], capacity: CapacitySlo) -> None:
    """Each step's capacity and its own Δ, the chain's total, and which step bought most."""
    confidence = audit.confidence
    level = f" at {confidence * 100:g}%" if confidence else ""
    audit.capacity_slo = capacity.label
    audit.capacity_loop = capacity.loop
    for step, row in zip(audit.steps, rows, strict=True):
        step.capacity_qps = _num(row.get("capacity_qps"))
        step.capacity_interval = _pair(row, "capacity_low_qps", "capacity_high_qps")
        step.capacity_step_pct = _num(row.get("capacity_step_pct"))
        step.capacity_step_interval = _pair(row, "capacity_step_low_pct", "capacity_step_high_pct")
        step.capacity_significant = _bool(row.get("capacity_significant"))
        step.capacity_verdict = _text(row, "capacity_verdict")
        reason = row.get("capacity_reason")
        step.capacity_reason = reason if isinstance(reason, str) else None
        if step.capacity_qps is None:
            continue
        parts = [f"{capacity_value(row)}/s"]
        if (delta := step_delta(row, "capacity", digits=0)) != "":
            noise = _noise(step.capacity_significant)
            verdict = f"capacity {step.capacity_verdict}: " if step.capacity_verdict else ""
            at = level if noise != "not judged" else ""
            parts.append(f"Δ step {delta} ({verdict}{noise}{at})")
        if (cumulative := cumulative_delta(row, "capacity", digits=0)) != "":
            parts.append(f"Δ cum {cumulative}")
        step.capacity_text = ", ".join(parts)
    if rows:
        head = rows[-1]
        audit.total_capacity_pct = _num(head.get("capacity_cumulative_pct"))
        audit.total_capacity_interval = _pair(
            head, "capacity_cumulative_low_pct", "capacity_cumulative_high_pct"
        )
        audit.total_capacity_significant = _bool(head.get("capacity_cumulative_significant"))
    best = most_headroom(rows)
    if best is not None:
        index, gained = best
        step = audit.steps[index]
        noise = _noise(step.capacity_significant)
        audit.most_headroom = (
            f"{step.experiment}: +{gained:,.1f} requests/s "
            f"({percent(step.capacity_step_pct, 0, missing='-')}, {noise})"
        )


def _chain_totals(measured: list[Any]) -> tuple[float | None, float | None]:
    """The chain's absolute QPS and P99 changes from its first measured row to its last: the
    totals the steps' shares are of."""
    if not measured:
        return None, None
    base, last = measured[0], measured[-1]
    total_qps = _num(last.qps) - _num(base.qps)  # type: ignore[operator]
    p99_base, p99_last = _num(base.p99_ms), _num(last.p99_ms)
    if p99_base is None or p99_last is None:
        return total_qps, None
    return total_qps, p99_last - p99_base


def _cumulative(last: Any, metric: str) -> tuple[float | None, list[float] | None]:
    """The last measured row's change of a metric against the baseline, and its interval."""
    if last is None:
        return None, None
    return _num(last.get(f"{metric}_cumulative_pct")), _interval(last, metric)


class _Shares(NamedTuple):
    """A step's shares (%) of the chain's totals; None where a side or the total is missing."""

    qps: float | None = None
    qps_low: float | None = None
    qps_high: float | None = None
    p99: float | None = None


def _audit_steps(
    rows: list[TableRow], total_qps: float | None, total_p99: float | None
) -> list[AuditStep]:
    """Every row as a step, its shares taken from the change since the previous measured row."""
    steps: list[AuditStep] = []
    previous: Any = None
    for row in rows:
        shares = _Shares()
        if previous is not None and _num(row.qps) is not None:
            shares = _shares(row, previous, total_qps, total_p99)
        steps.append(_audit_step(row, shares))
        if _num(row.qps) is not None:
            previous = row
    return steps


def _shares(
    row: TableRow, previous: TableRow, total_qps: float | None, total_p99: float | None
) -> _Shares:
    qps_share = low = high = p99_share = None
    before = _num(previous.qps)
    if before:
        qps_share = _share(_num(row.qps) - before, total_qps)  # type: ignore[operator]
        low, high = _share_interval(row, before, total_qps)
    p99_before, p99_now = _num(previous.p99_ms), _num(row.p99_ms)
    if p99_before is not None and p99_now is not None:
        p99_share = _share(p99_now - p99_before, total_p99)
    return _Shares(qps_share, low, high, p99_share)


def _share_interval(
    row: TableRow, before: float, total_qps: float | None
) -> tuple[float | None, float | None]:
    """The step's QPS change interval as shares of the total, low first (a negative total
    turns the interval round)."""
    lo, hi = _num(row.qps_step_low_pct), _num(row.qps_step_high_pct)
    if lo is None or hi is None:
        return None, None
    low = _share(lo / 100 * before, total_qps)
    high = _share(hi / 100 * before, total_qps)
    if low is not None and high is not None and low > high:
        low, high = high, low
    return low, high


def _text(row: TableRow, column: str) -> str | None:
    """A free-text cell, or None where the row holds no text (NaN, None)."""
    value = row.get(column)
    return value if isinstance(value, str) else None


def _audit_step(row: TableRow, shares: _Shares) -> AuditStep:
    return AuditStep(
        experiment=str(row.experiment),
        change=f"{row.variable}: {row.change}" if _text(row, "change") is not None else None,
        hypothesis=_text(row, "hypothesis"),
        verdict=row.verdict,
        outcome=_outcome(row),
        qps_share_pct=shares.qps,
        qps_share_low_pct=shares.qps_low,
        qps_share_high_pct=shares.qps_high,
        p99_share_pct=shares.p99,
        who=_text(row, "who"),
        when=_text(row, "started_at"),
        commit=_text(row, "git_commit"),
        flags=list(row.flags),
        missing=_text(row, "missing"),
        decided_by=list(row.decided_by),
        confidence=_num(row.step_confidence),
    )


def _questionable_runs(store: Store, names: Iterable[Any]) -> list[str]:
    """One line per run of the chain's experiments that is not a finished, valid, full run."""
    questionable = []
    for name in names:
        for run in store.list_runs(str(name)):
            if run.status != "FINISHED" or not run.valid or run.provisional:
                marks = [run.status]
                if run.status == "FINISHED":
                    marks.append("VALID" if run.valid else "INVALID")
                if run.provisional:
                    marks.append("PROVISIONAL")
                why = "; ".join(run.reasons) or (run.error_message or "").split("\n")[0]
                questionable.append(
                    f"run {run.id} {run.experiment}: {' '.join(marks)}"
                    + (f" ({why})" if why else "")
                )
    return questionable


def _span(interval: list[float] | None) -> str:
    return "" if interval is None else f" [{bound(interval[0], 1)}, {bound(interval[1], 1)}]"


def _outcome(row: TableRow) -> str:
    if _num(row.qps) is None:
        return f"not measured here: {row.missing}"
    parts = [
        f"QPS {percent(row.qps_step_pct, missing='-')}",
        f"P50 {percent(row.p50_step_pct, missing='-')}",
        f"P99 {percent(row.p99_step_pct, missing='-')}",
    ]
    accuracy = _num(row.accuracy_top1)
    if accuracy is not None:
        parts.append(f"top-1 {accuracy:.2%}")
    return ", ".join(parts)


def render_audit(audit: Audit) -> str:
    lines = [
        f"audit of {audit.head}: {audit.protocol}",
        f"environment: {audit.environment}",
        f"chain total: QPS {percent(audit.total_qps_pct, missing='-')}"
        f"{_span(audit.total_qps_interval)}, "
        f"P99 {percent(audit.total_p99_pct, missing='-')}{_span(audit.total_p99_interval)}",
        *(f"note: {note}" for note in audit.notes),
        "",
    ]
    if audit.capacity_slo is not None:
        total = percent(audit.total_capacity_pct, missing="-")
        noise = (
            ", " + _noise(audit.total_capacity_significant)
            if audit.total_capacity_significant is not None
            else ""
        )
        lines.insert(
            3 + len(audit.notes),
            f"capacity under {audit.capacity_slo}: chain total {total}"
            f"{_span(audit.total_capacity_interval)}{noise}; most headroom bought by "
            f"{audit.most_headroom or 'no step (none gained capacity against its parent)'}",
        )
    for step in audit.steps:
        lines.append(f"{step.experiment}: {step.change or '(baseline)'}")
        if audit.capacity_slo is not None:
            lines.append(
                f"  capacity: {step.capacity_text or 'none'}"
                + (f" ({step.capacity_reason})" if step.capacity_reason else "")
            )
        if step.missing:
            lines.append(f"  skipped: {step.missing}")
            continue
        if step.hypothesis:
            lines.append(f"  hypothesis: {step.hypothesis}")
        verdict = step.verdict or "-"
        if step.decided_by:
            verdict += f", decided by {', '.join(step.decided_by)}"
        lines.append(f"  outcome: {verdict}: {step.outcome}")
        if step.qps_share_pct is not None:
            interval = ""
            if step.qps_share_low_pct is not None and step.qps_share_high_pct is not None:
                confidence = step.confidence or audit.confidence
                level = f"{confidence * 100:.4g}% " if confidence else ""
                interval = (
                    f" ({level}interval {step.qps_share_low_pct:.0f}% to "
                    f"{step.qps_share_high_pct:.0f}%)"
                )
            lines.append(f"  share of the total QPS gain: {step.qps_share_pct:.0f}%{interval}")
        if step.p99_share_pct is not None:
            lines.append(f"  share of the total P99 change: {step.p99_share_pct:.0f}%")
        for flag in step.flags:
            lines.append(f"  flag: {flag}")
        lines.append(
            f"  measured by {step.who or '?'} at {step.when or '?'}, "
            f"commit {step.commit or 'unknown'}"
        )
    if audit.questionable_runs:
        lines += ["", "invalid, provisional or unfinished runs:"]
        lines += [f"  {line}" for line in audit.questionable_runs]
    return "\n".join(lines) + "\n"
