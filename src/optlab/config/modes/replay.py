"""Replay: the sends of a recorded trace (JSONL or CSV of offsets and request ids), looped for
as long as the measurement lasts, latency measured from each intended send like the open loop."""

from __future__ import annotations

import csv
import itertools
import json
import math
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal, TypeVar

from pydantic import Field

from optlab.config.modes.base import NS_PER_S, IndexedTrace, LoadCommon, LoadMode, Schedule
from optlab.errors import ConfigError

__all__ = [
    "REPLAY_MAX_IN_FLIGHT",
    "Replay",
    "ReplayLoad",
    "TraceEntry",
    "indexed_trace",
    "read_trace",
    "replay_offsets",
]

REPLAY_MAX_IN_FLIGHT = 512  # a replayed trace's requests in flight at once

TraceEntry = tuple[int, str | None]  # (intended offset in ns, request id or None)
T = TypeVar("T")

_TIME_KEYS = ("t", "offset_s")
_ID_KEYS = ("id", "request_id")
_TRACE_HINT = (
    'a trace is JSONL ({"t": 0.25, "id": "3"} per line; keys t or offset_s, id or request_id) '
    "or CSV with a header naming a t or offset_s column and optionally id or request_id; "
    "offsets are seconds from the start, never negative"
)


class ReplayLoad(LoadCommon):
    mode: Literal["replay"]
    trace: str = Field(min_length=1, description="JSONL or CSV of send offsets and request ids")
    time_scale: float = Field(1.0, gt=0, le=1000)


class Replay(LoadMode[ReplayLoad]):
    name = "replay"
    model = ReplayLoad
    open_loop = True

    def in_flight_limit(self, load: ReplayLoad) -> int:
        return REPLAY_MAX_IN_FLIGHT

    def in_flight_field(self, load: ReplayLoad) -> str:
        return "mode"  # no field sets it: a refusal points at the mode

    def indexed_trace(
        self, load: ReplayLoad, trace_dir: Path | None, n: int
    ) -> list[tuple[int, int | None]]:
        return indexed_trace(load, trace_dir, n)

    def schedule(self, load: ReplayLoad, n: int, seed: int, trace: IndexedTrace | None) -> Schedule:
        if trace is None:
            raise ValueError("a replay schedule needs its trace")
        return _replay_schedule(trace, n)


def replay_offsets(entries: Sequence[tuple[int, T]]) -> Iterator[tuple[int, T]]:
    """The trace, looped for as long as the measurement lasts.

    Each pass is shifted by the trace's period: its last offset plus its mean gap, so the
    looped trace keeps its mean rate and the first request of a pass never lands on the last
    one of the previous pass. A one-entry trace repeats every max(offset, 1 s).
    """
    if not entries:
        raise ValueError("a replay needs at least one trace entry")
    first, last = entries[0][0], entries[-1][0]
    if len(entries) > 1:
        period = last + max(1, round((last - first) / (len(entries) - 1)))
    else:
        period = max(last, NS_PER_S)
    shift = 0
    while True:
        for offset, request_id in entries:
            yield offset + shift, request_id
        shift += period


def read_trace(path: Path | str, time_scale: float = 1.0) -> list[TraceEntry]:
    """Read a JSONL or CSV trace into (offset ns, id) pairs, sorted by offset.

    ``time_scale`` multiplies every offset: 2.0 replays the trace at half its rate, 0.5 at
    double. Out-of-order offsets are sorted (with a warning: a trace merged from several
    logs is often slightly out of order); negative or non-finite offsets are refused.
    """
    path = Path(path)
    if not time_scale > 0:
        raise ConfigError(f"trace {path}: time_scale must be positive, got {time_scale}")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"trace file {path} not found",
            hint="workload.load.trace is relative to the experiment file's folder",
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"trace file {path} cannot be read: {exc}", hint=_TRACE_HINT) from exc
    if path.suffix.lower() == ".csv" or (
        path.suffix.lower() not in (".jsonl", ".json", ".ndjson")
        and not text.lstrip().startswith("{")
    ):
        rows = _csv_rows(path, text)
    else:
        rows = _jsonl_rows(path, text)
    entries: list[tuple[int, int, str | None]] = []
    for line, seconds, request_id in rows:
        if not math.isfinite(seconds) or seconds < 0:
            raise ConfigError(
                f"{path}:{line}: offset {seconds!r} is negative or not a number", hint=_TRACE_HINT
            )
        entries.append((round(seconds * time_scale * NS_PER_S), line, request_id))
    if not entries:
        raise ConfigError(f"trace file {path} has no requests", hint=_TRACE_HINT)
    out_of_order = next(
        (b[1] for a, b in zip(entries, entries[1:], strict=False) if b[0] < a[0]), None
    )
    if out_of_order is not None:
        warnings.warn(
            f"{path}:{out_of_order}: offsets are not in order; the trace was sorted by offset",
            stacklevel=2,
        )
        entries.sort(key=lambda e: e[0])  # stable: equal offsets keep their file order
    return [(offset, request_id) for offset, _, request_id in entries]


