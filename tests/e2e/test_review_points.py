"""Issue 12, point 5: the reviewer's small things, each pinned by a test.

a. a verdict names the metric that decided it, the table shows that metric, and a metric whose
   interval spans zero never decides; b. no audit shares of a total that is noise; c. `check`
   defaults to the newest head; d. an INVALID measured run exits 4; e. `run --json` prints one
   line per run; f. the live line shows errors and timeouts; g. the HTML report charts the
   service's CPU and RSS over time.
"""

from __future__ import annotations

import io
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from click.testing import Result

from optlab.metrics.stats import Comparison
from optlab.reports.stacked import StackedTable
from optlab.store import Store
from tests.support.chain import STEPS, MeasuredChain
from tests.support.files import write
from tests.support.frames import golden_table, header, measured_row, report_data

Invoke = Callable[..., Result]
SHORT = ("--quick", "--duration", "1.5", "--warmup", "0.3")


@pytest.fixture
def chain(chain_copy: MeasuredChain) -> Path:
    """The session's measured chain (tests/support/chain.py) in this test's own copy of the
    database at `sqlite_url`: baseline (2 ms) -> faster (1 ms) -> {slower (4 ms), back (2 ms
    again)}; `back`, a step whose total is about nothing, is the newest head."""
    return chain_copy.folder


# -- a. the verdict names what decided it; an interval that spans zero decides nothing ---------


def _comparison(
    metric: str, delta: float, low: float, high: float, better: bool | None
) -> Comparison:
    return Comparison(metric, delta, low, high, better is not None, better, "test")


def test_verdict_names_the_deciding_metric_and_an_interval_across_zero_decides_nothing() -> None:
    from optlab.reports.table import step_verdict

    # The reviewer's step: QPS within noise, P99 worse but within noise, P50 better beyond it.
    qps = _comparison("QPS", 2.0, -3.0, 7.0, None)
    p99 = _comparison("P99", 8.0, -2.0, 18.0, None)
    p50 = _comparison("P50", -12.0, -15.0, -9.0, True)
    assert step_verdict([qps, p50, p99]) == ("gain", ["P50"], [])
    # A comparison that calls itself significant while its interval spans zero: never a gain.
    claimed = _comparison("P50", -12.0, -15.0, 3.0, True)
    assert step_verdict([qps, claimed, p99]) == ("within noise", [], [])
    # Nor a regression.
    worse = _comparison("P99", 8.0, -2.0, 18.0, False)
    assert step_verdict([qps, p50, worse])[:2] == ("gain", ["P50"])
    # A trade-off regresses, named by the metric that got worse, and is flagged.
    broke = _comparison("P99", 30.0, 20.0, 40.0, False)
    verdict, decided, flags = step_verdict([qps, p50, broke])
    assert (verdict, decided) == ("regressed", ["P99"])
    assert flags == ["optimised P50 (-12%), broke P99 (+30%)"]


def _reviewed_table() -> StackedTable:
    """The reviewer's case: gain decided by P50, with QPS across zero and P99 worse."""
    table = golden_table()
    rows = (
        table.rows[0],
        measured_row(
            2, 3.5, 9.7, 1020.0, experiment="pooled", variable="preprocess",
            change="python -> numpy-pooled", qps_step_pct=2.0, qps_step_low_pct=-3.0,
            qps_step_high_pct=7.0, qps_cumulative_pct=2.0, p50_step_pct=-12.0,
            p50_step_low_pct=-15.0, p50_step_high_pct=-9.0, p50_cumulative_pct=-12.0,
            p99_step_pct=8.0, p99_step_low_pct=-2.0, p99_step_high_pct=18.0,
            p99_cumulative_pct=8.0, significant=True, verdict="gain", decided_by=["P50"],
        ),
    )  # fmt: skip
    return StackedTable(header=header(head="pooled"), rows=rows)


def test_every_table_shows_the_deciding_metric() -> None:
    from optlab.reports.export import render_csv
    from optlab.reports.markdown import render_markdown
    from optlab.reports.terminal import render_text

    table = _reviewed_table()
    rich = render_text(table, width=320)
    assert "gain (P50 -12%)" in rich
    assert "-12% [-15,-9]" in rich  # the P50 step change, with its interval
    markdown = render_markdown(table)
    assert "gain (P50 -12%)" in markdown
    header = next(line for line in markdown.splitlines() if line.startswith("| step"))
    assert "| P50 ms | Δ step | P99 ms |" in header
    assert "| 3.50 | -12.0% [-15, -9] | 9.70 |" in markdown
    back = pd.read_csv(io.StringIO(render_csv(table)))
    assert back.loc[1, "decided_by"] == "P50" and back.loc[1, "p50_step_pct"] == -12.0


def test_the_measured_chain_names_its_deciders(chain: Path, sqlite_url: str) -> None:
    from optlab.reports.table import stacked_table

    table = stacked_table(Store.open(sqlite_url), "synthetic-back")
    faster = table.rows[1]
    assert faster.verdict == "gain" and faster.decided_by  # 2 ms -> 1 ms
    for row in table.rows:
        assert bool(row.decided_by) == (row.verdict in ("gain", "regressed"))
        for label in row.decided_by:
            low = row.get(f"{label.lower()}_step_low_pct")
            high = row.get(f"{label.lower()}_step_high_pct")
            assert not low <= 0 <= high, (label, low, high)


