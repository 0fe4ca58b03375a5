"""The library API for notebooks and scripts: results databases as pandas DataFrames.

Every function takes a database URL (None: `OPTLAB_DB`, else `sqlite:///.optlab/optlab.db`),
opens it read-only in spirit (nothing is written), and returns plain DataFrames:

    import optlab.api as api
    runs = api.runs("sqlite:///.optlab/optlab.db")
    table = api.chain_table("sqlite:///.optlab/optlab.db", "cpu-int8")
    series = api.timeseries("sqlite:///.optlab/optlab.db", run_id=3)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from optlab.reports.chain import resolve_head
from optlab.reports.table import stacked_table
from optlab.store import Store

if TYPE_CHECKING:
    import pandas as pd

    from optlab.store import RunRecord, Store

__all__ = [
    "chain_table",
    "diagnosis",
    "resources",
    "run_row",
    "runs",
    "stages",
    "sweep_levels",
    "sweeps",
    "timeseries",
]


@contextmanager
def _store(db_url: str | None) -> Iterator[Store]:
    store = Store.open(db_url or os.environ.get("OPTLAB_DB") or None)
    try:
        yield store
    finally:
        store.close()


def run_row(r: RunRecord) -> dict[str, Any]:
    """One run as a flat dict: what `runs()` tabulates and `optlab log --json` prints."""
    s = r.summary
    total = s.total if s is not None else None
    figures = (total.p50, total.p95, total.p99, total.p999, total.max) if total else (None,) * 5
    return {
        "run_id": r.id,
        "experiment": r.experiment,
        "status": r.status,
        "valid": r.valid,
        "provisional": r.provisional,
        "protocol": r.protocol_name,
        "duration_s": r.duration_s,
        "requests": r.requests,
        "errors": r.errors,
        "errors_by_type": dict(s.errors_by_type) if s is not None else {},
        "qps": r.qps,
        **dict(zip(("p50_ms", "p95_ms", "p99_ms", "p999_ms", "max_ms"), figures, strict=True)),
        "accuracy_top1": s.accuracy_top1 if s is not None else None,
        "reasons": list(r.reasons),
        "started_at": r.started_at,
        "finished_at": r.finished_at,
        "git_commit": r.git_commit,
        "hostname": r.hostname,
        "error": r.error_message,
    }


def runs(db_url: str | None = None, experiment: str | None = None) -> pd.DataFrame:
    """One row per run (oldest first): status, validity, protocol, headline figures, provenance."""
    import pandas as pd

    with _store(db_url) as store:
        records = store.list_runs(experiment)
    rows = []
    for record in records:
        row = run_row(record)
        row["reasons"] = "; ".join(row["reasons"])
        row["started_at"] = pd.Timestamp(row["started_at"])
        row["finished_at"] = pd.Timestamp(row["finished_at"]) if row["finished_at"] else pd.NaT
        rows.append(row)
    return pd.DataFrame(rows)


def chain_table(db_url: str | None = None, head: str | None = None) -> pd.DataFrame:
    """The stacked-gains table of `head`'s chain (default: the newest chain head), one row
    per step (`reports.stacked.COLUMNS`, the stage columns, the capacity columns where the
    chain was swept); `attrs` holds the header (head, protocol, environment, confidence,
    capacity_slo)."""
    with _store(db_url) as store:
        return stacked_table(store, resolve_head(store, head)).to_frame()


def timeseries(db_url: str | None, run_id: int, phase: str | None = "measure") -> pd.DataFrame:
    """Per-second windows of a run: completed, errors, QPS, P50, P99, send-lag P99."""
    import pandas as pd

    with _store(db_url) as store:
        store.get_run(run_id)  # NotFoundError for an unknown id, not an empty frame
        windows = store.get_windows(run_id, phase)
    return pd.DataFrame([asdict(w) for w in windows])


def resources(db_url: str | None, run_id: int, phase: str | None = None) -> pd.DataFrame:
    """Resource samples of a run, one row per second; GPU columns per GPU index when present."""
    import pandas as pd

    with _store(db_url) as store:
        store.get_run(run_id)
        samples = store.get_resource_samples(run_id, phase)
    rows = []
    for sample in samples:
        row = asdict(sample)
        gpus = row.pop("gpus") or []
        row.pop("cpu_per_core", None)
        for gpu in gpus:
            index = gpu.pop("index")
            row |= {f"gpu{index}_{key}": value for key, value in gpu.items()}
        rows.append(row)
    return pd.DataFrame(rows)


def stages(db_url: str | None, run_id: int, phase: str | None = "measure") -> pd.DataFrame:
    """Per-stage latency statistics of a run (the encoded histogram column included)."""
    import pandas as pd

    with _store(db_url) as store:
        store.get_run(run_id)
        rows = store.get_stage_stats(run_id, phase)
    return pd.DataFrame([asdict(r) for r in rows])


def sweeps(db_url: str | None = None, experiment: str | None = None) -> pd.DataFrame:
    """One row per sweep (oldest first): experiment, SLO, mode, status, capacity with its
    interval, knee, what limited it, levels and measured seconds."""
    import pandas as pd

    with _store(db_url) as store:
        found = store.list_sweeps(experiment)
    rows = []
    for s in found:
        result = s.result
        interval = (result.capacity_interval if result else None) or (None, None)
        rows.append(
            {
                "sweep_id": s.id,
                "experiment": s.experiment,
                "status": s.status,
                "mode": s.mode,
                "slo": s.slo.key,
                "capacity_qps": result.capacity_qps if result else None,
                "capacity_low": interval[0],
                "capacity_high": interval[1],
                "knee_qps": result.knee_qps if result else None,
                "limited_by": result.limited_by if result else None,
                "levels": len(s.levels),
                "measured_s": s.measured_s,
                "started_at": pd.Timestamp(s.started_at),
            }
        )
    return pd.DataFrame(rows)


def sweep_levels(db_url: str | None, sweep_id: int) -> pd.DataFrame:
    """The levels of a sweep in the order measured: what `optlab sweep --json` lists
    (docs/sweep-json.md), one row each."""
    import pandas as pd

    from optlab.reports.sweep import load_sweep, sweep_json

    with _store(db_url) as store:
        document = sweep_json(load_sweep(store, sweep_id))
    return pd.DataFrame(document["levels"])


def diagnosis(db_url: str | None = None, subject: str | int | None = None) -> dict[str, Any]:
    """`optlab diagnose SUBJECT --json`'s document (docs/diagnose-json.md): a run id, an
    experiment (its newest run), `sweep:ID`, or None (the newest run)."""
    from optlab.diagnose import diagnose_run
    from optlab.diagnose.subject import resolve

    with _store(db_url) as store:
        chosen = resolve(store, None if subject is None else str(subject))
        return diagnose_run(store, chosen.run_id, source=chosen.source).to_json()
