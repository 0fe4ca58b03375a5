"""The stacked-gains table for a terminal (rich), and as plain text for logs and pipes.

On a terminal the table fits the terminal's width: the columns that matter (step, change, QPS
and P99 with their step change, verdict) always, the others while there is room, and what the
table leaves out in a per-step detail block under it. With `wide`,
and whenever stdout is not a terminal (a pipe, a file), every column at full width: the table
scripts read, the same as before the table learned to fit.
"""

from __future__ import annotations

import shutil
import sys
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Literal

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from optlab.reports.export import present
from optlab.reports.format import (
    capacity_value,
    change_text,
    cumulative_delta,
    goodput_text,
    interval,
    level,
    number,
    percent,
    rate,
    stage_name,
    step_delta,
    verdict_label,
    verdict_of,
    with_capacity_verdict,
)
from optlab.reports.stacked import LLM_COLUMNS, LLM_DELTA_METRICS

if TYPE_CHECKING:
    from optlab.reports.stacked import StackedTable, TableRow

# Piped output keeps every column unsqueezed, however wide (a script reads it whole).
PIPE_WIDTH = 320
# The fitted table's columns, separated by two spaces under one rule below the header.
GAP = 2
# A free-text column (change, verdict) keeps this many cells before a headline column joins
# the table, and this many before a stage or a target's figure does.
TEXT_ROOM = 24
TEXT_ROOM_WIDE = 40
KEY_COLUMNS = ("step", "change", "qps", "qps_step", "p99", "p99_step", "verdict")
# What joins the key columns while there is room, most wanted first: P50 and its Δ, capacity
# and its Δ (a swept chain only), the intervals of the Δ columns, the changes against the
# baseline (a column named again gets its interval).
JOINS = (
    ("p50", "p50_step"),
    ("capacity", "capacity_step"),
    ("qps_step",),
    ("p99_step",),
    ("qps_cum", "p99_cum"),
    ("capacity_cum",),
    ("p50_step",),
    ("capacity_step",),
    ("capacity",),
)
# The target's own figures the table shows where a step has them: (column, header).
EXTRAS = (
    ("infer_ms_per_request", "infer/req"),
    ("mean_batch_size", "batch"),
    ("accuracy_top1", "top-1"),
    ("cache_hit_rate", "cache hit"),
    *LLM_COLUMNS,
)
# What the detail block says of a step's resource use: (column, label, unit).
RESOURCES = (
    ("cpu_pct", "CPU", "%"),
    ("service_cpu_pct", "service CPU", "%"),
    ("gpu_util_pct", "GPU", "%"),
    ("gpu_mem_peak_mib", "GPU memory", " MiB"),
)


@dataclass(frozen=True)
class Column:
    """One column of the terminal table, its cells already written, one per step."""

    key: str
    header: str
    cells: tuple[str, ...]
    justify: Literal["left", "right"] = "right"
    wrap: bool = False  # free text: wraps at spaces to fit
    # The cells without their confidence interval (the Δ step columns), for a narrow terminal.
    short: tuple[str, ...] | None = None

    @property
    def width(self) -> int:
        """The widest line of its header and cells."""
        lines = [line for text in (self.header, *self.cells) for line in text.splitlines()]
        return max((cell_len(line) for line in lines), default=0)

    @property
    def least(self) -> int:
        """The narrowest it can wrap to without cutting a word (its width if it never wraps)."""
        if not self.wrap:
            return self.width
        words = [word for text in (self.header, *self.cells) for word in text.split()]
        return max((cell_len(word) for word in words), default=0)

    @property
    def without_interval(self) -> bool:
        """A Δ step column shown narrow (its interval goes to the detail block)."""
        return self.short is None and self.key.endswith("_step")

    def narrow(self) -> Column:
        return replace(self, cells=self.short, short=None) if self.short is not None else self


def _num(value: Any, digits: int = 1) -> str:
    return number(value, digits, missing="-")


