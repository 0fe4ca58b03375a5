"""`optlab check`: a CI gate on the head of a chain against its parent step (or the baseline).

The change is the table's own (`reports.table`: one statistic per question, so the gate, the
table and `optlab audit` never disagree): for QPS, P50 and P99, and a streaming chain's TTFT
P50/P99, TPOT P50/P99 and output tokens/s, the step's judged change against its parent
(`--against parent`) or against the baseline (`--against baseline`), over every pair or
repeat, with its interval; for P95, P99.9, ITL P99 and goodput, which the table does not judge,
the change of the newest runs' figures. Whether it is beyond noise is
`metrics.stats.beyond_noise` on that interval, as the table's verdict.

`--max-regression` is judged on the point estimate alone: a gate that waited for significance
would let a real regression through on a short, noisy run. `--min-gain` asks for a gain, and a
change within noise is not one: it passes when the change reaches the threshold and is not
within noise (a metric the table could not judge is held to the point estimate).

`capacity` is judged on the table's capacity column (`reports.capacity`): the head's capacity
under the SLO against the baseline's, whatever `--against` says, since capacity is what the
whole chain set out to buy and a step's parent may not have been swept.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from optlab.errors import ConfigError, OptlabError
from optlab.metrics.change import percent_change
from optlab.metrics.stats import beyond_noise
from optlab.reports.stacked import LLM_DELTA_METRICS

if TYPE_CHECKING:
    from optlab.reports.stacked import StackedTable, TableRow

# metric -> (table column, higher is better)
METRICS: dict[str, tuple[str, bool]] = {
    "qps": ("qps", True),
    "p50": ("p50_ms", False),
    "p95": ("p95_ms", False),
    "p99": ("p99_ms", False),
    "p999": ("p999_ms", False),
    "capacity": ("capacity_qps", True),
    # A streaming LLM target's (docs/run-json.md "llm").
    "ttft_p50": ("ttft_p50_ms", False),
    "ttft_p99": ("ttft_p99_ms", False),
    "tpot_p50": ("tpot_p50_ms", False),
    "tpot_p99": ("tpot_p99_ms", False),
    "itl_p99": ("itl_p99_ms", False),
    "output_tps": ("output_tps", True),
    "goodput": ("goodput", True),
}
CAPACITY = "capacity"
_THRESHOLD = re.compile(r"^\s*([a-z0-9_]+)\s*=\s*([0-9]+(?:\.[0-9]+)?)\s*%?\s*$")


@dataclass(frozen=True)
class Threshold:
    metric: str
    percent: float
    kind: str  # "max-regression" | "min-gain"


@dataclass(frozen=True)
class GateLine:
    threshold: Threshold
    before: float | None
    after: float | None
    change_pct: float | None  # signed: + is an improvement
    passed: bool
    beyond_noise: bool | None
    versus: str | None = None  # the step judged against, where not the result's `against`
    # The table's statistic the change is, where the sides have several runs (pairs, repeats):
    # then `before` and `after`, the newest runs' figures, are not what the change compares.
    statistic: str | None = None


@dataclass(frozen=True)
class GateResult:
    head: str
    against: str
    lines: list[GateLine]
    problems: list[str]

    @property
    def passed(self) -> bool:
        return not self.problems and all(line.passed for line in self.lines)


def parse_threshold(text: str, kind: str) -> Threshold:
    """`p99=5%` -> Threshold('p99', 5.0, kind); errors name the option and the fix."""
    option = f"--{kind}"
    match = _THRESHOLD.match(text.lower())
    if not match:
        raise ConfigError(
            f"{option} {text!r} is not METRIC=PERCENT",
            hint=f"for example {option} p99=5% (metrics: {', '.join(METRICS)})",
        )
    metric, value = match.group(1), float(match.group(2))
    if metric not in METRICS:
        raise ConfigError(
            f"{option} {text!r}: unknown metric {metric!r}",
            hint=f"use one of {', '.join(METRICS)}",
        )
    return Threshold(metric, value, kind)


def _value(row: TableRow, column: str) -> float | None:
    value = row.get(column)
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value)


def _judge(threshold: Threshold, change: float | None, noise: bool | None = None) -> bool:
    """`change` signed so that + is better; `noise`: whether it is beyond noise (None: not
    judged). A minimum gain within noise is not met."""
    if change is None:
        return False
    if threshold.kind == "max-regression":
        return change >= -threshold.percent
    return change >= threshold.percent and noise is not False


def _capacity_lines(table: StackedTable, thresholds: list[Threshold]) -> list[GateLine]:
    """The capacity thresholds, head against baseline; exit 2 (OptlabError) when the chain
    has no comparable sweeps to judge by."""
    rows = table.rows
    head, base = rows[-1], rows[0]
    capacity = table.header.capacity
    if capacity is None:
        raise OptlabError(
            f"the chain of {head.experiment!r} has no finished sweep to judge capacity by",
            hint="sweep the chain first: `optlab sweep HEAD_FILE --chain --slo p99=60ms`",
        )
    if len(rows) < 2:
        raise OptlabError(
            f"{head.experiment!r} is its chain's baseline: no capacity to judge it against",
            hint="check a step of the chain, not its baseline",
        )
    before, after = _value(base, "capacity_qps"), _value(head, "capacity_qps")
    if before is None or after is None:
        why = [
            f"{row.experiment}: {row.get('capacity_reason') or 'no capacity'}"
            for row in (base, head)
            if _value(row, "capacity_qps") is None
        ]
        raise OptlabError(
            f"the chain has no comparable sweeps under {capacity.slo.label} to judge capacity "
            "by (the baseline's and the head's): " + "; ".join(why),
            hint="sweep both under the same SLO and protocol, on this machine: "
            "`optlab sweep HEAD_FILE --chain --slo ...`, or pick the SLO with --slo",
        )
    change = _value(head, "capacity_cumulative_pct")
    if change is None:
        change = percent_change(before, after)
    noise = head.capacity.capacity_cumulative_significant if head.capacity else None
    versus = f"`{base.experiment}` ({capacity.label})"
    return [
        GateLine(t, before, after, change, _judge(t, change, noise), noise, versus)
        for t in thresholds
    ]


def evaluate(table: StackedTable, thresholds: list[Threshold], against: str) -> GateResult:
    """Judge the head (last row) against its parent step (`against="parent"`) or the
    baseline (`against="baseline"`); capacity always against the baseline."""
    if not table.rows:
        raise OptlabError("the chain has no steps", hint="measure it first")
    capacity = [t for t in thresholds if t.metric == CAPACITY]
    thresholds = [t for t in thresholds if t.metric != CAPACITY]
    capacity_lines = _capacity_lines(table, capacity) if capacity else []
    rows = table.rows
    head = rows[-1]
    if not thresholds:
        return GateResult(head.experiment, rows[0].experiment, capacity_lines, [])
    problems: list[str] = []
    if head.run_id is None:
        raise OptlabError(
            f"the head {head.experiment!r} has no run to judge: {head.missing}",
            hint="measure it (`optlab run FILE`) under the same protocol as its parent",
        )
    if not head.valid:
        problems.append(f"the head's run {head.run_id} is INVALID: " + "; ".join(head.reasons))
    measured = [r for r in rows[:-1] if _value(r, "qps") is not None]
    if not measured:
        raise OptlabError(
            f"{head.experiment!r} has no measured step before it to compare with",
            hint="measure its parent first (`optlab run FILE --chain`)",
        )
    base = measured[-1] if against == "parent" else measured[0]
    lines = []
    for threshold in thresholds:
        column, higher = METRICS[threshold.metric]
        before, after = _value(base, column), _value(head, column)
        change, noise = _table_change(head, threshold.metric, against)
        if change is None:
            change = percent_change(before, after)
        if change is not None and not higher:
            change = -change  # signed so that + is an improvement
        passed = _judge(threshold, change, noise)
        statistic = None
        if noise is not None and _several_runs(base, head):
            method = head.step_method if against == "parent" else None
            statistic = method if isinstance(method, str) else "the table's Δ cum"
        lines.append(GateLine(threshold, before, after, change, passed, noise, None, statistic))
    lines += capacity_lines
    return GateResult(str(head.experiment), str(base.experiment), lines, problems)


def _several_runs(*rows: TableRow) -> bool:
    return any((_value(row, "runs") or 0) > 1 for row in rows)


def _table_change(head: TableRow, metric: str, against: str) -> tuple[float | None, bool | None]:
    """The table's judged change of a headline metric (QPS, P50, P99) or a streaming one
    (`LLM_DELTA_METRICS`) in % (+ is higher), and whether it is beyond noise; (None, None) for
    a metric, or a head, the table did not judge."""
    if metric not in ("qps", "p50", "p99", *LLM_DELTA_METRICS):
        return None, None
    kind = "step" if against == "parent" else "cumulative"
    pct = _value(head, f"{metric}_{kind}_pct")
    low = _value(head, f"{metric}_{kind}_low_pct")
    high = _value(head, f"{metric}_{kind}_high_pct")
    if low is None or high is None:
        return pct, None
    return pct, beyond_noise(pct, low, high)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def render_gate(result: GateResult, protocol_label: str) -> str:
    """A markdown summary fit for a CI job's log or a PR comment."""
    status = "PASSED" if result.passed else "FAILED"
    out = [
        f"### optlab check: {status}",
        "",
        f"`{result.head}` against `{result.against}` ({protocol_label})",
        "",
        "| metric | gate | before | after | change | beyond noise | result |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for line in result.lines:
        t = line.threshold
        gate = (
            f"regress ≤ {t.percent:g}%" if t.kind == "max-regression" else f"gain ≥ {t.percent:g}%"
        )
        if line.versus is not None:
            gate += f" vs {line.versus}"
        change = (
            "-"
            if line.change_pct is None
            else f"{line.change_pct:+.1f}% better"
            if line.change_pct >= 0
            else f"{-line.change_pct:.1f}% worse"
        )
        noise = {True: "yes", False: "no (within noise)", None: "-"}[line.beyond_noise]
        out.append(
            f"| {t.metric} | {gate} | {_fmt(line.before)} | {_fmt(line.after)} | {change} | "
            f"{noise} | {'pass' if line.passed else '**FAIL**'} |"
        )
    for statistic in sorted({line.statistic for line in result.lines if line.statistic}):
        out.append(
            f"\n- change and beyond noise: the stacked table's statistic over every pair or "
            f"repeat ({statistic}); before and after: the newest run of each step"
        )
    for problem in result.problems:
        out.append(f"\n- **FAIL**: {problem}")
    return "\n".join(out) + "\n"
