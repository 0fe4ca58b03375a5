"""`optlab run STEP --paired N` end to end on the synthetic chain: A B A B, tagged, compared."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import Result

from optlab.metrics.stats import (
    REPEATED_CONFIDENCE,
    VERDICT_CONFIDENCE,
    beyond_noise,
    compare,
)
from optlab.store import Store, SweepResult
from tests.support.protocol import COMPARED, QUICK

Invoke = Callable[..., Result]


def test_paired_alternates_parent_and_step(synth: Path, invoke: Invoke, sqlite_url: str) -> None:
    """One real --paired run of two pairs (the comparison's figures are the next test's):
    A B A B measured, tagged, each step checked against the parent measured just before it."""
    assert invoke("run", str(synth / "baseline.yaml"), *QUICK).exit_code == 0
    result = invoke("run", str(synth / "01-faster-service.yaml"), *COMPARED, "--paired", "2")
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
    base = invoke("run", str(synth / "baseline.yaml"), *QUICK, "--paired", "2")
    assert base.exit_code == 2 and "is a baseline" in base.stderr
    both = invoke(
        "run", str(synth / "01-faster-service.yaml"), *QUICK, "--paired", "2", "--repeats", "2"
    )
    assert both.exit_code == 2 and "--paired and --repeats" in both.stderr
    assert invoke("log", "--json").stdout.strip() == ""


# A chain with a planted 4x gain and an A/A step: an M/D/1 queue behind 4 closed-loop clients
# (2 ms fixed service: 500/s), then 4 servers (2,000/s: each client served at once), then a
# change of seed, which a fixed service time never draws from.
_BASE = """name: pair-base
target: {kind: builtin, name: synthetic}
knobs: {distribution: fixed, service_ms: 2.0, servers: 1}
workload:
  load: {mode: closed, concurrency: 4}
