"""How the reports write a figure: numbers, signed percentages, a step's change with its
interval, a knob's change, a verdict. One definition of each, shared by the terminal, markdown,
HTML and audit renderers; where a renderer writes a figure its own way (the terminal's whole
percents, markdown's en dash for a missing value), it says so by an argument, not a copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from optlab.metrics.change import signed_pct
from optlab.reports.export import present

if TYPE_CHECKING:
    from optlab.reports.stacked import TableHeader, TableRow

MISSING = "–"  # a value not measured, in markdown and HTML; the terminal writes "-"
# The table's metric labels (`decided_by`) -> their column prefix.
METRIC_PREFIX = {"QPS": "qps", "P50": "p50", "P99": "p99"}


def number(value: Any, digits: int = 1, missing: str = MISSING) -> str:
    """`1,234.5`, or `missing`."""
    return f"{float(value):,.{digits}f}" if present(value) else missing


def percent(value: Any, digits: int | None = 1, missing: str = "") -> str:
    """`+40.1%` (`digits` None: whole percents from 10% up, as a verdict writes them)."""
    return signed_pct(float(value), digits) if present(value) else missing


def rate(value: Any, missing: str = MISSING) -> str:
    """A fraction as a percentage: 0.761 -> `76.1%` (accuracy, hit rate, error rate)."""
    return f"{float(value):.1%}" if present(value) else missing


def goodput_text(row: Any, missing: str = MISSING) -> str:
    """A step's goodput with its interval: `99.4% [98.1, 99.9]`."""
    text = rate(row.get("goodput"), missing=missing)
    low, high = row.get("goodput_low"), row.get("goodput_high")
    if present(row.get("goodput")) and present(low) and present(high):
        text += f" [{float(low) * 100:.1f}, {float(high) * 100:.1f}]"
    return text


def bound(value: float, digits: int = 0) -> str:
    """An interval's bound in percent, `+44`: a ratio's bound lies above -100%, so one that
    rounds to -100 gets the digits that show it does not reach it (`-99.96`; `>-100` past
    four)."""
    text = f"{value:+.{digits}f}"
    while value > -100 and float(text) <= -100 and digits < 4:
        digits += 1
        text = f"{value:+.{digits}f}"
    return ">-100" if value > -100 and float(text) <= -100 else text


def interval(low: Any, high: Any, *, tight: bool = False) -> str:
    """` [+44, +56]` (` [+44,+56]` when `tight`), or "" when a bound is missing."""
    if not (present(low) and present(high)):
        return ""
    separator = "," if tight else ", "
    return f" [{bound(float(low))}{separator}{bound(float(high))}]"


def step_delta(row: TableRow, prefix: str, *, digits: int = 1, tight: bool = False) -> str:
    """A step's change against the previous measured step, with its confidence interval where
    the table has one: `+40.1% [+35, +45]`; "" when the step has no change."""
    text = percent(row.get(f"{prefix}_step_pct"), digits)
    if not text:
        return ""
    return text + interval(
        row.get(f"{prefix}_step_low_pct"), row.get(f"{prefix}_step_high_pct"), tight=tight
    )


def stage_name(column: str) -> str:
    """`preprocess_p50_ms` -> `preprocess`."""
    return column.removesuffix("_p50_ms")


def describe_change(old: Any, new: Any, render: Callable[[Any], str]) -> str:
    """`old -> new`, short enough for a table cell: a group knob shows its modes, then the new
    mode's settings (`off -> dynamic (max_batch_size 8, max_wait_ms 2.0, ...)`)."""
    if isinstance(old, dict) and isinstance(new, dict) and "mode" in new:
        settings = ", ".join(f"{k} {render(v)}" for k, v in new.items() if k != "mode")
        changed = f"{render(old.get('mode'))} -> {render(new['mode'])}"
        if old.get("mode") == new["mode"]:
            settings = ", ".join(
                f"{k} {render(old.get(k))} -> {render(v)}"
                for k, v in new.items()
                if old.get(k) != v
            )
        return f"{changed} ({settings})" if settings else changed
    return f"{render(old)} -> {render(new)}"


def change_text(row: TableRow, escape: Callable[[Any], str] = str) -> str:
    """The change column: `variable: old -> new`, or `(baseline)`."""
    change = row.change
    if not present(change):
        return "(baseline)"
    return f"{escape(row.variable or '?')}: {escape(change)}"


def verdict_of(row: TableRow) -> str:
    """The verdict column's word: the table's verdict, else what can be said without one."""
    if row.verdict:
        return str(row.verdict)
    if not present(row.run_id):
        return "missing"
    return "baseline" if not present(row.change) else "measured"


def verdict_label(row: TableRow) -> str:
    """The verdict with the metrics that decided it and their step change, e.g.
    `gain (P50 -38%)` or `regressed (P99 +100%)`: a reviewer sees why without the JSON; then
    capacity's own verdict where the table has one (`capacity_verdict_label`)."""
    parts = []
    for label in row.decided_by:
        value = percent(row.get(f"{METRIC_PREFIX.get(label, '?')}_step_pct"), digits=None)
        parts.append(f"{label} {value}" if value else label)
    word = verdict_of(row)
    text = f"{word} ({', '.join(parts)})" if parts else word
    return with_capacity_verdict(text, row)


def capacity_verdict_label(row: TableRow) -> str:
    """Capacity's own verdict on its Δ step, labelled as such (`capacity gain`, `capacity
    within noise`, `capacity regressed`): a different question from the runs' verdict beside
    it, which judges QPS and latency at one load. "" where capacity was not judged."""
    verdict = row.get("capacity_verdict")
    if verdict not in ("gain", "within noise", "regressed"):
        return ""
    return f"capacity {verdict}"


def with_capacity_verdict(text: str, row: TableRow) -> str:
    """`text; capacity gain`: a verdict followed by capacity's own, where there is one."""
    capacity = capacity_verdict_label(row)
    return f"{text}; {capacity}" if capacity and text else text or capacity


def level(confidence: Any) -> str:
    """A confidence as a percentage: 0.999 -> `99.9%`, 1 - 0.01/3 -> `99.67%`."""
    return f"{float(confidence) * 100:.4g}%"


def capacity_value(row: TableRow, *, with_interval: bool = True, missing: str = MISSING) -> str:
    """A step's capacity in requests/s with its sweep's interval, `98.2 [91.0, 104.5]`, or
    `missing` where it has none."""
    value = row.get("capacity_qps")
    if not present(value):
        return missing
    text = f"{float(value):,.1f}"
    low, high = row.get("capacity_low_qps"), row.get("capacity_high_qps")
    if with_interval and present(low) and present(high):
        text += f" [{float(low):,.1f}, {float(high):,.1f}]"
    return text


def cumulative_delta(row: TableRow, prefix: str, *, digits: int = 1, tight: bool = False) -> str:
    """A step's change against the baseline with its interval where the table has one."""
    text = percent(row.get(f"{prefix}_cumulative_pct"), digits)
    if not text:
        return ""
    return text + interval(
        row.get(f"{prefix}_cumulative_low_pct"),
        row.get(f"{prefix}_cumulative_high_pct"),
        tight=tight,
    )


def capacity_label(header: TableHeader) -> str | None:
    """`P99 ≤ 60 ms, open loop`: the SLO the table judges capacity by, and the loop of the
    sweeps it was found by (an open loop's capacity is a rate it sustains, a closed loop's the
    throughput of N clients); None when the table judges none."""
    return header.capacity.label if header.capacity is not None else None
