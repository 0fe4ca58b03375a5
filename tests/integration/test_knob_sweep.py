"""`optlab sweep-knob` end to end on the synthetic target: bad input refused before anything is
measured, a planted gain named and promoted (the table then compares it block by block), a
knob with no effect gives no winner, and an interrupted sweep resumes with its runs."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from optlab.knobs.search import KnobOptions, KnobOutcome, sweep_knob
from optlab.run.progress import Progress
from optlab.store import Store
from tests.support.files import write

Invoke = Callable[..., Result]

# Four closed-loop clients on one server with a fixed service time: QPS is 1000 / service_ms
# exactly, whatever the machine, so a planted gain is known.
PARENT = """\
name: syn
description: one server, fixed 2 ms, 4 clients
target: {kind: builtin, name: synthetic}
knobs:
  distribution: fixed
  service_ms: 2.0
  servers: 1
  seed: 0
workload:
  load: {mode: closed, concurrency: 4}
protocol: {name: quick}
"""

FAST = ("--duration", "2.5", "--warmup", "0.3", "--quick")


def _json(result: Result) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return document


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--knob", "service_mss", "--values", "1,2"), "did you mean 'service_ms'"),
        (("--knob", "service_ms", "--values", "1"), "is one value"),
        (("--knob", "service_ms", "--values", "1,1.0"), "twice"),
        (("--knob", "service_ms,servers", "--values", "1,2"), "more than one variable"),
        (("--knob", "service_ms", "--values", "1,-1"), "service_ms"),
        (("--knob", "service_ms", "--values", "1,,2"), "empty value"),
        (("--knob", "service_ms", "--values", "1,2", "--blocks", "0"), "--blocks 0"),
        (("--knob", "service_ms", "--values", "1,2", "--metric", "fast"), "--metric 'fast'"),
        (("--knob", "service_ms", "--values", "1,2", "--metric", "ttft_p99"), "streaming"),
        (("--knob", "service_ms", "--values", "1,2", "--metric", "capacity"), "needs --slo"),
        (("--knob", "seed.x", "--values", "1,2"), "not a mapping"),
    ],
)
def test_bad_input_exits_2_before_anything_is_measured(
    folder: Path, invoke: Invoke, sqlite_url: str, args: tuple[str, ...], said: str
) -> None:
    path = write(folder, "syn.yaml", PARENT)
    result = invoke("sweep-knob", str(path), *args, *FAST)
    assert result.exit_code == 2, result.output
    assert said in result.stderr
    with Store.open(sqlite_url) as store:
        assert store.list_runs() == []
        assert store.list_knob_sweeps() == []
    assert not list(folder.glob("knob-sweeps/**/*.yaml"))


def test_a_planted_gain_is_named_promoted_and_compared_by_block(
    folder: Path, invoke: Invoke, sqlite_url: str
) -> None:
    path = write(folder, "syn.yaml", PARENT)
    result = invoke(
        "sweep-knob",
        str(path),
        "--knob",
        "service_ms",
        "--values",
        "1.6,2,2.4",
        "--blocks",
        "2",
        "--seed",
        "5",
        "--promote",
        "--json",
        *FAST,
    )
    assert result.exit_code == 0, result.output
    doc = _json(result)
    assert set(doc) >= {
        "schema_version",
        "experiment",
        "knob",
        "metric",
        "winner",
        "tie",
        "values",
        "measured_s",
    }
    assert doc["metric"] == "qps" and doc["winner"] == 1.6 and doc["tie"] == []
    rows = {r["value"]: r for r in doc["values"]}
    assert rows[2]["control"] and rows[2]["experiment"] == "syn"
    # Truth: 1000/1.6 against 1000/2: +25%; 1000/2.4: -16.7%.
    assert (
        rows[1.6]["interval"][0] < 25.0 < rows[1.6]["interval"][1]
        or abs(rows[1.6]["effect_pct"] - 25.0) < 1.0
    )
    assert abs(rows[2.4]["effect_pct"] + 16.67) < 1.5 and rows[2.4]["significant"]
    assert doc["measured_s"] > 6 * 2.5
    promoted = folder / "01-service_ms-1.6.yaml"
    assert doc["promoted"] == str(promoted) and promoted.is_file()
    assert "sweep-knob" in promoted.read_text()
    # The stacked table grows by one row, compared with the parent pair by pair.
    table = invoke("table", str(promoted), "--format", "json")
    assert table.exit_code == 0, table.output
    chain = json.loads(table.stdout)["chain"]
    assert [row["experiment"] for row in chain] == ["syn", "syn.service_ms-1.6"]
    step = chain[1]
    assert step["variable"] == "service_ms"
    assert 20.0 < step["step_delta"]["qps_pct"] < 30.0
    assert "paired" in step["step_method"]
    assert step["knob_sweep"] == doc["knob_sweep_id"]


def test_a_knob_without_effect_names_no_winner(folder: Path, invoke: Invoke) -> None:
    path = write(folder, "syn.yaml", PARENT)
    result = invoke(
        "sweep-knob",
        str(path),
        "--knob",
        "seed",
        "--values",
        "0,1,2",
        "--blocks",
        "2",
        "--json",
        *FAST,
    )
    assert result.exit_code == 0, result.output
    doc = _json(result)
    assert doc["winner"] is None
    assert 0 in doc["tie"] and doc["chosen"] == 0  # the parent is tied: it stays
    assert "no value beats the parent" in doc["sentence"]


class _Quiet(Progress):
    def update(self, status: Any) -> None:
        pass

    def note(self, text: str) -> None:
        self.last = text


def test_an_interrupted_sweep_resumes_with_its_measured_cells(
    folder: Path, sqlite_url: str
) -> None:
    path = write(folder, "syn.yaml", PARENT)
    options = KnobOptions(
        knob="service_ms",
        values="1.5,2.5",
        blocks=2,
        quick=True,
        duration_s=2.5,
        warmup_s=0.2,
        seed=3,
    )
    cells = []

    def stop_after_two(outcome: KnobOutcome) -> None:
        cells.append(outcome.measured_s)
        if len(cells) == 2:
            raise KeyboardInterrupt

    with Store.open(sqlite_url) as store:
        with pytest.raises(KeyboardInterrupt):
            sweep_knob(path, store, options, _Quiet(), on_cell=stop_after_two)
        first = store.list_knob_sweeps()[-1]
        assert first.status == "KILLED" and len(first.cells) == 2
        kept = {(c.block, c.arm): c.run_id for c in first.cells}
        progress = _Quiet()
        outcome = sweep_knob(path, store, options, progress)
        assert outcome.status == "FINISHED" and outcome.knob_sweep_id == first.id
        again = store.get_knob_sweep(first.id)
        assert len(again.cells) == 6
        assert {(c.block, c.arm): c.run_id for c in again.cells if (c.block, c.arm) in kept} == kept
        assert outcome.document["winner"] == 1.5
        # Another question (other blocks) is a new sweep, not this one resumed.
        other = sweep_knob(path, store, KnobOptions(**{**options.__dict__, "blocks": 1}), _Quiet())
        assert other.knob_sweep_id != first.id
