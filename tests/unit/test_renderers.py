"""Renderers of the stacked-gains table: markdown, CSV, JSON and HTML.

The frame is built by hand from the column contract of `reports.table.stacked_table`, so the
golden files change only when a renderer does. Regenerate them with OPTLAB_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from optlab.reports.data import CDF_PERCENTILES, ReportData, StepData, collect_report
from optlab.reports.export import present, render_csv, render_json
from optlab.reports.format import bound, interval
from optlab.reports.html import render_html
from optlab.reports.markdown import PROVISIONAL_NOTE as PROVISIONAL
from optlab.reports.markdown import render_markdown
from optlab.reports.table import COLUMNS
from optlab.store.records import ResourceSample, WindowStats
from tests.conftest import REPO
from tests.support.golden import check_golden

HOSTILE = "<script>alert(1)</script>"
NAN = float("nan")


# The stage columns the table adds after COLUMNS, one per stage the runs recorded; the last one
# holds no value in any row (a renderer shows no column for it).
STAGES = ("queue_p50_ms", "preprocess_p50_ms", "infer_p50_ms", "postprocess_p50_ms",
          "service_p50_ms")  # fmt: skip
LISTS = ("decided_by", "flags", "slo_failures", "reasons")


def _row(**values: Any) -> dict[str, Any]:
    """A row with every column of the table's contract (`COLUMNS`), then the stage columns:
    a column the table gains is in the golden frames without anyone adding it here."""
    row: dict[str, Any] = dict.fromkeys((*COLUMNS, *STAGES), NAN)
    row |= {column: [] for column in LISTS}
    row |= {
        "experiment": None, "variable": None, "change": None, "hypothesis": None,
        "run_id": None, "runs": 0, "status": None, "valid": None, "provisional": None,
        "missing": None, "significant": None, "verdict": None, "slo_pass": None,
        "git_commit": "4ecc9ac", "started_at": None, "who": "ana@bench1",
    }  # fmt: skip
    unknown = set(values) - set(row)
    assert not unknown, f"not a column of the table: {unknown}"
    row |= values
    return row


def _measured(run_id: int, p50: float, p99: float, qps: float, **values: Any) -> dict[str, Any]:
    measured: dict[str, Any] = dict(
        run_id=run_id, runs=1, status="FINISHED", valid=True, provisional=True,
        p50_ms=p50, p95_ms=p50 * 1.8, p99_ms=p99, p999_ms=p99 * 1.5, qps=qps,
        error_rate=0.0, cpu_pct=92.5, service_cpu_pct=40.0 + 10 * run_id,
        gpu_util_pct=50.0 + run_id, gpu_mem_peak_mib=800.0 + 16 * run_id,
        infer_ms_per_request=p50 * 0.45, cache_hit_rate=0.25 * (run_id - 1),
        queue_p50_ms=p50 * 0.1, preprocess_p50_ms=p50 * 0.3,
        infer_p50_ms=p50 * 0.5, postprocess_p50_ms=p50 * 0.05,
        started_at=f"2026-11-30T10:0{run_id}:00+00:00",
    )  # fmt: skip
    return _row(**(measured | values))


def stacked_frame(hostile: bool = False) -> pd.DataFrame:
    """Baseline, a gain, a trade-off step that is INVALID and fails its SLO, a missing step."""
    name = HOSTILE if hostile else "fewer-copies"
    rows = [
        _measured(
            1, 4.0, 9.0, 1000.0, experiment="baseline", verdict="baseline", slo_pass=True,
            hypothesis="reference config", accuracy_top1=0.761,
        ),
        _measured(
            2, 2.5, 6.0, 1500.0, experiment="dynamic-batch", variable="batching",
            change="off -> dynamic (max_batch_size 8)", hypothesis="amortise | overhead\nper call",
            qps_step_pct=50.0, qps_step_low_pct=44.0, qps_step_high_pct=56.0,
            qps_cumulative_pct=50.0, p50_step_pct=-37.5, p50_step_low_pct=-40.0,
            p50_step_high_pct=-35.0, p50_cumulative_pct=-37.5, p99_step_pct=-33.3,
            p99_step_low_pct=-38.0, p99_step_high_pct=-29.0, p99_cumulative_pct=-33.3,
            significant=True, verdict="gain", decided_by=["QPS", "P50", "P99"], slo_pass=True,
            accuracy_top1=0.761, mean_batch_size=5.5,
            qps_cumulative_low_pct=44.0, qps_cumulative_high_pct=56.0,
            p50_cumulative_low_pct=-40.0, p50_cumulative_high_pct=-35.0,
            p99_cumulative_low_pct=-38.0, p99_cumulative_high_pct=-29.0,
            step_confidence=0.99, cumulative_confidence=0.99,
            step_method="Welch t on log within-run spread",
        ),
        _measured(
            3, 2.2, 12.0, 1800.0, experiment=name, variable="copies",
            change=f"2 -> 1 | {name}", hypothesis=name, valid=False,
            reasons=["error rate 2.0% > 1%", f"bad {name}"],
            qps_step_pct=20.0, qps_step_low_pct=15.0, qps_step_high_pct=25.0,
            qps_cumulative_pct=80.0, p50_step_pct=-12.0, p50_step_low_pct=-15.0,
            p50_step_high_pct=-9.0, p50_cumulative_pct=-45.0, p99_step_pct=100.0,
            p99_step_low_pct=80.0, p99_step_high_pct=120.0, p99_cumulative_pct=33.3,
            significant=True, verdict="regressed", decided_by=["P99"],
            flags=["optimised QPS (+20%), broke P99 (+100%)"], slo_pass=False,
            slo_failures=["p99 12.0 ms > 10 ms"], accuracy_top1=0.760,
            error_rate=0.02, qps_cumulative_low_pct=70.0, qps_cumulative_high_pct=90.0,
            p50_cumulative_low_pct=-50.0, p50_cumulative_high_pct=-40.0,
            p99_cumulative_low_pct=20.0, p99_cumulative_high_pct=46.0,
            step_confidence=1 - 0.01 / 3, cumulative_confidence=0.99,
            step_method="paired t on log-ratios, 3 pairs",
        ),
        _row(
            experiment="int8", variable="precision", change="fp32 -> int8",
            missing="environment differs materially from the baseline run's: cpu model",
            verdict="missing",
        ),
    ]  # fmt: skip
    frame = pd.DataFrame(rows)
    frame.attrs = {
        "schema_version": 1,
        "head": "int8",
        "protocol": {"name": "quick", "warmup_s": 1.0, "duration_s": 5.0, "provisional": True},
        "protocol_label": "quick (5 s measured, PROVISIONAL)",
        "environment": {
            "summary": f"AMD EPYC x2, 24 GiB, Linux 6.18, Python 3.11.7, torch 2.13.0+cpu {name}",
            "material_hash": "abc123",
            "fingerprint": {"hardware": {"cpu": {"model": f"AMD EPYC {name}"}}},
        },
        "confidence": 0.99,
    }
    return frame


def capacity_frame() -> pd.DataFrame:
    """`stacked_frame()` with the capacity columns under P99 ≤ 10 ms: the baseline's capacity,
    a gain beyond noise, a step whose sweep found none, and the missing step (no sweep)."""
    frame = stacked_frame()
    columns: dict[str, list[Any]] = {
        "capacity_qps": [1000.0, 1500.0, None, None],
        "capacity_low_qps": [950.0, 1420.0, None, None],
        "capacity_high_qps": [1050.0, 1580.0, None, None],
        "capacity_knee_qps": [800.0, 1300.0, None, None],
        "capacity_sweep_id": [11, 12, 13, None],
        "capacity_step_pct": [None, 50.0, None, None],
        "capacity_step_low_pct": [None, 38.5, None, None],
        "capacity_step_high_pct": [None, 62.4, None, None],
        "capacity_cumulative_pct": [None, 50.0, None, None],
        "capacity_cumulative_low_pct": [None, 38.5, None, None],
        "capacity_cumulative_high_pct": [None, 62.4, None, None],
        "capacity_significant": [None, True, None, None],
        "capacity_cumulative_significant": [None, True, None, None],
        "capacity_reason": [
            None, None, "sweep 13 found no capacity: P99 above 10 ms at 1 client",
            "no sweep under P99 ≤ 10 ms: run `optlab sweep int8 --slo p99=10ms`",
        ],
        "capacity_verdict": [None, "gain", None, None],
        "capacity_loop": ["closed", "closed", "closed", None],
    }  # fmt: skip
    for column, values in columns.items():
        frame[column] = values
    frame.attrs["capacity_slo"] = {
        "percentile": "p99", "ms": 10.0, "label": "P99 ≤ 10 ms", "key": "p99=10ms",
        "protocol_label": "quick (5 s measured, PROVISIONAL)", "loop": "closed",
    }  # fmt: skip
    return frame


def test_golden_frame_exercises_every_column() -> None:
    """Every column of the table's contract holds a value in some golden row, so each
    renderer's handling of it is in a golden file (only the stage with no value is empty)."""
    frame = stacked_frame()
    assert list(frame.columns) == [*COLUMNS, *STAGES]
    assert [c for c in frame.columns if not frame[c].map(present).any()] == ["service_p50_ms"]


