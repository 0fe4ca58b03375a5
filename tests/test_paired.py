"""`optlab run STEP --paired N` end to end on the synthetic chain: A B A B, tagged, compared."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from optlab.metrics.stats import compare
from optlab.store import Store

Invoke = Callable[..., Result]
FAST = ("--quick", "--duration", "1.5", "--warmup", "0.3")


@pytest.mark.slow
def test_paired_alternates_parent_and_step(synth: Path, invoke: Invoke, sqlite_url: str) -> None:
    assert invoke("run", str(synth / "baseline.yaml"), *FAST).exit_code == 0
    result = invoke("run", str(synth / "01-faster-service.yaml"), *FAST, "--paired", "2")
    assert result.exit_code == 0, result.output
    store = Store.open(sqlite_url)
    runs = store.list_runs()[1:]  # after the baseline's own first run
    assert [r.experiment for r in runs] == ["synthetic-baseline", "synthetic-faster-service"] * 2
    assert all(r.status == "FINISHED" for r in runs)
    tags = [r.summary.paired for r in runs if r.summary is not None and r.summary.paired]
    assert len(tags) == len(runs)
    assert len({t.session for t in tags}) == 1 and len(tags[0].session) == 32
    assert [(t.index, t.role) for t in tags] == [
        (0, "parent"),
        (0, "step"),
        (1, "parent"),
        (1, "step"),
    ]
    # Each step run is checked against the parent run measured just before it.
    for parent_run, step_run in zip(runs[::2], runs[1::2], strict=True):
        parent = step_run.summary.parent if step_run.summary is not None else None
        assert parent is not None and parent.run_id == parent_run.id
    first = store.list_runs()[0].summary
    assert first is not None and first.paired is None

    # What the table does with them: paired differences of the per-second P50.
    def p50(run_id: int) -> list[float]:
        return [w.p50_ms for w in store.get_windows(run_id, "measure") if w.p50_ms is not None]

    def total_p50(run: object) -> float:
        return float(run.summary.total.p50)  # type: ignore[attr-defined]

    step = compare(
        "p50",
        [p50(r.id) for r in runs[::2]],
        [p50(r.id) for r in runs[1::2]],
        parent_estimates=[total_p50(r) for r in runs[::2]],
        child_estimates=[total_p50(r) for r in runs[1::2]],
        higher_is_better=False,
        paired=True,
    )
    assert step.delta_pct < -25  # 2 ms -> 1 ms median service time


def test_paired_refusals(synth: Path, invoke: Invoke) -> None:
    base = invoke("run", str(synth / "baseline.yaml"), *FAST, "--paired", "2")
    assert base.exit_code == 2 and "is a baseline" in base.stderr
    both = invoke(
        "run", str(synth / "01-faster-service.yaml"), *FAST, "--paired", "2", "--repeats", "2"
    )
    assert both.exit_code == 2 and "--paired and --repeats" in both.stderr
    assert invoke("log", "--json").stdout.strip() == ""