protocol: {name: quick}
slo: {p99_ms: 50}
"""
_X4 = "name: pair-x4\nparent: pair-base\nchange: {servers: 4}\n"
_AA = "name: pair-aa\nparent: pair-x4\nchange: {seed: 1}\n"
RUN = (*COMPARED, "--allow-invalid")
# (capacity, its 95% interval) of each step under P99 <= 50 ms, closed loop: the queues' truth
# (500/s; 2,000/s twice), stored as finished sweeps of each step's config.
CAPACITIES = {
    "pair-base": (500.0, (485.0, 515.0)),
    "pair-x4": (2000.0, (1940.0, 2060.0)),
    "pair-aa": (2000.0, (1930.0, 2070.0)),
}


def _store_capacities(store: Store) -> None:
    for name, (capacity, interval) in CAPACITIES.items():
        run = store.list_runs(name)[-1]
        sweep_id = store.create_sweep(
            experiment=name,
            mode="closed",
            slo_percentile="p99",
            slo_ms=50.0,
            protocol=run.protocol,
            strategy={},
            environment_id=run.environment_id,
            code_identity=run.code_identity,
        )
        result = SweepResult(
            capacity_qps=capacity,
            capacity_interval=interval,
            limited_by="slo",
            message="stored by the test",
            method="test",
        )
        store.finish_sweep(sweep_id, status="FINISHED", result=result, measured_s=1.0)


def _gate(invoke: Invoke, head: str, *args: str) -> Result:
    result = invoke("check", head, *args)
    assert result.exit_code in (0, 3), result.output
    return result


def test_table_audit_check_and_capacity_agree_on_a_4x_gain_and_an_aa_step(
    tmp_path: Path, invoke: Invoke, sqlite_url: str
) -> None:
    for name, text in (("base", _BASE), ("x4", _X4), ("aa", _AA)):
        (tmp_path / f"{name}.yaml").write_text(text, encoding="utf-8")
    assert invoke("run", str(tmp_path / "base.yaml"), *RUN).exit_code == 0
    # Four pairs for the gain: a t interval on 3 log-ratios needs them within ~12% of each other
    # at the table's level (t = 17.3 on 2 df), which a busy 2-core machine does not promise.
    ran = invoke("run", str(tmp_path / "x4.yaml"), *RUN, "--paired", "4")
    assert ran.exit_code == 0, ran.output
    # Two pairs for the A/A step: a t interval on 1 log-ratio is wide, and nothing changed.
    ran = invoke("run", str(tmp_path / "aa.yaml"), *RUN, "--paired", "2")
    assert ran.exit_code == 0, ran.output
    with Store.open(sqlite_url) as store:
        _store_capacities(store)

    table = json.loads(invoke("table", "pair-aa", "--format", "json").stdout)
    base, x4, aa = table["chain"]
    assert table["confidence"] == VERDICT_CONFIDENCE
    for entry in (x4, aa):
        assert entry["step_method"].startswith("paired t on log-ratios")
        assert entry["step_confidence"] == pytest.approx(REPEATED_CONFIDENCE)
        for kind in ("step_delta", "cumulative_delta"):
            for metric in ("qps", "p50", "p99"):
                low = entry[kind][f"{metric}_low_pct"]
                # A ratio's interval never crosses -100%: expm1 of the log-ratio's low end, which a
                # paired t on 2 pairs (1 degree of freedom) can put so far down that the float is
                # exactly -100.0.
                assert -100 <= low <= entry[kind][f"{metric}_pct"], (kind, metric, entry[kind])
    # The planted gain: QPS x~4 (x3 to x4 on a busy machine) beyond noise, decided by QPS.
    assert x4["verdict"] == "gain" and "QPS" in x4["decided_by"], x4
    assert 150 < x4["step_delta"]["qps_pct"] < 400 and x4["step_delta"]["qps_low_pct"] > 0
    # Its parent is the baseline: the cumulative change is the same question, the same answer.
    assert x4["cumulative_delta"] == x4["step_delta"]
    # The A/A step: nothing changed.
    assert aa["verdict"] == "within noise" and aa["significant"] is False, aa
    # The verdict agrees with the intervals shown: a metric decides only beyond its interval.
    for entry in (x4, aa):
        beyond = [
            label
            for metric, label in (("qps", "QPS"), ("p50", "P50"), ("p99", "P99"))
            if beyond_noise(
                *(entry["step_delta"][f"{metric}{p}_pct"] for p in ("", "_low", "_high"))
            )
        ]
        assert set(entry["decided_by"]) <= set(beyond)
        assert entry["significant"] is bool(beyond)

    audit = json.loads(invoke("audit", "pair-aa", "--json").stdout)
    steps = {step["experiment"]: step for step in audit["steps"]}
    for entry in (base, x4, aa):
        step = steps[entry["experiment"]]
        assert (step["verdict"], step["decided_by"]) == (entry["verdict"], entry["decided_by"])
    assert audit["total_qps_pct"] == aa["cumulative_delta"]["qps_pct"]
    assert audit["total_qps_interval"] == [
        aa["cumulative_delta"]["qps_low_pct"],
        aa["cumulative_delta"]["qps_high_pct"],
    ]
    assert "QPS +" in steps["pair-x4"]["outcome"]

    # The gate: a gain of at least 10% that is beyond noise passes; the A/A step's does not.
    gained = _gate(invoke, "pair-x4", "--min-gain", "qps=10%")
    assert gained.exit_code == 0, gained.output
    shown = f"{x4['step_delta']['qps_pct']:+.1f}% better | yes | pass |"
    assert shown in gained.output
    assert _gate(invoke, "pair-x4", "--min-gain", "qps=10%", "--against", "baseline").exit_code == 0
    same = _gate(invoke, "pair-aa", "--min-gain", "qps=10%")
    assert same.exit_code == 3 and "no (within noise) | **FAIL** |" in same.output
    assert "paired t on log-ratios" in same.output  # which statistic the change is

    # Capacity: its own question, its own verdict, the same in the table, audit and gate.
    assert x4["capacity"]["verdict"] == "gain" and aa["capacity"]["verdict"] == "within noise"
    assert x4["capacity"]["loop"] == aa["capacity"]["loop"] == "closed"
    assert x4["capacity"]["step_delta"]["pct"] == pytest.approx(300.0)
    assert [steps[n]["capacity_verdict"] for n in CAPACITIES] == [None, "gain", "within noise"]
    assert audit["capacity_slo"] == "P99 ≤ 50 ms, closed loop"
    markdown = invoke("table", "pair-aa", "--format", "markdown").stdout
    rows = {line.split(" | ")[0].strip("| "): line for line in markdown.splitlines()}
    assert "gain (" in rows["pair-x4"] and "; capacity gain" in rows["pair-x4"]
    assert "within noise; capacity within noise" in rows["pair-aa"]
    capacity = _gate(invoke, "pair-x4", "--min-gain", "capacity=100%")
    assert capacity.exit_code == 0 and "(P99 ≤ 50 ms, closed loop)" in capacity.output