def _table_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def _cells(line: str) -> int:
    # A cell boundary is a `|` not escaped by a backslash.
    return sum(1 for i, ch in enumerate(line) if ch == "|" and (i == 0 or line[i - 1] != "\\"))


def test_markdown_golden() -> None:
    check_golden("stacked.md", render_markdown(stacked_frame()))


def test_markdown_contents() -> None:
    text = render_markdown(stacked_frame())
    assert text.startswith("### optlab stacked gains: int8\n")
    assert "**Protocol:** quick (5 s measured, PROVISIONAL)" in text
    assert "**Environment:** AMD EPYC x2" in text
    assert "+50.0% [+44, +56]" in text
    assert "flag: optimised QPS (+20%), broke P99 (+100%)" in text
    assert "INVALID: error rate 2.0% > 1%" in text
    assert "SLO failed: p99 12.0 ms > 10 ms" in text
    assert "missing: environment differs materially" in text
    assert "PROVISIONAL: measured under a short protocol" in text
    assert "| infer P50 |" in text and "service P50" not in text  # no value: no column
    assert text.count(PROVISIONAL) == 1  # one shared note
    assert "76.1%" in text  # accuracy shown where defined


def test_markdown_hostile_name_keeps_the_table() -> None:
    text = render_markdown(stacked_frame(hostile=True))
    assert HOSTILE not in text
    assert "&lt;script>" in text
    lines = _table_lines(text)
    assert len(lines) == 2 + 4
    assert len({_cells(line) for line in lines}) == 1, lines