def _jsonl_rows(path: Path, text: str) -> Iterator[tuple[int, float, str | None]]:
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{path}:{line}: not JSON ({exc.msg})", hint=_TRACE_HINT) from None
        if not isinstance(obj, dict):
            raise ConfigError(f"{path}:{line}: expected a JSON object", hint=_TRACE_HINT)
        seconds = _field(obj, _TIME_KEYS)
        if seconds is None:
            raise ConfigError(f"{path}:{line}: no 't' or 'offset_s' key", hint=_TRACE_HINT)
        request_id = _field(obj, _ID_KEYS)
        yield line, _seconds(path, line, seconds), None if request_id is None else str(request_id)


def _csv_rows(path: Path, text: str) -> Iterator[tuple[int, float, str | None]]:
    reader = csv.reader(text.splitlines())
    header = next(reader, None)
    if header is None:
        raise ConfigError(f"trace file {path} is empty", hint=_TRACE_HINT)
    names = [name.strip().lower() for name in header]
    time_col = next((names.index(k) for k in _TIME_KEYS if k in names), None)
    if time_col is None:
        raise ConfigError(
            f"{path}:1: the CSV header {header} has no 't' or 'offset_s' column", hint=_TRACE_HINT
        )
    id_col = next((names.index(k) for k in _ID_KEYS if k in names), None)
    for row in reader:
        line = reader.line_num
        if not row or all(not cell.strip() for cell in row):
            continue
        if len(row) != len(names):
            raise ConfigError(
                f"{path}:{line}: {len(row)} fields where the header has {len(names)}",
                hint=_TRACE_HINT,
            )
        request_id = row[id_col].strip() if id_col is not None else ""
        yield line, _seconds(path, line, row[time_col].strip()), request_id or None


def _field(obj: dict[str, object], keys: Sequence[str]) -> object | None:
    return next((obj[k] for k in keys if obj.get(k) is not None), None)


def _seconds(path: Path, line: int, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"{path}:{line}: offset {value!r} is not a number", hint=_TRACE_HINT)
    try:
        return float(value)
    except ValueError:
        raise ConfigError(
            f"{path}:{line}: offset {value!r} is not a number", hint=_TRACE_HINT
        ) from None


def indexed_trace(load: ReplayLoad, trace_dir: Path | None, n: int) -> list[tuple[int, int | None]]:
    """The replay's trace with each integer id turned into a request index (modulo ``n``)."""
    path = Path(load.trace)
    if not path.is_absolute() and trace_dir is not None:
        path = trace_dir / path
    trace: list[tuple[int, int | None]] = []
    for offset, request_id in read_trace(path, load.time_scale):
        if request_id is None:
            trace.append((offset, None))
            continue
        try:
            index = int(request_id)
        except ValueError:
            raise ConfigError(
                f"trace {path}: request id {request_id!r} is not an integer",
                hint="a trace id picks the request by index (modulo the number of "
                "requests); leave it out to send the requests round robin",
            ) from None
        trace.append((offset, index % n))
    return trace


def _replay_schedule(trace: IndexedTrace, n: int) -> Schedule:
    round_robin = itertools.cycle(range(n))
    for offset, index in replay_offsets(trace):
        yield offset, next(round_robin) if index is None else index