def _extra(column: str, value: Any) -> str:
    if column in ("mean_batch_size", "infer_ms_per_request"):
        return _num(value, 2 if column == "infer_ms_per_request" else 1)
    if column == "output_tps":
        return _num(value, 0)
    if column.endswith("_ms"):
        return _num(value, 2)
    return rate(value, missing="-")


def _judged_extra(row: TableRow, column: str, prefix: str) -> str:
    """A streaming figure, and under it its step change with the interval."""
    text = _extra(column, row.get(column))
    change = step_delta(row, prefix, digits=0, tight=True)
    return f"{text}\n{change}" if change and row.verdict != "baseline" else text


def _mark(row: TableRow, *, compact: bool = False, titled: bool = False) -> str:
    """The verdict cell. `compact` (the fitted table) leaves out what every row would say:
    VALID, and PROVISIONAL when the title says the whole table is (`titled`); and it gives the
    verdict's word alone: the step changes that decided it are beside it, and the detail block
    names them (a verdict that wraps a word a line is not read)."""
    if not present(row.run_id):
        return "missing" if compact else "missing: " + str(row.missing or "no run")
    label = with_capacity_verdict(verdict_of(row), row) if compact else verdict_label(row)
    marks = [label if present(row.verdict) else ""]
    if not compact or not row.valid:
        marks.append("VALID" if row.valid else "INVALID")
    if row.provisional and not (compact and titled):
        marks.append("PROVISIONAL")
    if row.slo_pass is False:
        marks.append("SLO FAIL")
    return " ".join(m for m in marks if m)


def table_columns(table: StackedTable, *, compact: bool = False) -> list[Column]:
    """Every column of the full table, in its order; `compact`: as the fitted table writes
    them (its verdict, and only the stages that hold a value)."""
    rows = table.rows

    def column(key: str, header: str, cell: Callable[[Any], str], **options: Any) -> Column:
        return Column(key, header, tuple(cell(row) for row in rows), **options)

    def value(key: str, header: str, write: Callable[[Any], str]) -> Column:
        return column(key, header, lambda r: write(r.get(key)))

    def delta(key: str, prefix: str) -> Column:
        short = tuple(percent(row.get(f"{prefix}_step_pct"), 0) for row in rows)
        return column(key, "Δ step", lambda r: step_delta(r, prefix, digits=0, tight=True),
                      short=short)  # fmt: skip

    columns = [
        column("step", "step", lambda r: r.experiment, justify="left"),
        column("change", "change", change_text, justify="left", wrap=True),
        column("qps", "QPS", lambda r: _num(r.qps)),
        delta("qps_step", "qps"),
        column("qps_cum", "Δ cum", lambda r: percent(r.qps_cumulative_pct, 0)),
        column("p50", "P50 ms", lambda r: _num(r.p50_ms, 2)),
        delta("p50_step", "p50"),
        column("p99", "P99 ms", lambda r: _num(r.p99_ms, 2)),
        delta("p99_step", "p99"),
        column("p99_cum", "Δ cum", lambda r: percent(r.p99_cumulative_pct, 0)),
    ]
    if table.header.capacity is not None:
        columns += _capacity_columns(rows, table.header.capacity.label, column, delta)
    for stage in table.stage_columns(with_values=compact):
        columns.append(value(stage, f"{stage_name(stage)} P50", lambda v: _num(v, 2)))
    for extra, header in EXTRAS:
        if not table.any_value(extra):
            continue
        prefix = extra.removesuffix("_ms")
        if extra == "goodput":
            columns.append(column(extra, header, partial(goodput_text, missing="-")))
        elif prefix in LLM_DELTA_METRICS:  # judged: the step change and its interval below
            columns.append(
                column(extra, header, partial(_judged_extra, column=extra, prefix=prefix))
            )
        else:
            columns.append(value(extra, header, partial(_extra, extra)))
    # The title names the protocol, PROVISIONAL included (protocol_label).
    titled = table.header.provisional
    verdict = column("verdict", "verdict", lambda r: _mark(r, compact=compact, titled=titled),
                     justify="left", wrap=True)  # fmt: skip
    return [*columns, verdict]