# -- b. no shares of a total that is noise --------------------------------------------------


def _audit_table(last_qps: float, cumulative: float, low: float, high: float) -> StackedTable:
    rows = (
        measured_row(1, 2.0, 4.0, 1000.0, experiment="synthetic-baseline", verdict="baseline"),
        measured_row(
            2, 1.0, 2.0, 1500.0, experiment="synthetic-faster-service", variable="service_ms",
            change="2.0 -> 1.0", qps_step_pct=50.0, qps_step_low_pct=45.0,
            qps_step_high_pct=55.0, qps_cumulative_pct=50.0, verdict="gain",
        ),
        measured_row(
            3, 2.0, 4.0, last_qps, experiment="synthetic-back", variable="service_ms",
            change="1.0 -> 2.0", qps_step_pct=(last_qps / 1500 - 1) * 100,
            qps_step_low_pct=-36.0, qps_step_high_pct=-30.0, qps_cumulative_pct=cumulative,
            qps_cumulative_low_pct=low, qps_cumulative_high_pct=high, p99_cumulative_pct=0.2,
            p99_cumulative_low_pct=-3.0, p99_cumulative_high_pct=3.4, verdict="regressed",
        ),
    )  # fmt: skip
    head = header(head="synthetic-back", protocol_label="quick", confidence=0.999)
    return StackedTable(header=head, rows=rows)


@pytest.mark.parametrize(
    ("last_qps", "cumulative", "low", "high", "noise"),
    [
        (1003.0, 0.3, -2.1, 2.7, True),  # the interval spans zero
        (1005.0, 0.5, 0.2, 0.8, True),  # beyond noise, but under 1%
        (1100.0, 10.0, 8.0, 12.0, False),  # a real total: shared out
    ],
)
def test_audit_gives_no_shares_of_a_total_within_noise(
    chain: Path, sqlite_url: str, last_qps: float, cumulative: float, low: float, high: float,
    noise: bool,
) -> None:  # fmt: skip
    from optlab.reports.audit import build_audit, render_audit

    audit = build_audit(Store.open(sqlite_url), _audit_table(last_qps, cumulative, low, high))
    text = render_audit(audit)
    shares = [s.qps_share_pct for s in audit.steps[1:]]
    if noise:
        assert shares == [None, None]  # before: 16667% and -16567% (or 10000% and -9900%)
        assert "share of the total QPS gain" not in text
        assert "note: the chain's total QPS change" in text and "within noise" in text
        assert audit.total_qps_interval == [low, high]
    else:
        assert sum(shares) == pytest.approx(100.0)  # type: ignore[arg-type]
        assert "share of the total QPS gain: 500%" in text
    # The P99 total (+0.2%, interval across zero) is noise in every case.
    assert all(s.p99_share_pct is None for s in audit.steps)
    assert "share of the total P99 change" not in text
    assert "note: the chain's total P99 change +0.2% [-3.0, +3.4] is within noise" in text


def test_audit_of_a_measured_chain_shares_only_a_total_beyond_noise(
    chain: Path, invoke: Invoke
) -> None:
    data = json.loads(invoke("audit", "synthetic-back", "--json").stdout)
    low, high = data["total_qps_interval"]
    beyond = not low <= 0 <= high and abs(data["total_qps_pct"]) >= 1.0
    shares = [s["qps_share_pct"] for s in data["steps"][1:]]
    assert all(s is not None for s in shares) if beyond else all(s is None for s in shares)
    assert any("QPS" in n for n in data["notes"]) != beyond
    text = invoke("audit", "synthetic-back").stdout
    assert "outcome: gain, decided by" in text  # the faster step


# -- c. check defaults to the newest head ----------------------------------------------------


def test_check_defaults_to_the_newest_head(chain: Path, invoke: Invoke) -> None:
    result = invoke("check", "--max-regression", "p50=1000%")  # before: exit 2, HEAD missing
    assert result.exit_code == 0, result.output
    assert "`synthetic-back` against `synthetic-faster-service`" in result.stdout
    table = invoke("table", "--format", "json")
    assert json.loads(table.stdout)["head"] == "synthetic-back"  # the same head as `table`


# -- d. an INVALID measured run exits 4 -----------------------------------------------------


