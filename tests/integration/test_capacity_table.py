"""Capacity under an SLO as a column of the stacked table, the gate, the audit and the report.

The chain is the session's measured synthetic chain (`synthetic_chain`); its sweeps are stored
through the store's own sweep lifecycle (create, a level, finish) with known capacities, so the
figures the reports must show are known exactly. Each sweep's level is a real run of its step.
A real `optlab sweep` of the chain is the slow test at the end.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from statistics import NormalDist
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner, Result

from optlab.cli.main import cli
from optlab.reports.capacity import Capacity, capacity_verdict, change
from optlab.reports.export import render_json
from optlab.reports.table import stacked_table
from optlab.reports.terminal import render_text, table_columns
from optlab.store import Store, SweepResult
from tests.support.db import checkpoint
from tests.support.paths import REPO

BASE, HEAD = "synthetic-baseline", "synthetic-faster-service"
HEAD_FILE = "01-faster-service.yaml"
# (experiment, SLO ms, capacity, interval, knee), stored in this order: the head's newest
# sweep is under P99 <= 20 ms, the table's default SLO.
SWEEPS = (
    (BASE, 20.0, 1000.0, (950.0, 1050.0), 800.0),
    (BASE, 50.0, 1400.0, (1300.0, 1500.0), 900.0),
    (HEAD, 30.0, 1700.0, (1600.0, 1800.0), 1400.0),
    (HEAD, 20.0, 1900.0, (1820.0, 1980.0), 1500.0),
)
SCHEMA = json.loads((REPO / "docs" / "schemas" / "table.schema.json").read_text("utf-8"))


def _cli(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--db", url, *args], catch_exceptions=False)


def _store_sweep(
    store: Store,
    experiment: str,
    slo_ms: float,
    capacity: float,
    interval: tuple[float, float],
    knee: float,
    level_run: int,
    protocol: dict[str, Any] | None = None,
    mode: str = "closed",
) -> int:
    run = store.get_run(level_run)
    sweep_id = store.create_sweep(
        experiment=experiment,
        mode=mode,
        slo_percentile="p99",
        slo_ms=slo_ms,
        protocol=protocol or run.protocol,
        strategy={},
        environment_id=run.environment_id,
        code_identity=run.code_identity,
    )
    store.add_sweep_level(sweep_id, 0, run.id, mode, 4.0, "one client")
    result = SweepResult(
        capacity_qps=capacity,
        capacity_interval=interval,
        knee_qps=knee,
        limited_by="slo",
        message=f"capacity {capacity:g}/s",
        method="stored by the test",
    )
    store.finish_sweep(sweep_id, status="FINISHED", result=result, measured_s=1.0)
    return sweep_id


@pytest.fixture(scope="module")
def swept(
    synthetic_chain: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """The session's chain with the sweeps of SWEEPS: (its folder, its database)."""
    folder, database = synthetic_chain
    root = tmp_path_factory.mktemp("capacity")
    copy = root / "chain.db"
    shutil.copy(database, copy)
    url = f"sqlite:///{copy}"
    # One more short run of each step: the sweeps' levels (a level leaves the run lists, so
    # the table's runs stay the session's).
    ran = _cli(url, "run", str(folder / HEAD_FILE), "--quick", "--duration", "1", "--warmup",
               "0.3", "--chain")  # fmt: skip
    assert ran.exit_code == 0, ran.output
    with Store.open(url) as store:
        newest = {name: store.list_runs(name)[-1].id for name in (BASE, HEAD)}
        for experiment, slo_ms, capacity, interval, knee in SWEEPS:
            _store_sweep(store, experiment, slo_ms, capacity, interval, knee, newest[experiment])
    checkpoint(copy)
    return folder, copy


def _url(database: Path) -> str:
    return f"sqlite:///{database}"


def _table_json(database: Path, *args: str) -> dict[str, Any]:
    result = _cli(_url(database), "table", HEAD, "--format", "json", *args)
    assert result.exit_code == 0, result.output
    document: dict[str, Any] = json.loads(result.stdout)
    jsonschema.validate(document, SCHEMA)
    return document