def _capacity_columns(
    rows: Sequence[TableRow],
    slo: str,
    column: Callable[..., Column],
    delta: Callable[[str, str], Column],
) -> list[Column]:
    """Capacity under the SLO (its interval the wide form), its Δ step and Δ cum."""
    short = tuple(capacity_value(row, with_interval=False, missing="-") for row in rows)
    return [
        column("capacity", f"capacity @\n{slo}",
               lambda r: capacity_value(r, missing="-").replace(", ", ","), short=short),
        delta("capacity_step", "capacity"),
        column("capacity_cum", "Δ cum", lambda r: percent(r.get("capacity_cumulative_pct"), 0)),
    ]  # fmt: skip


def _needed(columns: Sequence[Column], room: int) -> int:
    """Cells the fitted table needs, its free-text columns at no less than `room`."""
    widths = [min(c.width, room) if c.wrap else c.width for c in columns]
    return sum(widths) + GAP * (len(columns) - 1)


def fit(columns: Sequence[Column], width: int) -> list[Column]:
    """The key columns (their Δ without interval), then each of JOINS while the table still
    fits in `width`, then each stage and each of the target's figures. The table keeps its
    usual column order."""
    full = {c.key: c for c in columns}
    chosen = {key: full[key].narrow() for key in KEY_COLUMNS if key in full}
    named = {key for keys in JOINS for key in keys}
    rest = [(c.key,) for c in columns if c.key not in named and c.key not in KEY_COLUMNS]
    for keys, room in [*((k, TEXT_ROOM) for k in JOINS), *((k, TEXT_ROOM_WIDE) for k in rest)]:
        if len(keys) == 1 and keys[0].endswith("_step") and keys[0] not in chosen:
            continue  # an interval joins only a Δ the table already shows
        # A column shown already gets its interval; one not shown yet joins without it.
        update = {k: full[k] if k in chosen else full[k].narrow() for k in keys if k in full}
        candidate = chosen | update
        if candidate != chosen and _needed(list(candidate.values()), room) <= width:
            chosen = candidate
    return [chosen[c.key] for c in columns if c.key in chosen]


def rich_table(stacked: StackedTable, title: str | None = None) -> Table:
    """Every column at full width: the table piped output and `--wide` show."""
    table = Table(title=title, show_lines=False)
    columns = table_columns(stacked)
    for column in columns:
        table.add_column(column.header, justify=column.justify)
    for index in range(len(stacked.rows)):
        table.add_row(*(column.cells[index] for column in columns))
    return table


def _share_out(columns: Sequence[Column], width: int) -> list[int | None]:
    """Each column's width: its own where the table fits; else the free-text columns share
    what the others leave, each from its longest word up, the narrowest served first (rich's
    own sharing can cut a word short while another column has room to spare, and a long
    change must not squeeze the verdict to a word a line). None (rich decides) when even the
    longest words do not fit."""
    spare = width - _needed(columns, room=0) - sum(c.least for c in columns if c.wrap)
    if _needed(columns, room=10**6) <= width or spare < 0:
        return [None if spare < 0 else c.width for c in columns]
    given = {c.key: c.least for c in columns if c.wrap}
    wanted = {c.key: c.width for c in columns if c.wrap}
    while spare > 0 and any(given[k] < wanted[k] for k in given):
        narrowest = min((k for k in given if given[k] < wanted[k]), key=lambda k: given[k])
        given[narrowest] += 1
        spare -= 1
    return [given.get(c.key, c.width) for c in columns]


