"""Renderers of the stacked-gains table: markdown, CSV, JSON and HTML.

The table is built by hand from the column contract (tests/support/frames.py), not by
`reports.table.stacked_table`, so the golden files change only when a renderer does.
Regenerate them with OPTLAB_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import io
import json
import math
import re
from dataclasses import replace
from typing import Any

import pandas as pd
import pytest

from optlab.reports.data import ReportData
from optlab.reports.export import render_csv, render_json
from optlab.reports.format import bound, interval
from optlab.reports.html import render_html
from optlab.reports.markdown import PROVISIONAL_NOTE as PROVISIONAL
from optlab.reports.markdown import render_markdown
from optlab.reports.stacked import (
    COLUMNS,
    LLM_COLUMNS,
    LLM_DELTA_COLUMNS,
    StackedTable,
    TableHeader,
)
from optlab.reports.table_json import EnvironmentInfo
from optlab.reports.terminal import render_text
from tests.support.frames import (
    HOSTILE,
    STAGE_COLUMNS,
    capacity_table,
    golden_table,
    markdown_cells,
    markdown_rows,
    report_data,
    table_row,
)
from tests.support.golden import check_golden


def test_golden_table_exercises_every_column() -> None:
    """Every column of the table's contract holds a value in some golden row, so each
    renderer's handling of it is in a golden file (only the stage with no value is empty, and
    a streaming target's columns, which the next test renders)."""
    table = golden_table()
    assert table.columns() == [*COLUMNS, *STAGE_COLUMNS]
    empty = [c for c in table.columns() if not table.any_value(c)]
    assert empty == [*(c for c, _ in LLM_COLUMNS), "goodput_low", "goodput_high", "service_p50_ms"]


def test_a_streaming_chains_token_figures_are_in_every_format() -> None:
    figures = {
        "ttft_p50_ms": 101.25,
        "ttft_p99_ms": 119.7,
        "tpot_p50_ms": 11.49,
        "tpot_p99_ms": 13.75,
        "itl_p99_ms": 20.87,
        "output_tps": 684.68,
        "goodput": 0.994,
        "goodput_low": 0.981,
        "goodput_high": 0.999,
    }
    judged = {"tpot_p50_step_pct": -40.0, "tpot_p50_step_low_pct": -45.0,
              "tpot_p50_step_high_pct": -35.0}  # fmt: skip
    base = golden_table()
    second = base.rows[1].model_copy(update={**figures, "llm_deltas": judged})
    rows = (base.rows[0].model_copy(update=figures), second, *base.rows[2:])
    table = StackedTable(header=base.header, rows=rows)
    assert table.columns() == [*COLUMNS, *STAGE_COLUMNS, *LLM_DELTA_COLUMNS]
    markdown = render_markdown(table)
    assert "| TTFT P50 | TTFT P99 | TPOT P50 | TPOT P99 | ITL P99 | tok/s | goodput |" in markdown
    assert "| 101.25 | 119.70 | 11.49 | 13.75 | 20.87 | 685 | 99.4% [98.1, 99.9] |" in markdown
    assert "| 11.49 (-40% [-45,-35]) |" in markdown  # a judged figure, with its interval
    text = render_text(table, width=600)
    assert "TTFT P99" in text and "119.70" in text and "685" in text and "99.4%" in text
    assert "-40% [-45,-35]" in text
    document = json.loads(render_json(table))
    assert {k: document["chain"][0][k] for k in figures} == figures
    assert document["chain"][2]["goodput"] is None
    delta = document["chain"][1]["llm_step_delta"]
    assert (delta["tpot_p50_pct"], delta["tpot_p50_low_pct"], delta["ttft_p99_pct"]) == (
        -40.0,
        -45.0,
        None,
    )
    assert document["chain"][0]["llm_cumulative_delta"]["output_tps_pct"] is None
    frame = table.to_frame()
    assert frame["tpot_p50_step_low_pct"].tolist()[1] == -45.0
    data = report_data()
    streamed = replace(data.steps[0], ttft_cdf=[(50.0, 101.25), (99.0, 119.7)])
    html = render_html(table, replace(data, steps=[streamed, *data.steps[1:]]))
    assert "TTFT P99" in html and "99.4%" in html and "step -40.0% [-45, -35]" in html
    assert "Time to first token by percentile" in html and "Output tokens per second" in html
    assert "Time to first token" not in render_html(table, data)  # no streamed CDF: no charts


def test_capacity_table_exercises_every_capacity_column() -> None:
    table = capacity_table()
    capacity = [c for c in table.columns() if c.startswith("capacity_")]
    assert capacity and all(table.any_value(c) for c in capacity)