def test_markdown_without_optional_columns() -> None:
    """The lead's table may lack the statistics columns: the renderer copes."""
    frame = stacked_frame()[["experiment", "variable", "change", "run_id", "qps", "p50_ms"]]
    frame.attrs = {}
    text = render_markdown(frame)
    assert "**Protocol:** not recorded" in text
    assert len({_cells(line) for line in _table_lines(text)}) == 1


def test_csv_parses_back() -> None:
    frame = stacked_frame(hostile=True)
    back = pd.read_csv(io.StringIO(render_csv(frame)))
    assert list(back.columns) == list(frame.columns)
    assert len(back) == len(frame)
    assert back.loc[2, "experiment"] == HOSTILE
    assert back.loc[2, "flags"] == "optimised QPS (+20%), broke P99 (+100%)"
    assert back.loc[2, "reasons"] == f"error rate 2.0% > 1%; bad {HOSTILE}"
    assert back.loc[1, "qps"] == pytest.approx(1500.0)
    assert math.isnan(back.loc[3, "qps"])
    assert back.loc[1, "hypothesis"] == "amortise | overhead\nper call"


def test_json_follows_the_contract() -> None:
    frame = stacked_frame()
    doc = json.loads(render_json(frame))
    assert list(doc)[:1] == ["schema_version"] and doc["schema_version"] == 1
    assert doc["protocol"]["name"] == "quick"
    assert doc["environment"]["summary"].startswith("AMD EPYC")
    chain = doc["chain"]
    assert [c["experiment"] for c in chain] == ["baseline", "dynamic-batch", "fewer-copies", "int8"]
    first = list(chain[1])
    assert first[:8] == [
        "experiment", "variable", "change", "p50_ms", "p95_ms", "p99_ms", "qps", "step_delta",
    ]  # fmt: skip
    assert first[8:11] == ["cumulative_delta", "significant", "verdict"]
    assert chain[1]["step_delta"]["qps_pct"] == 50.0
    assert chain[1]["step_delta"]["qps_low_pct"] == 44.0
    assert chain[2]["cumulative_delta"]["p99_pct"] == 33.3
    assert chain[0]["step_delta"]["qps_pct"] is None  # NaN -> null
    assert chain[3]["qps"] is None and chain[3]["missing"].startswith("environment differs")
    assert chain[2]["flags"] == ["optimised QPS (+20%), broke P99 (+100%)"]
    assert "qps_step_pct" not in chain[1]  # moved into step_delta
    assert "cpu_pct" in chain[1] and "who" in chain[1]  # every other column follows
    assert render_json(frame) == render_json(frame)  # stable


