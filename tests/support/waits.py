"""Waiting on a condition, never on a fixed sleep a busy 2-core machine can outlast: each wait
polls for what the test needs, and its deadline only bounds a hang."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from tests.support.proc import Db, db_url

POLL_S = 0.1


def wait_until(predicate: Callable[[], object], what: str, timeout_s: float = 30) -> None:
    """Poll until `predicate()` is true; `what` names the condition in the hang's message."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still not true after {timeout_s:g} s")
        time.sleep(0.005)


# The phases a test waits for, each the query that finds a run id once it is reached:
# "running": the run's row is stored (RUNNING: its target is up, its warmup under way or next);
# "warmup" / "measure": a window of that phase is stored (windows reach the database in
# batches, every FLUSH_S of src/optlab/run/recorder.py, so both may appear at once).
_RUNNING = "select r.id from runs r where r.status = 'RUNNING'"
_WINDOW = (
    "select r.id from runs r join run_windows w on w.run_id = r.id "
    "where r.status = 'RUNNING' and w.phase = :phase"
)
_LEVEL = " and exists (select 1 from sweep_levels l where l.run_id = r.id and l.position = :level)"
PHASES = ("running", "warmup", "measure")


def _query(phase: str, level: int | None) -> str:
    if phase not in PHASES:
        raise ValueError(f"phase must be one of {PHASES}, not {phase!r}")
    query = _RUNNING if phase == "running" else _WINDOW
    if level is not None:
        query += _LEVEL
    return query + " order by r.id desc limit 1"


def find_phase(db: Db, phase: str, level: int | None = None) -> int | None:
    """The id of a RUNNING run that has reached `phase` (of sweep level `level`, when given),
    or None: not yet, no database yet, or the database not answering now."""
    url = db_url(db)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        return None  # connecting would create the file before the run does
    args = {"timeout": 5} if url.startswith("sqlite") else {"connect_timeout": 5}
    engine = create_engine(url, poolclass=NullPool, connect_args=args)
    try:
        with engine.connect() as connection:
            row = connection.execute(
                text(_query(phase, level)), {"phase": phase, "level": level}
            ).first()
    except SQLAlchemyError:  # tables not made yet, locked, or the server down for a moment
        return None
    finally:
        engine.dispose()
    return None if row is None else int(row[0])


def wait_for_phase(db: Db, phase: str, level: int | None = None, timeout_s: float = 120) -> int:
    """The id of the run a subprocess is measuring, once it reaches `phase` ("running",
    "warmup" or "measure"; of sweep level `level` when given), on SQLite or PostgreSQL. A `Path`
    is a SQLite file, a `str` a URL; the deadline only bounds a hang."""
    _query(phase, level)  # a misspelt phase fails now, not after the deadline
    deadline = time.monotonic() + timeout_s
    while True:
        run_id = find_phase(db, phase, level)
        if run_id is not None:
            return run_id
        if time.monotonic() > deadline:
            where = "" if level is None else f" at sweep level {level}"
            raise AssertionError(f"no run reached its {phase} phase{where} in {timeout_s:g} s")
        time.sleep(POLL_S)
