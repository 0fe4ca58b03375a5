"""`optlab sweep` end to end: real levels measured on the synthetic target, stored, reused,
interrupted, and every bad input refused with the accepted forms."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

import optlab.api as api
from optlab.store import Store
from tests.support.files import write
from tests.support.paths import REPO

Invoke = Callable[..., Result]

# One server with a fixed service time: its capacity is bounded by 1 / service time, and
# constant arrivals keep the halves of a short level equal (the stability rule).
SERVER = """\
name: {name}
description: one server, fixed {ms} ms
target: {{kind: builtin, name: synthetic}}
knobs:
  distribution: fixed
  service_ms: {ms}
  single_server: true
workload:
  load: {{mode: open, rate: 50, arrival: constant}}
protocol: {{name: quick}}
"""

FAILING = """\
name: broken
description: a target whose every call raises
target: {kind: python, factory: "sweep_broken:build"}
knobs: {}
workload:
  load: {mode: open, rate: 50}
protocol: {name: quick}
"""


def _json(result: Result) -> dict[str, Any]:
    line = result.stdout.strip().splitlines()[-1]
    document: dict[str, Any] = json.loads(line)
    return document


def _server(folder: Path, name: str = "server", ms: float = 2.0) -> Path:
    return write(folder, f"{name}.yaml", SERVER.format(name=name, ms=ms))


@pytest.mark.parametrize(
    ("slo", "said"),
    [
        ("p98=5", "'p98' is not a percentile"),
        ("p99=fast", "is not a latency objective"),
        ("latency=5ms", "'latency' is not a percentile"),
        ("p99=5parsecs", "unknown unit"),
        ("p99=0ms", "must be a positive time"),
    ],
)
def test_a_bad_slo_is_refused_with_the_accepted_forms(
    slo: str, said: str, invoke: Invoke, tmp_path: Path
) -> None:
    path = _server(tmp_path)
    result = invoke("sweep", str(path), "--slo", slo, "--quick")
    assert result.exit_code == 2, result.output
    assert said in result.stderr
    assert "accepted forms: p50|p95|p99|p99.9" in result.stderr
    assert result.stdout == ""


def test_a_range_that_goes_down_is_refused(invoke: Invoke, tmp_path: Path) -> None:
    path = _server(tmp_path)
    args = ("--slo", "p99=20ms", "--quick", "--min-rate", "100", "--max-rate", "50")
    result = invoke("sweep", str(path), *args)
    assert result.exit_code == 2
    assert "--max-rate 50 is below --min-rate 100" in result.stderr
    assert "hint: give a range that goes up" in result.stderr


def test_an_slo_no_rate_meets_finishes_without_a_capacity(
    invoke: Invoke, tmp_path: Path, sqlite_url: str
) -> None:
    path = _server(tmp_path, "slow", ms=1)  # one client: ~1,000 queries in a 1 s level
    args = ("--slo", "p99=0.5ms", "--quick", "--level-duration", "1", "--json")
    result = invoke("sweep", str(path), *args)
    assert result.exit_code == 0, result.output
    document = _json(result)
    assert document["capacity_qps"] is None and document["capacity_interval"] is None
    assert document["status"] == "FINISHED" and document["limited_by"] == "slo"
    assert document["message"].startswith("no rate meets P99 ≤ 0.5 ms: at 1 client P99 was ")
    level = document["levels"][0]
    assert level["p99_ms"] >= 1 and level["meets_slo"] is False
    assert "no rate meets P99 ≤ 0.5 ms" in result.stderr  # the table of levels, on stderr
    stored = Store.open(sqlite_url).get_sweep(document["sweep_id"])
    assert stored.status == "FINISHED" and stored.result is not None
    assert stored.result.capacity_qps is None


def test_a_target_that_fails_at_every_level_fails_the_sweep(
    invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        tmp_path,
        "sweep_broken.py",
        "def build(knobs):\n    def call(request):\n        raise ValueError('model file is"
        " corrupt')\n    return call\n\ndef inputs(workload):\n    return [1, 2, 3]\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = write(tmp_path, "broken.yaml", FAILING)
    args = ("--slo", "p99=50ms", "--quick", "--level-duration", "1", "--json")
    result = invoke("sweep", str(path), *args)
    assert result.exit_code == 1, result.output
    document = _json(result)
    assert document["status"] == "FAILED" and document["capacity_qps"] is None
    assert "the target failed at every level" in document["error"]
    assert "ValueError" in document["error"]


def test_a_sweep_is_stored_and_its_levels_are_reused(
    invoke: Invoke, tmp_path: Path, sqlite_url: str
) -> None:
    # Closed loop: no send schedule for a busy machine to miss, so both levels are VALID.
    path = _server(tmp_path, ms=2)
    args = ("--slo", "p99=40ms", "--quick", "--level-duration", "2", "--mode", "closed")
    args += ("--min-rate", "2", "--max-rate", "4")
    first = invoke("sweep", str(path), *args, "--json")
    assert first.exit_code == 0, first.output
    document = _json(first)
    assert [lv["concurrency"] for lv in document["levels"]] == [2, 4]
    assert all(lv["valid"] for lv in document["levels"]), document
    # One server at 2 ms serves at most 500/s, whatever the clients; a busy machine only
    # slows it. Whether 4 clients bought more than 2 depends on that machine (a starved
    # 2-client level leaves room): the closed loop's saturation is
    # test_closed_mode_sweeps_clients_and_names_saturation's; here, what is stored and reused.
    capacity = document["capacity_qps"]
    assert capacity is not None and 0 < capacity <= 510, document["message"]
    assert document["measured_s"] > 5
    store = Store.open(sqlite_url)
    runs = [lv["run_id"] for lv in document["levels"]]
    # Levels are runs with their own measurements, left out of the experiment's own runs.
    assert all(store.get_windows(run_id, "measure") for run_id in runs)
    assert store.list_runs("server") == []
    assert {r.id for r in store.list_runs("server", levels=True)} == set(runs)
    listed = invoke("log", "--json")
    tags = [json.loads(line)["sweep"] for line in listed.stdout.splitlines()]
    assert [(t["sweep_id"], t["level"], t["load"]) for t in tags] == [
        (document["sweep_id"], 0, 2.0),
        (document["sweep_id"], 1, 4.0),
    ]

    again = invoke("sweep", str(path), *args, "--json")
    assert again.exit_code == 0, again.output
    second = _json(again)
    assert second["sweep_id"] != document["sweep_id"]
    assert [lv["run_id"] for lv in second["levels"]] == runs
    assert all(lv["reused"] for lv in second["levels"])
    assert second["measured_s"] == 0 and second["capacity_qps"] == capacity
    assert second["limited_by"] == document["limited_by"]  # the same levels, the same answer
    assert "reusing run" in again.stderr
    listed_sweeps = invoke("sweeps", "server")
    assert listed_sweeps.exit_code == 0
    rows = [line.split() for line in listed_sweeps.stdout.splitlines()[1:]]
    assert [(row[0], row[1]) for row in rows] == [
        (str(document["sweep_id"]), "server"),
        (str(second["sweep_id"]), "server"),
    ]
    # The capacity as printed to 0.1 (the JSON's 499.75 was printed 499.7, the value stored
    # and printed being a hair under the half that round() took up).
    shown = [float(row[5].replace(",", "")) for row in rows]
    assert all(abs(value - capacity) <= 0.05 + 1e-6 for value in shown), (shown, capacity)
    text = invoke("sweeps", "--show", str(second["sweep_id"])).stdout
    assert "2 cl" in text and "4 cl" in text and "* reused from an earlier sweep" in text
    assert max(len(line) for line in text.splitlines()) <= 100
    shown = invoke("sweeps", "--show", str(second["sweep_id"]), "--json")
    assert json.loads(shown.stdout) == second
    frame = api.sweeps(sqlite_url, "server")
    assert list(frame["sweep_id"]) == [document["sweep_id"], second["sweep_id"]]
    # The JSON rounds a rate to 3 decimals; the frame holds it as stored.
    assert list(frame["capacity_qps"]) == pytest.approx([capacity, capacity], abs=1e-3)
    assert list(api.sweep_levels(sqlite_url, second["sweep_id"])["run_id"]) == runs

    # Another protocol (longer levels) is not the same measurement: nothing is reused.
    longer = invoke("sweep", str(path), *args, "--level-duration", "2.5", "--json")
    assert longer.exit_code == 0, longer.output
    assert not any(lv["reused"] for lv in _json(longer)["levels"])


def test_closed_mode_sweeps_clients_and_names_saturation(invoke: Invoke, tmp_path: Path) -> None:
    path = _server(tmp_path, ms=5)
    # 4 clients wait ~20 ms: a 250 ms SLO is met at every level, so what ends the sweep is the
    # throughput that stopped growing. (At 60 ms, one scheduling stall of a busy machine inside
    # the 1-client level's 1 s missed it and ended the sweep there.)
    args = ("--slo", "p99=250ms", "--quick", "--level-duration", "1", "--mode", "closed")
    result = invoke("sweep", str(path), *args, "--max-rate", "4", "--json")
    assert result.exit_code == 0, result.output
    document = _json(result)
    assert document["mode"] == "closed"
    counted = [lv for lv in document["levels"] if lv["purpose"] != "sizing"]
    assert [lv["concurrency"] for lv in counted][:2] == [1, 2], document
    # 1 client for 1 s gives 200 queries, too few for P99: measured again, long enough.
    sizing = [lv for lv in document["levels"] if lv["purpose"] == "sizing"]
    assert [lv["concurrency"] for lv in sizing] == [1] and not sizing[0]["valid"]
    assert all(lv["valid"] for lv in counted), counted
    # One server at 5 ms serves 200/s whatever the clients: twice the clients buy nothing.
    assert document["limited_by"] == "saturation"
    assert 150 <= document["capacity_qps"] <= 210


def _spawn_sweep(path: Path, db: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [sys.executable, "-m", "optlab", "--db", f"sqlite:///{db}", "sweep", str(path)]
    return subprocess.Popen(
        [*command, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _measuring_level(db: Path, position: int) -> bool:
    if not db.exists():
        return False
    try:
        with sqlite3.connect(db, timeout=5) as con:
            row = con.execute(
                "select 1 from sweep_levels l join runs r on r.id = l.run_id "
                "join run_windows w on w.run_id = r.id where l.position = ? "
                "and r.status = 'RUNNING' and w.phase = 'measure' limit 1",
                (position,),
            ).fetchone()
    except sqlite3.OperationalError:
        return False
    return row is not None


def test_ctrl_c_keeps_the_finished_levels_and_marks_the_sweep_killed(tmp_path: Path) -> None:
    path = _server(tmp_path, ms=2)
    db = tmp_path / "sweep.db"
    proc = _spawn_sweep(
        path, db, "--slo", "p99=40ms", "--quick", "--level-duration", "30", "--min-rate", "100"
    )
    # Level 0 measures 30 s... too long to wait for: interrupt it instead, then a second one.
    deadline = time.monotonic() + 60
    while not _measuring_level(db, 0):
        assert time.monotonic() < deadline, "level 0 never reached its measurement"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    store = Store.open(f"sqlite:///{db}")
    (sweep,) = store.list_sweeps()
    assert sweep.status == "KILLED"
    (level,) = sweep.levels
    run = store.get_run(level.run_id)
    assert run.status == "KILLED" and run.requests  # the partial level is kept, as a run is
    assert sweep.result is not None and sweep.result.capacity_qps is None


def test_a_plainly_saturated_level_stops_early(invoke: Invoke, tmp_path: Path) -> None:
    path = _server(tmp_path, "slow", ms=10)  # one server at 10 ms: 100/s at most
    args = ("--slo", "p99=500ms", "--quick", "--level-duration", "20")
    result = invoke("sweep", str(path), *args, "--min-rate", "400", "--max-rate", "400", "--json")
    assert result.exit_code == 0, result.output
    document = _json(result)
    (level,) = document["levels"]
    assert level["limit"] == "saturation" and not level["valid"]
    assert document["capacity_qps"] is None and document["limited_by"] == "saturation"
    assert document["measured_s"] < 15, "the 20 s level should have stopped within seconds"
    assert "stopping early: saturated" in result.stderr


def test_export_refuses_a_level_and_says_sweeps_stay_behind(
    invoke: Invoke, tmp_path: Path, sqlite_url: str
) -> None:
    path = _server(tmp_path, "slow", ms=1)
    args = ("--slo", "p99=0.5ms", "--quick", "--level-duration", "1", "--json")
    swept = invoke("sweep", str(path), *args)
    assert swept.exit_code == 0, swept.output
    level_run = _json(swept)["levels"][0]["run_id"]
    refused = invoke("export", "--runs", str(level_run), "-o", str(tmp_path / "b.jsonl"))
    assert refused.exit_code == 2
    assert f"run {level_run} is level 0 of sweep" in refused.stderr
    assert not (tmp_path / "b.jsonl").exists()
    ran = invoke("run", str(path), "--quick", "--duration", "1", "--warmup", "0.2")
    assert ran.exit_code in (0, 4), ran.output  # few queries at 1 s: INVALID is fine here
    exported = invoke("export", "--all", "-o", str(tmp_path / "all.jsonl"))
    assert exported.exit_code == 0, exported.output
    levels = len(_json(swept)["levels"])  # the first, too short to count, measured again
    assert f"left out 1 sweep and their {levels} level runs" in exported.stderr
    assert "wrote 1 run " in exported.stdout


def test_a_step_swept_alone_says_its_parent_has_no_sweep(invoke: Invoke, tmp_path: Path) -> None:
    _server(tmp_path, "base", ms=2)
    step = write(tmp_path, "faster.yaml", "name: faster\nparent: base\nchange: {service_ms: 1}\n")
    args = ("--slo", "p99=40ms", "--quick", "--level-duration", "2", "--mode", "closed")
    result = invoke("sweep", str(step), *args, "--min-rate", "2", "--max-rate", "2", "--json")
    assert result.exit_code == 0, result.output
    assert _json(result)["experiment"] == "faster"
    assert (
        "note: parent 'base' has no finished closed-loop sweep under P99 ≤ 40 ms" in result.stderr
    )
    assert f"optlab sweep {step} --chain --slo p99=40ms --mode closed --quick`" in result.stderr