def _bare(**rows: Any) -> StackedTable:
    """A table with no run and nothing recorded of how it was measured."""
    header = TableHeader(
        head="int8",
        protocol_label="",
        environment=EnvironmentInfo(summary="", material_hash=None, fingerprint={}),
        confidence=0.99,
    )
    return StackedTable(header=header, rows=tuple(rows.values()))


def test_markdown_golden() -> None:
    check_golden("stacked.md", render_markdown(golden_table()))


def test_markdown_contents() -> None:
    text = render_markdown(golden_table())
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
    text = render_markdown(golden_table(hostile=True))
    assert HOSTILE not in text
    assert "&lt;script>" in text
    lines = markdown_rows(text)
    assert len(lines) == 2 + 4
    assert len({markdown_cells(line) for line in lines}) == 1, lines


def test_markdown_without_figures_or_protocol() -> None:
    """A table whose steps hold no figure and no statistic, measured under no recorded
    protocol: the renderer copes."""
    text = render_markdown(
        _bare(
            base=table_row(experiment="base"),
            step=table_row(
                experiment="step", variable="copies", change="2 -> 1", run_id=7, qps=10.0
            ),
        )
    )
    assert "**Protocol:** not recorded" in text and "**Environment:** not recorded" in text
    assert len({markdown_cells(line) for line in markdown_rows(text)}) == 1


def test_csv_parses_back() -> None:
    table = golden_table(hostile=True)
    back = pd.read_csv(io.StringIO(render_csv(table)))
    assert list(back.columns) == table.columns()
    assert len(back) == len(table.rows)
    assert back.loc[2, "experiment"] == HOSTILE
    assert back.loc[2, "flags"] == "optimised QPS (+20%), broke P99 (+100%)"
    assert back.loc[2, "reasons"] == f"error rate 2.0% > 1%; bad {HOSTILE}"
    assert back.loc[1, "qps"] == pytest.approx(1500.0)
    assert math.isnan(back.loc[3, "qps"])
    assert back.loc[1, "hypothesis"] == "amortise | overhead\nper call"


def test_json_follows_the_contract() -> None:
    table = golden_table()
    doc = json.loads(render_json(table))
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
    assert chain[0]["run_id"] == 1 and isinstance(chain[0]["run_id"], int)  # the schema's
    assert render_json(table) == render_json(table)  # stable


def test_json_golden() -> None:
    check_golden("stacked.json", render_json(golden_table()))
    check_golden("stacked-capacity.json", render_json(capacity_table()))


def test_csv_golden() -> None:
    check_golden("stacked.csv", render_csv(golden_table()))
    check_golden("stacked-capacity.csv", render_csv(capacity_table()))


def test_capacity_renderings_golden() -> None:
    table = capacity_table()
    check_golden("stacked-capacity.md", render_markdown(table))
    check_golden("stacked-capacity.html", render_html(table, report_data()))


def test_the_frame_at_the_edge_keeps_columns_and_header() -> None:
    """`to_frame()` (what `optlab.api.chain_table` returns): every column in order, lists as
    lists, the header in `attrs` as notebooks read it."""
    frame = capacity_table().to_frame()
    assert list(frame.columns) == capacity_table().columns()
    assert frame.loc[1, "decided_by"] == ["QPS", "P50", "P99"]
    assert frame.attrs["head"] == "int8" and frame.attrs["confidence"] == 0.99
    assert frame.attrs["capacity_slo"]["key"] == "p99=10ms"
    assert "service" not in frame.attrs["environment"]


def test_json_round_trips_into_a_frame() -> None:
    doc = json.loads(render_json(golden_table()))
    back = pd.json_normalize(doc["chain"])
    assert back["step_delta.qps_pct"].iloc[1] == 50.0
    assert back["verdict"].tolist() == ["baseline", "gain", "regressed", "missing"]


def test_html_golden() -> None:
    check_golden("stacked.html", render_html(golden_table(), report_data()))


def test_html_is_self_contained() -> None:
    text = render_html(golden_table(), report_data())
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
    text = render_html(golden_table(hostile=True), report_data(hostile=True))
    assert HOSTILE not in text
    assert "<script" not in text.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text


def test_html_without_report_data() -> None:
    """A table alone (no runs read) still renders: the charts say there is no data."""
    text = render_html(_bare(base=table_row(experiment="base")), ReportData(steps=[]))
    assert "no data" in text and "not recorded" in text


def test_a_ratio_interval_never_reads_as_minus_100() -> None:
    """A ratio's bound lies above -100%: one that rounds to -100 keeps the digits that say so."""
    assert interval(-99.955, 22527.0) == " [-99.95, +22527]"
    assert interval(-99.99999, 3.0, tight=True) == " [>-100,+3]"
    assert interval(-44.4, 56.0) == " [-44, +56]"
    assert bound(-100.0) == "-100" and bound(-99.96, 1) == "-99.96"
