"""A stored sweep as `--json` (docs/sweep-json.md), a terminal table of its levels, and
markdown.

Everything is read back from the store (the sweep row, its level runs and their windows), so
`optlab sweep` prints what was stored, and a sweep shown later prints the same.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from optlab.config.protocol import protocol_label
from optlab.config.slo import Slo
from optlab.store import Store, SweepRecord, SweepResult
from optlab.sweep.levels import level_of
from optlab.sweep.strategy import Level, Mode, Settings, judge

__all__ = [
    "SWEEP_SCHEMA_VERSION",
    "LevelRow",
    "SweepView",
    "load_sweep",
    "render_sweep",
    "render_sweep_list",
    "render_sweep_markdown",
    "sweep_json",
]

SWEEP_SCHEMA_VERSION = 1
WIDTH = 100  # the text table fits a terminal this wide


@dataclass(frozen=True)
class LevelRow:
    position: int
    purpose: str
    reused: bool
    level: Level
    limit: str | None  # None: met the SLO and the target kept up

    @property
    def meets_slo(self) -> bool:
        return self.limit is None


@dataclass(frozen=True)
class SweepView:
    record: SweepRecord
    slo: Slo
    levels: tuple[LevelRow, ...]

    @property
    def result(self) -> SweepResult | None:
        return self.record.result


def load_sweep(store: Store, sweep_id: int) -> SweepView:
    record = store.get_sweep(sweep_id)
    slo = record.slo
    settings = Settings(
        mode="closed" if record.mode == "closed" else "open",
        slo=slo,
        max_error_rate=float(record.protocol.get("max_error_rate", 0.01)),
    )
    rows = []
    for lv in record.levels:
        run = store.get_run(lv.run_id)
        mode: Mode = "closed" if lv.mode == "closed" else "open"
        windows = store.get_windows(run.id, "measure")
        level = level_of(run, windows, mode, lv.load, slo, lv.purpose)
        rows.append(LevelRow(lv.position, lv.purpose, lv.reused, level, judge(level, settings)))
    return SweepView(record, slo, tuple(rows))


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def sweep_json(view: SweepView) -> dict[str, Any]:
    """The `optlab sweep --json` object (docs/sweep-json.md)."""
    r, result = view.record, view.result
    interval = result.capacity_interval if result else None
    return {
        "schema_version": SWEEP_SCHEMA_VERSION,
        "sweep_id": r.id,
        "experiment": r.experiment,
        "status": r.status,
        "slo": view.slo.model_dump(mode="json"),
        "mode": r.mode,
        "capacity_qps": _round(result.capacity_qps if result else None),
        "capacity_interval": [_round(v) for v in interval] if interval else None,
        "knee_qps": _round(result.knee_qps if result else None),
        "knee_clients": result.knee_clients if result else None,
        "limited_by": result.limited_by if result else None,
        "message": result.message if result else None,
        "method": result.method if result else None,
        "notes": list(result.notes) if result else [],
        "protocol": protocol_label(r.protocol),
        "levels": [
            {
                "run_id": row.level.run_id,
                "offered_qps": _round(row.level.offered_qps),
                "concurrency": int(row.level.load) if row.level.mode == "closed" else None,
                "achieved_qps": _round(row.level.achieved_qps),
                "p50_ms": _round(row.level.p50_ms),
                "p99_ms": _round(row.level.p99_ms),
                "error_rate": _round(row.level.error_rate, 6),
                "valid": row.level.valid,
                "meets_slo": row.meets_slo,
                "limit": row.limit,
                "purpose": row.purpose,
                "reused": row.reused,
            }
            for row in view.levels
        ],
        "measured_s": _round(r.measured_s, 1),
        "error": r.error_message,
    }


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.2f}"


def _qps(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _load(row: LevelRow) -> str:
    lv = row.level
    return f"{int(lv.load)} cl" if lv.mode == "closed" else f"{lv.load:,.1f}/s"


def _verdict(row: LevelRow) -> str:
    if row.limit is None:
        return "meets"
    return {"slo": "over SLO", "invalid": "INVALID"}.get(row.limit, row.limit)


_HEADERS = ("#", "load", "achieved/s", "P50 ms", "P99 ms", "err %", "run", "verdict")
# A sweep judged by more than the E2E percentile (token series, several bounds): P50 and P99
# are still the E2E latency's, and this column says how much of its bound the level used (the
# bound nearest to being broken; over 100% breaks the SLO).
_SLO_HEADER = "of SLO"


def _headers(view: SweepView) -> tuple[str, ...]:
    if view.slo.plain:
        return _HEADERS
    return (*_HEADERS[:5], _SLO_HEADER, *_HEADERS[5:])


def _rows(view: SweepView) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for row in view.levels:
        lv = row.level
        cells: tuple[str, ...] = (
            str(row.position),
            _load(row),
            _qps(lv.achieved_qps),
            _ms(lv.p50_ms),
            _ms(lv.p99_ms),
            f"{lv.error_rate * 100:.2f}",
            f"{lv.run_id}{'*' if row.reused else ''}",
            _verdict(row) + ("" if lv.valid or row.limit == "invalid" else " (INVALID)"),
        )
        if not view.slo.plain:
            used = "-" if lv.value_ms is None else f"{lv.value_ms / view.slo.ms:.0%}"
            cells = (*cells[:5], used, *cells[5:])
        rows.append(cells)
    return rows


def _headline(view: SweepView) -> list[str]:
    r, result = view.record, view.result
    lines = [
        f"sweep {r.id} {r.experiment}: {r.status}, {r.mode} loop, {view.slo.label}, "
        f"{protocol_label(r.protocol)}; {r.measured_s or 0:.0f} s measured",
        (result.message if result else None) or "no result",
    ]
    if result is not None and result.knee_qps is not None:
        clients = result.knee_clients
        lines.append(
            f"knee at {result.knee_qps:,.1f}/s"
            + (f" ({clients} clients)" if clients else "")
            + " (Kneedle on latency against throughput)"
        )
    lines.extend(f"note: {note}" for note in (result.notes if result else ()))
    if r.error_message:
        lines.append(f"error: {r.error_message}")
    return lines


def render_sweep(view: SweepView) -> str:
    """The levels as a plain table (under 100 columns) below the sweep's answer."""
    rows = _rows(view)
    headers = _headers(view)
    widths = [
        max(len(h), *(len(row[i]) for row in rows)) if rows else len(h)
        for i, h in enumerate(headers)
    ]
    right = set(range(1, len(headers) - 1))

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(cells)
        ).rstrip()

    # The answer can be long (a generator limit says why and what to do): wrapped to fit.
    headline = [
        wrapped
        for text in _headline(view)
        for wrapped in textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    ]
    out = headline + ["", line(headers)]
    out += [line(row) for row in rows]
    if any(row.reused for row in view.levels):
        out.append("* reused from an earlier sweep (same config, protocol, environment, code)")
    return "\n".join(out)


