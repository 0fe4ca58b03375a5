"""The stacked-gains table: one row per step of a chain, baseline first, as a pandas DataFrame.

Computed here, rendered elsewhere (`reports.terminal`). Each step's row comes from its newest
FINISHED run measured under the same protocol as the head's run; runs under another protocol
are never stacked with it, and a step without such a run is a row that says why it is empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from optlab.errors import NotFoundError

if TYPE_CHECKING:
    import pandas as pd

    from optlab.store import RunRecord, Store

# The reference pipeline's stages, in request order; a user target's own stages follow them.
KNOWN_STAGES = ("queue", "preprocess", "infer", "postprocess")
HARNESS_SERIES = ("total", "send_lag", "start_lag")


@dataclass(frozen=True)
class ChainStep:
    experiment: str
    variable: str | None
    change: str | None
    run: RunRecord | None
    missing: str | None  # why no run is shown


def chain_names(store: Store, head: str) -> list[str]:
    """Experiment names from the baseline to `head`, following the stored parents."""
    names: list[str] = []
    current: str | None = head
    while current is not None:
        record = store.get_experiment(current)
        if record is None:
            raise NotFoundError(
                f"experiment {current!r} is not in the database {store.url}",
                hint="run it first (`optlab run FILE --chain`), or check --db",
            )
        if current in names:
            raise NotFoundError(f"experiment {current!r} is its own ancestor", hint="")
        names.append(current)
        current = record.parent
    return list(reversed(names))


def _finished(store: Store, name: str, config_hash: str | None) -> list[RunRecord]:
    runs = [
        r
        for r in store.list_runs(name)
        if r.status == "FINISHED" and r.summary and r.config_hash == config_hash
    ]
    return list(reversed(runs))  # newest first


def chain_steps(store: Store, head: str) -> list[ChainStep]:
    """The chain's steps, each with the run it is judged by (or why there is none)."""
    from optlab.plan import render_value

    names = chain_names(store, head)
    steps: list[ChainStep] = []
    head_runs = _finished(store, head, _config_hash(store, head))
    protocol = head_runs[0].protocol if head_runs else None
    for name in names:
        record = store.get_experiment(name)
        assert record is not None
        config = record.current_config
        runs = _finished(store, name, config.config_hash if config else None)
        if protocol is not None:
            runs = [r for r in runs if r.protocol == protocol]
        missing = None
        if not runs:
            missing = "no finished run"
            if protocol is not None:
                missing += " under the head's protocol"
        change = None
        if config is not None and config.change and config.variable:
            old = _knob(store, record.parent, config.variable)
            new = config.config.get("knobs", {}).get(config.variable)
            change = describe_change(old, new, render_value)
        variable = config.variable if config else None
        steps.append(ChainStep(name, variable, change, runs[0] if runs else None, missing))
    return steps


def describe_change(old: Any, new: Any, render: Any) -> str:
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


def _config_hash(store: Store, name: str) -> str | None:
    record = store.get_experiment(name)
    return record.current_config.config_hash if record and record.current_config else None


def _knob(store: Store, parent: str | None, variable: str) -> Any:
    record = store.get_experiment(parent) if parent else None
    if record is None or record.current_config is None:
        return None
    return record.current_config.config.get("knobs", {}).get(variable)


def _row(step: ChainStep) -> dict[str, Any]:
    row: dict[str, Any] = {
        "experiment": step.experiment,
        "variable": step.variable,
        "change": step.change,
        "run_id": None,
        "status": None,
        "valid": None,
        "provisional": None,
        "missing": step.missing,
    }
    run = step.run
    if run is None or run.summary is None:
        return row
    s = run.summary
    latency = s.get("latency_ms", {})
    total = latency.get("total", {})
    requests, errors = run.requests or 0, run.errors or 0
    row |= {
        "run_id": run.id,
        "status": run.status,
        "valid": run.valid,
        "provisional": run.provisional,
        "p50_ms": total.get("p50"),
        "p95_ms": total.get("p95"),
        "p99_ms": total.get("p99"),
        "p999_ms": total.get("p999"),
        "qps": run.qps,
        "error_rate": errors / (requests + errors) if requests + errors else None,
        "cpu_pct": (s.get("resources", {}).get("cpu_process_pct") or {}).get("mean"),
        "reasons": "; ".join(run.reasons),
    }
    for stage, stats in latency.items():
        if stage not in HARNESS_SERIES:
            row[f"{stage}_p50_ms"] = stats.get("p50")
    accuracy = s.get("accuracy") or {}
    row["accuracy_top1"] = accuracy.get("top1")
    found = s.get("target") or {}
    row["infer_ms_per_request"] = (found.get("infer") or {}).get("ms_per_request")
    row["mean_batch_size"] = (found.get("batching") or {}).get("mean_batch_size")
    row["cache_hit_rate"] = (found.get("cache") or {}).get("hit_rate")
    return row


def _change_pct(new: Any, old: Any) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return (float(new) - float(old)) / float(old) * 100.0


def stacked_table(store: Store, head: str) -> pd.DataFrame:
    """One row per step: the numbers, then each step's change against the previous row that
    has a run (step Δ) and against the baseline (cumulative Δ), in percent."""
    import pandas as pd

    rows = [_row(step) for step in chain_steps(store, head)]
    frame = pd.DataFrame(rows)
    stage_columns = sorted(
        (c for c in frame.columns if c.endswith("_p50_ms") and c != "p50_ms"),
        key=lambda c: (
            KNOWN_STAGES.index(c[: -len("_p50_ms")])
            if c[: -len("_p50_ms")] in KNOWN_STAGES
            else len(KNOWN_STAGES),
            c,
        ),
    )
    for metric in ("qps", "p50_ms", "p99_ms"):
        if metric not in frame:
            frame[metric] = None
        step, cumulative = [], []
        base = previous = None
        for value in frame[metric]:
            has = value is not None and not pd.isna(value)
            step.append(_change_pct(value, previous) if has else None)
            if has and base is None:
                base = value
            cumulative.append(_change_pct(value, base) if has else None)
            if has:
                previous = value
        name = metric.removesuffix("_ms")
        frame[f"{name}_step_pct"] = step
        frame[f"{name}_cumulative_pct"] = cumulative
    leading = [c for c in frame.columns if c not in stage_columns]
    return frame[leading + stage_columns]