def fitted_table(
    stacked: StackedTable, title: str | None, width: int
) -> tuple[Table, list[Column]]:
    """The table that fits in `width`, and the columns it shows."""
    shown = fit(table_columns(stacked, compact=True), width)
    widths = _share_out(shown, width)
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False,
                  padding=(0, 1, 0, 0))  # fmt: skip
    for column, cells in zip(shown, widths, strict=True):
        table.add_column(
            column.header,
            justify=column.justify,
            no_wrap=not column.wrap,
            overflow="fold",  # never "…": at worst a word breaks
            width=cells,
        )
    for index in range(len(stacked.rows)):
        table.add_row(*(Text(column.cells[index]) for column in shown))
    return table, shown


def notes(table: StackedTable, *, missing: bool = False) -> list[str]:
    """Flags, INVALID reasons and SLO failures, one line each, for under the table (with
    `missing`, why a step has no row too); then whether the service's own environment was
    checked."""
    lines = []
    for row in table.rows:
        if missing and not row.measured:
            lines.append(f"{row.experiment}: missing: {row.missing or 'no run'}")
        for label, items in (("flag", row.flags), ("invalid", row.reasons),
                             ("SLO", row.slo_failures)):  # fmt: skip
            for item in items:
                lines.append(f"{row.experiment}: {label}: {item}")
        if present(reason := row.get("capacity_reason")):
            lines.append(f"{row.experiment}: capacity: {reason}")
    service = table.header.environment.service
    if service:
        lines.append(f"service environment: {service}")
    return lines


def _figures(
    row: TableRow, shown: Mapping[str, bool], stages: Sequence[str], confidence: Any
) -> list[tuple[str, list[str]]]:
    """(label, items) of one step's detail lines: what the table left out (`shown`: its column
    keys -> whether shown without the interval), and what it never has room for."""
    latency = [] if "p50" in shown else [f"P50 {_num(row.p50_ms, 2)} ms"]
    latency += [f"{label} {_num(row.get(c), 2)} ms" for c, label in
                (("p95_ms", "P95"), ("p999_ms", "P99.9")) if present(row.get(c))]  # fmt: skip
    steps, cumulative = [], []
    for prefix, label in (("qps", "QPS"), ("p50", "P50"), ("p99", "P99")):
        key = f"{prefix}_step"
        text = step_delta(row, prefix, digits=0, tight=True)
        narrow = percent(row.get(f"{key}_pct"), 0)
        # Left out, or shown without an interval there is: the detail block gives it whole.
        if text and (key not in shown or (shown[key] and text != narrow)):
            steps.append(f"{label} {text}")
        cum = percent(row.get(f"{prefix}_cumulative_pct"), 0)
        if cum and f"{prefix}_cum" not in shown and row.verdict != "baseline":
            low, high = (row.get(f"{prefix}_cumulative_{end}_pct") for end in ("low", "high"))
            cumulative.append(f"{label} {cum}{interval(low, high, tight=True)}")
    stage_p50s = [f"{stage_name(c)} {_num(row.get(c), 2)}" for c in stages
                  if c not in shown and present(row.get(c))]  # fmt: skip
    resources = [f"{label} {_num(row.get(c))}{unit}" for c, label, unit in RESOURCES
                 if present(row.get(c))]  # fmt: skip
    if present(row.error_rate) and row.error_rate:
        resources.append(f"errors {rate(row.error_rate)}")
    target = [f"{header} {_extra(c, row.get(c))}{' ms' if c == 'infer_ms_per_request' else ''}"
              for c, header in EXTRAS
              if c not in shown and present(row.get(c))]  # fmt: skip
    return [("latency", latency), ("Δ step", steps), ("Δ cum", cumulative),
            ("stage P50 ms", stage_p50s), ("resources", resources), ("target", target),
            ("significance", _significance(row, confidence))]  # fmt: skip