def test_change_is_a_z_test_on_the_log_ratio() -> None:
    before = Capacity(100.0, (90.0, 110.0))  # se = 10 / 1.96
    close, far = Capacity(110.0, (100.0, 120.0)), Capacity(200.0, (190.0, 210.0))
    near = change(before, close, 0.95)
    assert near is not None and near.pct == pytest.approx(10.0)
    assert near.significant is False and near.low_pct is not None and near.low_pct < 0
    # The delta method: se(ln c) = se / c; the interval exp(ln(a/b) -+ z se) - 1.
    z = NormalDist().inv_cdf(0.975)
    se = math.hypot(10 / z / 100, 10 / z / 110)
    assert near.low_pct == pytest.approx(math.expm1(math.log(1.1) - z * se) * 100)
    assert near.high_pct == pytest.approx(math.expm1(math.log(1.1) + z * se) * 100)
    wide = change(before, far, 0.999)
    assert wide is not None and wide.significant is True and wide.low_pct is not None
    assert wide.low_pct > 0  # the interval excludes zero exactly when the test passes
    unjudged = change(before, Capacity(150.0), 0.999)
    assert unjudged is not None and unjudged.significant is None and unjudged.low_pct is None
    assert change(Capacity(None), far, 0.999) is None
    # A capacity that collapsed, from a sweep with a wide interval: never below -100%.
    collapsed = change(Capacity(100.0, (10.0, 190.0)), Capacity(5.0, (1.0, 9.0)), 0.999)
    assert collapsed is not None and collapsed.low_pct is not None
    assert -100 < collapsed.low_pct < collapsed.pct < 0
    assert [capacity_verdict(c) for c in (near, wide, unjudged, None)] == [
        "within noise",
        "gain",
        "not judged",
        None,
    ]


def test_a_table_without_sweeps_has_no_capacity(synthetic_chain: tuple[Path, Path]) -> None:
    _, database = synthetic_chain
    with Store.open(_url(database), read_only=True) as store:
        table = stacked_table(store, HEAD)
    assert table.header.capacity is None and all(row.capacity is None for row in table.rows)
    assert not [c for c in table.to_frame().columns if c.startswith("capacity")]
    assert all("capacity" not in entry for entry in json.loads(render_json(table))["chain"])


def test_json_has_capacity_and_its_change(swept: tuple[Path, Path]) -> None:
    chain = _table_json(swept[1])["chain"]
    base, head = chain[0]["capacity"], chain[1]["capacity"]
    assert base["qps"] == 1000.0 and base["interval"] == [950.0, 1050.0]
    assert base["slo"] == {"percentile": "p99", "ms": 20.0} and base["reason"] is None
    assert base["step_delta"]["pct"] is None
    assert head["qps"] == 1900.0 and head["knee_qps"] == 1500.0 and head["reason"] is None
    assert head["step_delta"]["pct"] == pytest.approx(90.0)
    assert head["cumulative_delta"]["pct"] == pytest.approx(90.0)
    assert 0 < head["step_delta"]["low_pct"] < 90.0 < head["step_delta"]["high_pct"]
    assert head["significant"] is True and head["cumulative_significant"] is True
    assert head["verdict"] == "gain" and base["verdict"] is None
    assert head["loop"] == base["loop"] == "closed"
    assert head["sweep_id"] > base["sweep_id"]
    assert chain[1]["run_id"] is not None  # the sweeps' levels left the table's runs alone


def test_markdown_and_terminal_show_the_column(swept: tuple[Path, Path]) -> None:
    folder, database = swept
    markdown = _cli(_url(database), "table", HEAD, "--format", "markdown").stdout
    assert "| capacity @ P99 ≤ 20 ms, closed loop | Δ step | Δ cum |" in markdown
    assert "from each step's newest comparable closed-loop sweep" in markdown
    head_row = next(line for line in markdown.splitlines() if line.startswith(f"| {HEAD}"))
    assert "1,900.0 [1,820.0, 1,980.0]" in head_row and "+90% [" in head_row and "✓" in head_row
    # Capacity's verdict is its own, labelled, beside the runs' verdict.
    assert "; capacity gain" in head_row.split("|")[-2]
    piped = _cli(_url(database), "table", HEAD).stdout  # not a terminal: every column
    assert "1,900.0 [1,820.0,1,980.0]" in piped and "P99 ≤ 20 ms" in piped
    assert "closed loop" in piped and "capacity gain" in piped
    with Store.open(_url(database), read_only=True) as store:
        table = stacked_table(store, HEAD)
    fitted = render_text(table, width=200, fit_to=True)
    assert "capacity @" in fitted.splitlines()[0] + fitted.splitlines()[1]
    assert "capacity @ P99 ≤ 20 ms, closed loop: 1,900.0 [1,820.0, 1,980.0]/s" in fitted
    # The fitted verdict cell holds capacity's own verdict (wrapped where the runs' verdict
    # is long, so read from the cell, not from the lines).
    verdict = next(c for c in table_columns(table, compact=True) if c.key == "verdict")
    assert verdict.cells[1].endswith("capacity gain"), verdict.cells
    narrow = render_text(table, width=80, fit_to=True)
    assert max(len(line) for line in narrow.splitlines()) <= 80
    assert "capacity @ P99 ≤ 20 ms, closed loop: 1,000.0 [950.0, 1,050.0]/s" in narrow