def test_an_invalid_measured_run_exits_4_unless_allowed(
    tmp_path: Path, invoke: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = write(
        tmp_path,
        "errors.yaml",
        "name: errors\ntarget: {kind: builtin, name: synthetic}\n"
        "knobs: {distribution: fixed, service_ms: 1.0, error_rate: 0.5}\n"
        "workload: {load: {mode: closed, concurrency: 2}}\n",
    )
    result = invoke("run", str(path), *SHORT, "--json")
    assert result.exit_code == 4, result.output  # before: 0
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["status"] == "FINISHED" and summary["valid"] is False
    assert f"run {summary['run_id']} errors: INVALID" in result.stderr
    assert "--allow-invalid" in result.stderr
    allowed = invoke("run", str(path), *SHORT, "--allow-invalid")
    assert allowed.exit_code == 0, allowed.output
    assert "FINISHED INVALID" in allowed.output
    from optlab.cli.runs import run

    assert "4 measured and stored but INVALID" in " ".join((run.help or "").split())


# -- e. run --json prints one line per run measured ------------------------------------------


def test_run_json_prints_one_line_per_run_in_order(measured_chain: MeasuredChain) -> None:
    """The session's chain was measured by three `run --json` commands, the first with
    `--chain` (baseline and faster): four lines, the chain run's two among them."""
    lines = list(measured_chain.lines)
    assert [s["experiment"] for s in lines] == list(STEPS)  # before: the head's line alone
    assert [s["run_id"] for s in lines] == sorted(s["run_id"] for s in lines)
    assert all(s["status"] == "FINISHED" for s in lines)


# -- f. the live line shows errors and timeouts ---------------------------------------------

SLOW_TARGET = "import time\n\ndef build(knobs):\n    return lambda request: time.sleep(0.4)\n"


def test_live_line_shows_errors_and_timeouts(tmp_path: Path, sqlite_url: str) -> None:
    from optlab.cli.runs import status_line
    from optlab.run.measurement import LiveStatus
    from optlab.run.runner import RunOptions, run

    line = status_line(LiveStatus("x", "measure", 3.0, 5.0, 0.0, None, None, 5.0, None, 12, 12))
    assert "QPS 0.0  P50 - ms  P99 - ms  err 12 (timeout 12)" in line
    assert "err 0  CPU" in status_line(LiveStatus("x", "measure", 1, 5, 9.0, 1, 2, 5.0, None))

    # Every request of this target outlives its 100 ms timeout.
    write(tmp_path, "slow_target.py", SLOW_TARGET)
    path = write(
        tmp_path,
        "slow.yaml",
        "name: slow\ntarget: {kind: python, factory: 'slow_target:build'}\n"
        "workload: {load: {mode: closed, concurrency: 2}, timeout_ms: 100}\n",
    )

    class Recorder:
        def __init__(self) -> None:
            self.statuses: list[LiveStatus] = []

        def update(self, status: LiveStatus) -> None:
            self.statuses.append(status)

        def note(self, text: str) -> None:
            return None

    recorder = Recorder()
    outcomes = run(path, Store.open(sqlite_url), RunOptions(True, 1.5, 0.3), recorder)
    assert outcomes[-1].summary.errors_by_type.get("timeout", 0) > 0
    measuring = [s for s in recorder.statuses if s.phase == "measure"]
    assert measuring and measuring[-1].timeouts > 0  # before: no such field, "QPS 0.0 P50 -"
    assert all(s.errors >= s.timeouts for s in recorder.statuses)
    assert f"err {measuring[-1].errors} (timeout {measuring[-1].timeouts})" in status_line(
        measuring[-1]
    )


# -- g. the HTML report charts the service's CPU and RSS over time ---------------------------


def _with_service(data: Any) -> Any:
    from dataclasses import replace

    steps = []
    for step in data.steps:
        samples = [
            replace(sample, service_cpu_pct=80.0 + i, service_rss_bytes=(500 + i) * 2**20)
            for i, sample in enumerate(step.resources)
        ]
        steps.append(replace(step, resources=samples))
    return replace(data, steps=steps)


def test_html_report_charts_the_service_cpu_and_rss_beside_optlabs() -> None:
    from optlab.reports.html import render_html

    page = render_html(golden_table(), _with_service(report_data()))
    titles = [
        "Process CPU (optlab)",
        "Service CPU (its process tree)",
        "Process memory (RSS, optlab)",
        "Service memory (RSS of its process tree)",
    ]
    positions = [page.find(f'class="title">{title}</text>') for title in titles]
    assert all(p > 0 for p in positions) and positions == sorted(positions), positions
    service = page[positions[1] : positions[2]]
    assert service.count("<polyline") == 3  # one line per measured step
    memory = page[positions[3] :].split("</svg>")[0]
    assert memory.count("<polyline") == 3
    assert page.count("<svg") == 8
    # Without a service, the report is as it was: no empty service charts.
    plain = render_html(golden_table(), report_data())
    assert "Service CPU" not in plain and plain.count("<svg") == 6


def test_report_command_charts_a_stored_service_series(
    chain: Path, invoke: Invoke, sqlite_url: str, tmp_path: Path
) -> None:
    # As a `command` target's run stores them: service samples beside optlab's own.
    path = sqlite_url.removeprefix("sqlite:///")
    with sqlite3.connect(path) as db:
        db.execute(
            "UPDATE resource_samples SET service_cpu_pct = 150.0, service_rss_bytes = 734003200"
        )
    out = tmp_path / "report.html"
    result = invoke("report", "--html", str(out))
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "Service CPU (its process tree)" in page and "Service memory" in page