def test_json_golden() -> None:
    check_golden("stacked.json", render_json(stacked_frame()))
    check_golden("stacked-capacity.json", render_json(capacity_frame()))


def test_csv_golden() -> None:
    check_golden("stacked.csv", render_csv(stacked_frame()))
    check_golden("stacked-capacity.csv", render_csv(capacity_frame()))


def test_capacity_renderings_golden() -> None:
    frame = capacity_frame()
    check_golden("stacked-capacity.md", render_markdown(frame))
    check_golden("stacked-capacity.html", render_html(frame, report_data()))


def test_json_round_trips_into_a_frame() -> None:
    doc = json.loads(render_json(stacked_frame()))
    back = pd.json_normalize(doc["chain"])
    assert back["step_delta.qps_pct"].iloc[1] == 50.0
    assert back["verdict"].tolist() == ["baseline", "gain", "regressed", "missing"]


def report_data(hostile: bool = False) -> ReportData:
    """Deterministic charts data for the frame's three measured steps (the fourth has none)."""
    name = HOSTILE if hostile else "fewer-copies"
    steps = []
    for run_id, (experiment, p50, qps) in enumerate(
        (("baseline", 4.0, 1000.0), ("dynamic-batch", 2.5, 1500.0), (name, 2.2, 1800.0)), 1
    ):
        cdf = [(p, p50 * (1 + 3 * (p / 100) ** 8)) for p in CDF_PERCENTILES]
        windows = [
            WindowStats("measure", t, int(qps), 0, qps + 20 * ((t * 7 + run_id) % 5 - 2),
                        p50, p50 * (2.2 + 0.1 * (t % 3)))
            for t in range(5)
        ]  # fmt: skip
        resources = [
            ResourceSample("measure", 1.0 + 0.5 * i, cpu_process_pct=150.0 + 10 * run_id + i,
                           rss_bytes=(300 + 20 * run_id) * 2**20)
            for i in range(10)
        ]  # fmt: skip
        stages = {"queue": p50 * 0.1, "preprocess": p50 * 0.3, "infer": p50 * 0.5,
                  "postprocess": p50 * 0.05}  # fmt: skip
        steps.append(StepData(experiment, run_id, cdf, stages, windows, resources, 1))
    steps.append(StepData("int8", None))
    fingerprint = {
        "hardware": {"cpu": {"model": f"AMD EPYC {name}", "logical_cores": 2},
                     "gpus": [], "memory": {"total_bytes": 25276510208}},
        "software": {"python": {"version": "3.11.7"}, "packages": {"torch": "2.13.0+cpu"}},
        "runtime": {"load_avg": [0.5, 1.0, 1.25]},
    }  # fmt: skip
    return ReportData(steps=steps, environments={1: fingerprint})