def test_a_step_without_a_sweep_under_the_slo_says_why(swept: tuple[Path, Path]) -> None:
    chain = _table_json(swept[1], "--slo", "p99=50ms")["chain"]
    assert chain[0]["capacity"]["qps"] == 1400.0
    head = chain[1]["capacity"]
    assert head["qps"] is None and head["step_delta"]["pct"] is None
    assert head["reason"].startswith("swept under P99 ≤ 20 ms, P99 ≤ 30 ms, not under P99 ≤ 50")
    assert (
        f"optlab sweep {swept[0] / HEAD_FILE} --slo p99=50ms --mode closed --quick"
        in head["reason"]
    )
    parentless = _table_json(swept[1], "--slo", "p99=30ms")["chain"]
    assert parentless[0]["capacity"]["qps"] is None
    assert parentless[1]["capacity"]["qps"] == 1700.0
    assert "parent synthetic-baseline has no capacity" in parentless[1]["capacity"]["reason"]
    markdown = _cli(_url(swept[1]), "table", HEAD, "--format", "markdown", "--slo", "p99=30ms")
    assert f"{BASE}: capacity: swept under P99 ≤ 20 ms, P99 ≤ 50 ms, not under" in markdown.stdout


def test_another_slo_with_no_sweep_at_all(swept: tuple[Path, Path]) -> None:
    chain = _table_json(swept[1], "--slo", "p99.9=70ms")["chain"]
    for entry in chain:
        assert entry["capacity"]["qps"] is None
        assert "not under P99.9 ≤ 70 ms" in entry["capacity"]["reason"]


def test_a_sweep_under_another_protocol_is_not_stacked(
    swept: tuple[Path, Path], tmp_path: Path
) -> None:
    database = tmp_path / "other.db"
    shutil.copy(swept[1], database)
    with Store.open(_url(database)) as store:
        run = store.list_runs(HEAD, levels=True)[-1]
        protocol = {**run.protocol, "duration_s": 9.0}
        _store_sweep(store, HEAD, 20.0, 2500.0, (2400.0, 2600.0), 2000.0, run.id, protocol)
    chain = _table_json(database)["chain"]
    assert chain[1]["capacity"]["qps"] == 2500.0  # the head's newest sets the protocol
    assert chain[0]["capacity"]["qps"] is None
    assert chain[0]["capacity"]["reason"].startswith("swept under another protocol")


def test_an_open_loop_capacity_is_not_stacked_on_a_closed_one(
    swept: tuple[Path, Path], tmp_path: Path
) -> None:
    database = tmp_path / "open.db"
    shutil.copy(swept[1], database)
    with Store.open(_url(database)) as store:
        run = store.list_runs(HEAD, levels=True)[-1]
        _store_sweep(store, HEAD, 20.0, 2500.0, (2400.0, 2600.0), 2000.0, run.id, mode="open")
    chain = _table_json(database)["chain"]
    assert chain[1]["capacity"]["qps"] == 2500.0  # the head's newest sets the loop
    assert chain[0]["capacity"]["qps"] is None
    assert chain[0]["capacity"]["reason"].startswith("swept only with a closed loop")


def test_check_gates_on_capacity_against_the_baseline(swept: tuple[Path, Path]) -> None:
    url = _url(swept[1])
    passed = _cli(url, "check", HEAD, "--min-gain", "capacity=50%")
    assert passed.exit_code == 0, passed.output
    assert (
        "| capacity | gain ≥ 50% vs `synthetic-baseline` (P99 ≤ 20 ms, closed loop)"
        in passed.output
    )
    assert "| 1,000.00 | 1,900.00 | +90.0% better | yes | pass |" in passed.output
    failed = _cli(
        url, "check", HEAD, "--min-gain", "capacity=100%", "--max-regression", "p99=1000%"
    )
    assert failed.exit_code == 3, failed.output
    assert "**FAIL**" in failed.output
    unswept = _cli(url, "check", HEAD, "--min-gain", "capacity=10%", "--slo", "p99=50ms")
    assert unswept.exit_code == 2
    assert "no comparable sweeps under P99 ≤ 50 ms" in unswept.output
    assert f"{HEAD}: swept under P99 ≤ 20 ms" in unswept.output


