"""A knob sweep rendered: text, markdown with its response bars, the SVG chart."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from optlab.reports.knob import knob_chart_svg, render_knob, render_knob_list, render_knob_markdown
from tests.support.knobs import knob_doc as _doc


def test_text_and_markdown_say_the_winner_and_each_interval() -> None:
    doc = _doc({1: 100.0, 2: 150.0, 4: 80.0}, parent=1)
    text = render_knob(doc)
    winner = next(line for line in text.splitlines() if line.strip().startswith("2 "))
    assert "WINNER" in winner and doc["sentence"] in text
    md = render_knob_markdown(doc).splitlines()
    rows = [line for line in md if line.startswith("| ")][1:]
    by_value = {row.split(" | ")[0].removeprefix("| "): row for row in rows}
    assert "parent" in by_value["1"]
    # The bar grows to the right for a gain and to the left for a loss, scaled to the largest.
    gain_bar = by_value["2"].rsplit("`", 2)[1]
    loss_bar = by_value["4"].rsplit("`", 2)[1]
    assert gain_bar.startswith("\\|█") and loss_bar.endswith("█\\|")
    assert gain_bar.count("█") > loss_bar.count("█") > 0


def test_a_value_not_judged_is_said_with_why_in_text_and_markdown() -> None:
    doc = _doc({1: 100.0, 2: 150.0, 4: None}, parent=1)
    line = "k = 4 (a value, e4): no valid measurement in 4 blocks, not judged; the last: run 2"
    assert f"not judged: {line}" in render_knob(doc)
    assert f"- not judged: {line}" in render_knob_markdown(doc)
    assert "not judged" not in render_knob(_doc({1: 100.0, 2: 150.0}, parent=1))
    # The chart draws the measured values only, the unmeasured one labelled without a point.
    svg = ET.fromstring(knob_chart_svg(doc))
    assert len(svg.findall("{http://www.w3.org/2000/svg}circle")) == 2


def test_the_list_gives_each_answer_the_values_not_judged_and_sweeps_without_a_result() -> None:
    won = _doc({1: 100.0, 2: 150.0, 4: None}, parent=1) | {"knob_sweep_id": 1}
    tied = _doc({1: 100.0, 2: 100.0}, parent=1, noise=0.02) | {"knob_sweep_id": 2}
    running = {"knob_sweep_id": 3, "status": "RUNNING", "experiment": "e1", "knob": "k"}
    lines = render_knob_list([won, tied, running | {"metric": "qps"}]).splitlines()
    assert lines[0] == "1: e1 k by qps: 2; not judged: 4 (FINISHED)"
    assert lines[1].startswith("2: e1 k by qps: tie [") and lines[1].endswith("(FINISHED)")
    assert lines[2] == "3: e1 k by qps: no result yet (RUNNING)"


def test_the_chart_has_a_point_and_a_label_per_value() -> None:
    doc = _doc({1: 100.0, 2: 150.0, 4: 80.0, 8: 60.0}, parent=1)
    svg = ET.fromstring(knob_chart_svg(doc))
    ns = "{http://www.w3.org/2000/svg}"
    assert len(svg.findall(f"{ns}circle")) == 4  # the parent's at 0
    labels = [t.text for t in svg.findall(f"{ns}text")]
    assert "1 (parent)" in labels and "8" in labels
    # The winner is drawn in the winner's colour, the others not.
    fills = {c.get("fill") for c in svg.findall(f"{ns}circle")}
    assert "#2a7" in fills