def render_sweep_markdown(view: SweepView) -> str:
    """GitHub markdown: the answer, then the levels."""
    out = [f"### Sweep {view.record.id}: {view.record.experiment}", ""]
    out += [f"- {line}" for line in _headline(view)[1:]]
    headers = _headers(view)
    out += ["", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(row) + " |" for row in _rows(view)]
    return "\n".join(out) + "\n"


_LIST_HEADERS = (
    "id", "experiment", "status", "mode", "SLO", "capacity/s", "interval", "limited by", "levels",
)  # fmt: skip
_LIST_RIGHT = {0, 5, 8}


def _list_row(sweep: SweepRecord) -> tuple[str, ...]:
    result = sweep.result
    interval = result.capacity_interval if result else None
    return (
        str(sweep.id),
        sweep.experiment,
        sweep.status,
        sweep.mode,
        sweep.slo.key,
        _qps(result.capacity_qps if result else None),
        f"[{interval[0]:,.1f}, {interval[1]:,.1f}]" if interval else "-",
        (result.limited_by if result else None) or "-",
        str(len(sweep.levels)),
    )


def render_sweep_list(sweeps: Sequence[SweepRecord]) -> str:
    """`optlab sweeps`: one line per sweep. Each column is as wide as its widest cell, with two
    spaces between columns, so a long interval (`[14,904.0, 15,210.3]`) or a long name never
    runs into the next column."""
    rows = [_LIST_HEADERS, *(_list_row(s) for s in sweeps)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_LIST_HEADERS))]
    return "\n".join(
        "  ".join(
            cell.rjust(widths[i]) if i in _LIST_RIGHT else cell.ljust(widths[i])
            for i, cell in enumerate(row)
        ).rstrip()
        for row in rows
    )