def test_audit_names_the_step_that_bought_the_headroom(swept: tuple[Path, Path]) -> None:
    result = _cli(_url(swept[1]), "audit", HEAD)
    assert result.exit_code == 0, result.output
    assert f"most headroom bought by {HEAD}: +900.0 requests/s (+90%, beyond noise)" in (
        result.output
    )
    assert "  capacity: 1,900.0 [1,820.0, 1,980.0]/s, Δ step +90% [" in result.output
    assert "(capacity gain: beyond noise at 99.9%)" in result.output
    assert "capacity under P99 ≤ 20 ms, closed loop: chain total +90.0%" in result.output
    document = json.loads(_cli(_url(swept[1]), "audit", HEAD, "--json").stdout)
    assert document["capacity_slo"] == "P99 ≤ 20 ms, closed loop"
    assert document["capacity_loop"] == "closed"
    assert [s["capacity_verdict"] for s in document["steps"]] == [None, "gain"]
    assert [s["capacity_qps"] for s in document["steps"]] == [1000.0, 1900.0]


def test_html_draws_latency_against_throughput(swept: tuple[Path, Path]) -> None:
    page = _cli(_url(swept[1]), "table", HEAD, "--format", "html").stdout
    assert "<h2>Capacity under P99 ≤ 20 ms</h2>" in page
    chart = page[page.index("Latency against throughput") :]
    chart = chart[: chart.index("</svg>")]
    assert 'class="slo"' in chart and "SLO P99 ≤ 20 ms" in chart
    assert chart.count('class="capacity"') == 2 and chart.count('class="knee"') == 2
    assert f"{HEAD} (sweep " in chart
    assert "capacity/s @ P99 ≤ 20 ms" in page  # the table's column
    assert "<script" not in page.lower()


def test_a_real_sweep_of_the_chain_reaches_the_table(tmp_path: Path) -> None:
    """`optlab sweep --chain` then `optlab table`: each step has a capacity or says why (a
    closed loop: an open one's levels are judged by the load generator's lag, which a busy
    shared machine makes flaky)."""
    folder = tmp_path / "synthetic"
    folder.mkdir()
    knobs = "{distribution: fixed, service_ms: 2.0, single_server: true}"
    (folder / "baseline.yaml").write_text(
        "name: swept-base\ntarget: {kind: builtin, name: synthetic}\n"
        f"knobs: {knobs}\nworkload:\n  load: {{mode: open, rate: 100}}\n"
        "protocol: {name: quick}\n",
        encoding="utf-8",
    )
    (folder / "step.yaml").write_text(
        "name: swept-step\nparent: swept-base\nchange:\n  service_ms: 1.0\n", encoding="utf-8"
    )
    url = _url(tmp_path / "sweep.db")
    result = _cli(url, "sweep", str(folder / "step.yaml"), "--chain", "--slo", "p99=20ms",
                  "--mode", "closed", "--quick", "--level-duration", "1",
                  "--budget-s", "20")  # fmt: skip
    assert result.exit_code == 0, result.output
    table = _cli(url, "table", "swept-step", "--format", "json")
    assert table.exit_code == 0, table.output
    document = json.loads(table.stdout)
    jsonschema.validate(document, SCHEMA)
    for entry in document["chain"]:
        capacity = entry["capacity"]
        assert capacity["slo"] == {"percentile": "p99", "ms": 20.0}
        assert capacity["sweep_id"] is not None
        assert capacity["qps"] is not None or capacity["reason"]


def test_sweeps_list_keeps_its_columns_apart_with_a_long_interval(
    swept: tuple[Path, Path], tmp_path: Path
) -> None:
    """`optlab sweeps` once printed `14,904.0]saturation`: each column is as wide as its
    widest cell, two spaces apart."""
    database = tmp_path / "long.db"
    shutil.copy(swept[1], database)
    with Store.open(_url(database)) as store:
        run = store.list_runs(HEAD, levels=True)[-1]
        sweep_id = _store_sweep(store, HEAD, 20.0, 14_904.0, (14_100.5, 15_210.3), 9_000.0, run.id)
    result = _cli(_url(database), "sweeps")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    header, row = lines[0], next(line for line in lines if line.lstrip().startswith(str(sweep_id)))
    assert "[14,100.5, 15,210.3]  slo" in row
    # Every column starts where its header does (right-aligned ones end there).
    for name in ("experiment", "status", "mode", "SLO", "interval", "limited by"):
        start = header.index(name)
        assert row[start - 2 : start] == "  " and row[start] != " ", name
    for name in ("capacity/s", "levels"):
        end = header.index(name) + len(name)
        assert row[end - 1] != " " and row[end : end + 2] in ("  ", ""), name
    assert "14,904.0" in row and f"{HEAD}" in row
