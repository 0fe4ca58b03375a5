"""The stacked-gains table as GitHub markdown, sized for a pull-request comment.

A title line, the table, the protocol and a one-line environment summary, then numbered notes
for what a cell cannot hold: trade-off flags, INVALID reasons, PROVISIONAL runs, failed SLOs and
why a step has no row. Every user-supplied string is escaped so that it cannot break the table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from optlab.reports.export import present
from optlab.reports.format import (
    capacity_label,
    capacity_value,
    change_text,
    cumulative_delta,
    goodput_text,
    level,
    number,
    percent,
    rate,
    stage_name,
    step_delta,
    verdict_label,
)
from optlab.reports.stacked import LLM_COLUMNS

if TYPE_CHECKING:
    from optlab.reports.stacked import CapacitySlo, StackedTable, TableHeader, TableRow

PROVISIONAL_NOTE = "PROVISIONAL: measured under a short protocol; confirm with a full run"


def escape(text: Any) -> str:
    """One table cell's worth of user text: no newline, no `|`, no raw HTML."""
    value = str(text).replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    # `<` alone starts raw HTML in GitHub markdown; `->` and `a & b` stay readable.
    return value.replace("<", "&lt;").replace("|", "\\|")


def stage_columns(table: StackedTable) -> list[str]:
    """`<stage>_p50_ms` columns that hold a value, in the table's order."""
    return table.stage_columns(with_values=True)


def head_name(table: StackedTable) -> str:
    if table.header.head:
        return table.header.head
    return table.rows[-1].experiment if table.rows else "(empty chain)"


def row_notes(row: TableRow) -> list[str]:
    """What this step's footnotes say, in a fixed order."""
    notes = []
    if not present(row.run_id):
        notes.append(f"missing: {row.missing or 'no run'}")
        if (capacity := capacity_note(row)) is not None:
            notes.append(capacity)
        return notes
    notes += [f"flag: {flag}" for flag in row.flags]
    if row.valid is False:
        reasons = list(row.reasons) or ["no reason recorded"]
        notes.append("INVALID: " + "; ".join(reasons))
    if row.provisional:
        notes.append(PROVISIONAL_NOTE)
    if row.slo_pass is False:
        failures = list(row.slo_failures) or ["SLO failed"]
        notes.append("SLO failed: " + "; ".join(failures))
    if present(row.missing):
        notes.append(f"note: {row.missing}")
    if row.knob_sweep is not None:
        notes.append(
            f"from sweep-knob {row.knob_sweep}: its values measured against the parent in "
            f"blocks (`optlab knob-sweeps --show {row.knob_sweep}`)"
        )
    if (capacity := capacity_note(row)) is not None:
        notes.append(capacity)
    return notes


def capacity_note(row: TableRow) -> str | None:
    """Why a step has no capacity, or no capacity Δ (a swept chain's table only)."""
    reason = row.get("capacity_reason")
    return f"capacity: {reason}" if present(reason) else None


def render_markdown(table: StackedTable) -> str:
    """The table for a PR comment (title, table, **Protocol**, **Environment**, notes)."""
    stages = stage_columns(table)
    show_accuracy = table.any_value("accuracy_top1")
    slo = capacity_label(table.header)
    llm = [(c, h) for c, h in LLM_COLUMNS if table.any_value(c)]
    headers = _headers(stages, show_accuracy, slo)
    headers[-1:-1] = [h for _, h in llm]
    align = ["---", "---"] + ["---:"] * (len(headers) - 3) + ["---"]

    lines = [f"### optlab stacked gains: {escape(head_name(table))}", ""]
    lines.append("| " + " | ".join(escape(h) for h in headers) + " |")
    lines.append("|" + "|".join(align) + "|")
    notes: dict[str, int] = {}  # note text -> its number; a shared note is listed once
    for row in table.rows:
        cells = _figure_cells(row, stages, show_accuracy, slo is not None)
        cells += [_llm_cell(row, c) for c, _ in llm]
        cells.append(_verdict_cell(row, note_marks(row, notes, _note_text)))
        lines.append("| " + " | ".join(cells) + " |")

    lines.append("")
    levels = {
        level
        for row in table.rows
        for level in (row.step_confidence, row.cumulative_confidence)
        if level is not None
    }
    lines += _context(table.header, levels)
    if notes:
        lines.append("")
        lines += [f"{i}. {note}" for note, i in notes.items()]
    return "\n".join(lines) + "\n"


def _headers(stages: list[str], show_accuracy: bool, slo: str | None) -> list[str]:
    headers = ["step", "change", "QPS", "Δ step", "Δ cum", "P50 ms", "Δ step", "P99 ms"]
    headers += ["Δ step", "Δ cum"]
    if slo is not None:
        headers += [f"capacity @ {slo}", "Δ step", "Δ cum"]
    headers += [f"{stage_name(c)} P50" for c in stages]
    if show_accuracy:
        headers.append("top-1")
    headers.append("verdict")
    return headers