def test_html_golden() -> None:
    check_golden("stacked.html", render_html(stacked_frame(), report_data()))


def test_html_is_self_contained() -> None:
    text = render_html(stacked_frame(), report_data())
    assert text.startswith("<!DOCTYPE html>")
    assert "<script" not in text.lower()
    # The only URL is the SVG namespace, which no browser fetches.
    for url in re.findall(r"(?:https?:)?//[^\s\"'<>)]+", text):
        assert url == "http://www.w3.org/2000/svg", url
    for section in ("Latency distribution", "Stage waterfall", "QPS per second", "P99 per second",
                    "Process CPU", "Environment", "AMD EPYC fewer-copies"):  # fmt: skip
        assert section in text
    assert text.count("<svg") == 6  # CDF, waterfall, QPS, P99, CPU, RSS
    assert "infer -0.75 ms (-38%)" in text  # the waterfall names the stage the batching moved


def test_html_escapes_every_user_string() -> None:
    text = render_html(stacked_frame(hostile=True), report_data(hostile=True))
    assert HOSTILE not in text
    assert "<script" not in text.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_html_without_report_data() -> None:
    """A frame alone (no runs read) still renders: the charts say there is no data."""
    frame = stacked_frame()
    frame.attrs = {}
    text = render_html(frame, ReportData(steps=[]))
    assert "no data" in text and "not recorded" in text


@pytest.mark.slow
def test_end_to_end_over_a_quick_synthetic_chain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, invoke: Any, sqlite_url: str
) -> None:
    """A real chain, measured through the CLI, read back and rendered by every renderer."""
    from optlab.reports.table import stacked_table
    from optlab.store import Store

    folder = tmp_path / "synthetic"
    shutil.copytree(REPO / "experiments" / "examples" / "synthetic", folder)
    monkeypatch.chdir(tmp_path)
    step = str(folder / "01-faster-service.yaml")
    result = invoke("run", step, "--quick", "--duration", "1.5", "--warmup", "0.3", "--chain")
    assert result.exit_code == 0, result.output
    store = Store.open(sqlite_url)
    frame = stacked_table(store, "synthetic-faster-service")
    assert frame["experiment"].tolist() == ["synthetic-baseline", "synthetic-faster-service"]

    markdown = render_markdown(frame)
    assert "synthetic-faster-service" in markdown
    assert len({_cells(line) for line in _table_lines(markdown)}) == 1
    doc = json.loads(render_json(frame))
    assert [c["experiment"] for c in doc["chain"]] == frame["experiment"].tolist()
    assert doc["chain"][1]["step_delta"]["qps_pct"] > 25  # 2 ms -> 1 ms service time
    assert len(pd.read_csv(io.StringIO(render_csv(frame)))) == 2

    data = collect_report(store, frame)
    assert [s.run_id for s in data.steps] == frame["run_id"].tolist()
    for measured in data.steps:
        assert measured.cdf and measured.windows and measured.resources
        percentiles = [p for p, _ in measured.cdf]
        latencies = [ms for _, ms in measured.cdf]
        assert percentiles == sorted(percentiles) and latencies == sorted(latencies)
        assert 0.5 < dict(measured.cdf)[50.0] < 5.0
    assert data.environments
    page = render_html(frame, data)
    assert "synthetic-faster-service" in page and "no data" not in page
    if os.environ.get("OPTLAB_REPORT_OUT"):  # for a look in a browser
        Path(os.environ["OPTLAB_REPORT_OUT"]).write_text(page, encoding="utf-8")


def test_a_ratio_interval_never_reads_as_minus_100() -> None:
    """A ratio's bound lies above -100%: one that rounds to -100 keeps the digits that say so."""
    assert interval(-99.955, 22527.0) == " [-99.95, +22527]"
    assert interval(-99.99999, 3.0, tight=True) == " [>-100,+3]"
    assert interval(-44.4, 56.0) == " [-44, +56]"
    assert bound(-100.0) == "-100" and bound(-99.96, 1) == "-99.96"