def _significance(row: TableRow, confidence: Any) -> list[str]:
    """Whether the step is beyond noise, at the level its own interval was built at (pairs or
    repeats: `metrics.stats.REPEATED_CONFIDENCE`), and by which statistic."""
    significant = row.significant
    own = row.step_confidence
    confidence = own if present(own) else confidence
    if not isinstance(significant, bool) or not present(confidence):
        return []
    at = f"at {level(confidence)} confidence"
    method = row.step_method
    by = f" ({method})" if present(method) else ""
    if not significant:
        return [f"within noise {at}{by}"]
    decided = ", ".join(row.decided_by)
    return [f"beyond noise {at}" + (f", decided by {decided}" if decided else "") + by]


def _capacity(row: TableRow, confidence: Any) -> list[str]:
    """A step's capacity with its interval and sweep, and its changes with their intervals."""
    if not present(row.get("capacity_qps")):
        return []
    sweep = row.get("capacity_sweep_id")
    items = [f"{capacity_value(row)}/s" + (f" (sweep {int(sweep)})" if present(sweep) else "")]
    step = step_delta(row, "capacity", digits=0, tight=True)
    if step:
        significant = row.capacity.capacity_significant if row.capacity else None
        if isinstance(significant, bool) and present(confidence):
            step += f" {'beyond' if significant else 'within'} noise at {level(confidence)}"
        items.append(f"Δ step {step}")
    cumulative = cumulative_delta(row, "capacity", digits=0, tight=True)
    if cumulative:
        items.append(f"Δ cum {cumulative}")
    return items


def detail_lines(table: StackedTable, shown: Mapping[str, bool], width: int) -> list[str]:
    """Per measured step, what the fitted table left out and what it never shows (P95, P99.9,
    CPU and GPU use, GPU memory, significance), wrapped to `width`."""
    stages = table.stage_columns()
    lines: list[str] = []
    capacity = table.header.capacity
    confidence = table.header.confidence
    for row in table.rows:
        # Why a step has no run, or no capacity, is in the notes.
        figures: list[tuple[str, list[str]]] = []
        if row.measured:
            figures = _figures(row, shown, stages, confidence)
        if capacity is not None:
            figures.append((f"capacity @ {capacity.label}", _capacity(row, confidence)))
        sections = [(label, items) for label, items in figures if items]
        if not sections:
            continue
        lines += textwrap.wrap(row.experiment, width)
        for label, items in sections:
            lines += textwrap.wrap(f"{label}: {', '.join(items)}", width, initial_indent="  ",
                                   subsequent_indent="    ", break_on_hyphens=False)  # fmt: skip
    if lines:
        lines.insert(0, "")
        lines.insert(1, "per step (--wide puts every column in the table):")
    return lines


def _emit(console: Console, stacked: StackedTable, title: str | None, fit_to: int | None) -> None:
    if fit_to is None:
        console.print(rich_table(stacked, title))
    else:
        table, shown = fitted_table(stacked, title, fit_to)
        console.print(table)
    for line in notes(stacked, missing=fit_to is not None):
        console.print(line, markup=False, highlight=False)
    if fit_to is not None:
        for line in detail_lines(stacked, {c.key: c.without_interval for c in shown}, fit_to):
            console.print(line, markup=False, highlight=False, soft_wrap=True)


def render_text(
    table: StackedTable, title: str | None = None, width: int = 200, *, fit_to: bool = False
) -> str:
    """The table as plain text (no colour codes), for logs, pipes and tests: every column, or
    with `fit_to` the table a terminal `width` cells wide shows, and its detail block."""
    console = Console(width=width, record=True, color_system=None, force_terminal=False)
    with console.capture() as capture:
        _emit(console, table, title, width if fit_to else None)
    return capture.get()


def print_table(table: StackedTable, title: str | None = None, *, wide: bool = False) -> None:
    """The table and its notes on stdout. On a terminal, fitted to its width (COLUMNS, when
    set, wins), with what it leaves out in a detail block; `wide`, or not a terminal: every
    column at full width (piped output is never squeezed to 80 columns)."""
    if wide or not sys.stdout.isatty():
        _emit(Console(width=PIPE_WIDTH), table, title, None)
        return
    width = shutil.get_terminal_size().columns
    _emit(Console(width=width), table, title, width)