def _figure_cells(
    row: TableRow, stages: list[str], show_accuracy: bool, capacity: bool = False
) -> list[str]:
    """A row's cells but its verdict: the step, its change and its figures."""
    cells = [
        escape(row.experiment),
        change_text(row, escape),
        number(row.qps),
        step_delta(row, "qps"),
        percent(row.qps_cumulative_pct),
        number(row.p50_ms, 2),
        step_delta(row, "p50"),
        number(row.p99_ms, 2),
        step_delta(row, "p99"),
        percent(row.p99_cumulative_pct),
    ]
    if capacity:
        cells += [
            capacity_value(row),
            step_delta(row, "capacity", digits=0) + _significance(row),
            cumulative_delta(row, "capacity", digits=0),
        ]
    cells += [number(row.get(c), 2) for c in stages]
    if show_accuracy:
        cells.append(rate(row.accuracy_top1))
    return cells


def _llm_cell(row: TableRow, column: str) -> str:
    """A streaming target's figure: goodput as a rate, tokens/s whole, times in ms; a judged
    one with its step change and interval."""
    value = row.get(column)
    if column == "goodput":
        return goodput_text(row)
    text = number(value, 0 if column == "output_tps" else 2)
    change = step_delta(row, column.removesuffix("_ms"), digits=0, tight=True)
    return f"{text} ({change})" if change and row.verdict != "baseline" else text


def _significance(row: TableRow) -> str:
    """` ✓` after a capacity Δ beyond noise: the table's Δ columns say it by their interval,
    a capacity Δ's interval is the sweeps' and reads the same way."""
    return " ✓" if row.get("capacity_significant") is True else ""


def note_marks(row: TableRow, notes: dict[str, int], text: Callable[[Any, str], str]) -> list[int]:
    """The numbers of the row's notes, numbering each note not yet in `notes` (its text ->
    number). The PROVISIONAL note is one for every row; the others name their step:
    `text(step or None, note)` writes a note in the renderer's markup."""
    marks: list[int] = []
    for note in row_notes(row):
        step = None if note == PROVISIONAL_NOTE else row.experiment
        marks.append(notes.setdefault(text(step, note), len(notes) + 1))
    return marks


def _note_text(step: Any, note: str) -> str:
    return escape(note) if step is None else f"{escape(step)}: {escape(note)}"


def _verdict_cell(row: TableRow, marks: list[int]) -> str:
    verdict = verdict_label(row)
    if row.valid is False:
        verdict += ", INVALID"
    if row.provisional:
        verdict += ", PROVISIONAL"
    if row.slo_pass is False:
        verdict += ", SLO ✗"
    refs = " ".join(f"[{n}]" for n in sorted(set(marks)))
    return escape(verdict) + (" " + refs if refs else "")


def _loop(capacity: CapacitySlo) -> str:
    return f"{capacity.loop}-loop " if capacity.loop else ""


def _repeated(levels: set[float], confidence: Any) -> str:
    """Where pairs or repeats measured the run-to-run spread, the level their steps use."""
    others = sorted(c for c in levels if abs(c - float(confidence)) > 1e-9)
    if not others:
        return ""
    return (
        f" ({', '.join(level(c) for c in others)} where pairs or repeats measure the "
        "run-to-run spread)"
    )


def _context(header: TableHeader, levels: set[float] | None = None) -> list[str]:
    """Under the table: the protocol, the environment (and the service's), what Δ means
    (`levels`: the levels the steps' intervals were built at)."""
    levels = levels or set()
    protocol = header.protocol_label or (header.protocol or {}).get("name")
    lines = [f"**Protocol:** {escape(protocol or 'not recorded')}"]
    environment = header.environment.summary
    lines.append("")
    lines.append(f"**Environment:** {escape(environment or 'not recorded')}")
    service = header.environment.service
    if service:
        lines.append("")
        lines.append(f"**Service environment:** {escape(service)}")
    confidence = header.confidence
    if present(confidence):
        lines.append("")
        lines.append(
            f"Δ step: change against the previous measured step, [interval] at "
            f"{level(confidence)} confidence{_repeated(levels, confidence)}; Δ cum: change "
            "against the baseline."
        )
    slo = header.capacity
    if slo is not None:
        lines.append("")
        lines.append(
            f"**Capacity:** requests/s that meet {escape(slo.slo.label)} [the sweep's 95% "
            f"interval], from each step's newest comparable {escape(_loop(slo))}sweep "
            f"({escape(slo.protocol_label or 'no sweep')}); its Δ step is against the "
            "parent, ✓ beyond noise (a z-test on the log ratio of the two sweeps' "
            "capacities); its verdict (`capacity gain`) is its own, not the runs'."
        )
    return lines
