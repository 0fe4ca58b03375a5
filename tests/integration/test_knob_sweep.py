"""`optlab sweep-knob` end to end on the synthetic target: bad input refused before anything is
measured, a planted gain named and promoted (the table then compares it block by block), a
knob with no effect gives no winner, and an interrupted sweep resumes with its runs."""

from __future__ import annotations

import contextlib
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
import yaml
from click.testing import CliRunner, Result

from optlab.cli.main import cli
from optlab.knobs.search import KnobOptions, KnobOutcome, sweep_knob
from optlab.knobs.tune_run import TuneOptions, run_tune
from optlab.run.progress import Progress
from optlab.store import Store
from tests.support.capabilities import not_root
from tests.support.files import write
from tests.support.paths import REPO
from tests.support.schemas import problems

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


@pytest.mark.parametrize("command", ["sweep-knob", "tune"])
def test_a_refused_value_leaves_no_database_and_no_sibling_folder(
    folder: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """Without --db the command's own default database (.optlab/optlab.db here) is not left
    behind empty by a refusal, nor the knob-sweeps folder its sibling files were written to;
    the hint says what to change."""
    monkeypatch.delenv("OPTLAB_DB", raising=False)
    path = write(folder, "syn.yaml", PARENT)
    values = ("--values", "2,-1") if command == "sweep-knob" else ("--values", "service_ms=2,-1")
    knob = "--knob" if command == "sweep-knob" else "--knobs"
    result = CliRunner().invoke(
        cli, [command, str(path), knob, "service_ms", *values, *FAST], catch_exceptions=False
    )
    assert result.exit_code == 2, result.output
    assert "service_ms" in result.stderr and "give --values that service_ms accepts" in (
        result.stderr
    )
    assert sorted(p.name for p in folder.iterdir()) == ["syn.yaml"]


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
        # Two blocks are one degree of freedom (on a busy machine -16.7% went uncalled); three
        # called +25% beside stress-ng --cpu 8, --vm and --hdd, and under 50-300 ms pauses of
        # the process, yet once not on a slow CI host (cause unrecorded): four, and the
        # document in the message.
        "4",
        "--seed",
        "5",
        "--promote",
        "--json",
        *FAST,
    )
    assert result.exit_code == 0, result.output
    doc = _json(result)
    assert problems("sweep-knob", doc) == []
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
    said = json.dumps({k: doc[k] for k in ("winner", "tie", "values", "comparisons")})
    assert doc["metric"] == "qps" and doc["winner"] == 1.6 and doc["tie"] == [], said
    rows = {r["value"]: r for r in doc["values"]}
    assert rows[2]["control"] and rows[2]["experiment"] == "syn"
    # Truth: 1000/1.6 against 1000/2: +25%; 1000/2.4: -16.7%.
    assert (
        rows[1.6]["interval"][0] < 25.0 < rows[1.6]["interval"][1]
        or abs(rows[1.6]["effect_pct"] - 25.0) < 1.0
    )
    assert abs(rows[2.4]["effect_pct"] + 16.67) < 1.5 and rows[2.4]["significant"], said
    assert doc["measured_s"] > 10 * 2.5  # twelve runs of 2.5 s
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


def test_a_value_without_a_valid_run_is_named_with_why_and_exits_4(
    folder: Path, invoke: Invoke
) -> None:
    # 1 s at 2 ms a query is ~500 queries, short of the 662 a P99 needs: every run INVALID.
    path = write(folder, "syn.yaml", PARENT)
    result = invoke(
        "sweep-knob",
        str(path),
        "--knob",
        "service_ms",
        "--values",
        "1.6,2",
        "--blocks",
        "1",
        "--json",
        "--duration",
        "1",
        "--warmup",
        "0.2",
        "--quick",
    )
    assert result.exit_code == 4, result.output
    doc = _json(result)
    assert problems("sweep-knob", doc) == []
    assert doc["status"] == "FINISHED" and sorted(doc["unmeasured"]) == [1.6, 2.0]
    assert doc["winner"] is None and "nothing was measured" in doc["sentence"]
    for row in doc["values"]:
        assert row["blocks"] == 0 and "INVALID: " in row["unusable"], row
        assert "P99 needs at least" in row["unusable"], row
    # Each cell was tried twice, the second time with the reason the first was not usable.
    assert result.stderr.count("again: the last one is not usable (run ") == 2, result.stderr
    said = result.stderr
    assert "not judged: service_ms = 1.6 (a value, syn.service_ms-1.6): no valid" in said
    assert said.count("(the parent, syn): no valid measurement") == 1, said
    assert "a longer --duration" in result.stderr and "Exit 4" in result.stderr
    listed = invoke("knob-sweeps")
    assert listed.exit_code == 0, listed.output
    line = f"{doc['knob_sweep_id']}: syn service_ms by qps: no answer; not judged: "
    assert line in listed.stdout, listed.stdout
    shown = invoke("knob-sweeps", "--show", str(doc["knob_sweep_id"]), "--format", "markdown")
    assert "- not judged: service_ms = 1.6 (a value" in shown.stdout, shown.output
    # tune says the same of its sweeps, and exits 4 too (its answer is no better than them).
    tuned = invoke(
        "tune", str(path), "--knobs", "servers", "--values", "servers=1,2", "--blocks", "1",
        "--json", "--duration", "1", "--warmup", "0.2", "--quick",
    )  # fmt: skip
    assert tuned.exit_code == 4, tuned.output
    assert problems("tune", _json(tuned)) == []
    # (servers = 2 serves 1000 queries a second: valid; the parent's ~500 are not.)
    assert "servers = 1 (the parent, syn): no valid measurement" in tuned.stderr
    assert "parent's servers = 1 has no valid measurement" in _json(tuned)["steps"][0]["sentence"]


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
        # 1.5 ms against the parent's 2 ms: +33% QPS. Two blocks give a t interval on one
        # degree of freedom, so on a busy machine the winner may go unnamed (a tie, rightly),
        # but the resumed sweep's effect must still show the gain.
        row = next(r for r in outcome.document["values"] if r["value"] == 1.5)
        assert row["effect_pct"] is not None and row["effect_pct"] > 10, row
        assert outcome.document["winner"] in (1.5, None)
        # Another question (other blocks) is a new sweep, not this one resumed.
        other = sweep_knob(path, store, KnobOptions(**{**options.__dict__, "blocks": 1}), _Quiet())
        assert other.knob_sweep_id != first.id


def _spawn(folder: Path, db: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = [sys.executable, "-m", "optlab", "--db", f"sqlite:///{db}", *args]
    return subprocess.Popen(
        command, env=env, cwd=folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _cells(db: Path) -> int:
    if not db.exists():
        return 0
    # Read-only, the statement run to its end and the connection closed at once: a reader
    # that keeps its shared lock a moment longer can make the run's write wait past its
    # busy timeout on a loaded machine ("database is locked", exit 2).
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)) as con:
            rows = con.execute("select count(*) from knob_sweep_cells").fetchall()
        return int(rows[0][0])
    except sqlite3.OperationalError:
        return 0


def _interrupted(proc: subprocess.Popen[str], db: Path, cells: int) -> str:
    """Ctrl-C once `cells` cells are stored; asserts exit 130 and returns the stderr."""
    deadline = time.monotonic() + 120
    while _cells(db) < cells:
        assert time.monotonic() < deadline, f"{cells} cell(s) were never measured"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    return stderr


def test_ctrl_c_exits_130_keeps_the_cells_and_the_same_command_resumes(
    folder: Path, sqlite_url: str
) -> None:
    path = write(folder, "syn.yaml", PARENT)
    db = folder / "optlab.db"
    args = ("sweep-knob", "syn.yaml", "--knob", "service_ms", "--values", "1.5,3", "--blocks",
            "2", "--seed", "9", "--json", *FAST)
    _interrupted(_spawn(folder, db, *args), db, cells=2)
    with Store.open(sqlite_url) as store:
        (record,) = store.list_knob_sweeps()
        assert record.status == "KILLED" and len(record.cells) >= 2
        kept = {(c.block, c.arm): c.run_id for c in record.cells}
    again = _spawn(folder, db, *args)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert f"sweep-knob {record.id}: resuming (KILLED)" in err
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["knob_sweep_id"] == record.id and doc["winner"] == 1.5
    with Store.open(sqlite_url) as store:
        cells = {(c.block, c.arm): c.run_id for c in store.get_knob_sweep(record.id).cells}
    assert len(cells) == 6 and all(cells[k] == v for k, v in kept.items())
    assert path.is_file()


def test_ctrl_c_stops_a_tune_with_130_and_says_the_same_command_goes_on(folder: Path) -> None:
    write(folder, "syn.yaml", PARENT)
    db = folder / "optlab.db"
    args = ("tune", "syn.yaml", "--knobs", "service_ms", "--values", "service_ms=1.5,2",
            "--blocks", "2", "--seed", "9", *FAST)  # fmt: skip
    stderr = _interrupted(_spawn(folder, db, *args), db, cells=1)
    assert "tune: interrupted; every finished cell is stored, and the same command" in stderr
    again = _spawn(folder, db, *args)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert "sweep-knob 1: resuming (KILLED)" in err and "final: " in out


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--knobs", "service_ms,servers", "--values", "service_ms=1,2"), "no --values servers"),
        (("--knobs", "service_ms", "--values", "1,2"), "does not say which knob"),
        (("--knobs", "service_ms", "--values", "service_ms=1,2", "--values", "servers=1,2"),
         "which --knobs does not name"),
        (("--knobs", "service_ms,service_ms", "--values", "service_ms=1,2"), "twice"),
        (("--knobs", "service_mss", "--values", "service_mss=1,2"), "did you mean"),
        (("--knobs", "service_ms", "--values", "service_ms=1"), "is one value"),
    ],
)
def test_tune_refuses_bad_input_before_measuring(
    folder: Path, invoke: Invoke, sqlite_url: str, args: tuple[str, ...], said: str
) -> None:
    path = write(folder, "syn.yaml", PARENT)
    result = invoke("tune", str(path), *args, *FAST)
    assert result.exit_code == 2, result.output
    assert said in result.stderr
    with Store.open(sqlite_url) as store:
        assert store.list_runs() == []


def test_tune_chains_the_winners_and_checks_the_interaction(
    folder: Path, invoke: Invoke
) -> None:
    # QPS = servers / service_ms with 4 clients: the knobs' effects multiply (no interaction).
    path = write(folder, "syn.yaml", PARENT)
    result = invoke(
        "tune", str(path), "--knobs", "service_ms,servers", "--values", "service_ms=1,2",
        "--values", "servers=1,2", "--blocks", "1", "--seed", "1", "--json",
        # One block decides on each run's per-second windows: 2.5 s gives two (one degree of
        # freedom), too few to call even a 2x gain beside a busy neighbour; 4 s gives four.
        "--duration", "4", "--warmup", "0.3", "--quick",
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert problems("tune", doc) == []
    assert [s["purpose"] for s in doc["steps"]] == [
        "ofat", "ofat", "interaction check", "2x2", "2x2"
    ]
    # What each sweep found, for a failure to say why (a busy host has moved one before).
    said = [f"{s['purpose']} {s['knob']}: {s['sentence']}" for s in doc["steps"]]
    assert [s["promoted"] for s in doc["steps"][:2]] == [1, 2], said
    assert doc["flags"] == [], said
    # The model multiplies the effects (contrast 0); beside a busy neighbour the client's CPU
    # at 2,000/s bends that by several % (+6.6 to +7.6% in three runs beside `stress-ng --cpu 2`),
    # reported with its interval, and never a flag: both knobs prefer the same value at both.
    assert doc["interaction"] is not None and abs(doc["interaction"]["contrast_pct"]) < 25
    assert doc["interaction"]["flips"] is False
    final = Path(doc["final"])
    assert final.parent == folder and final.name == "02-servers-2.yaml"
    table = invoke("table", str(final), "--format", "json")
    rows = json.loads(table.stdout)["chain"]
    assert [r["variable"] for r in rows] == [None, "service_ms", "servers"]
    assert all(r["knob_sweep"] is not None for r in rows[1:])


def test_promoting_the_same_value_twice_writes_one_step_file(folder: Path, sqlite_url: str) -> None:
    """A finished sweep asked again is measured anew; its promotion names the step file the
    first one wrote instead of a second file of the same experiment."""
    path = write(folder, "syn.yaml", PARENT)
    options = KnobOptions(
        knob="service_ms", values="1,2", blocks=1, quick=True, duration_s=2.5, warmup_s=0.2,
        seed=2, promote=True,
    )  # fmt: skip
    with Store.open(sqlite_url) as store:
        first = sweep_knob(path, store, options, _Quiet())
        second = sweep_knob(path, store, options, _Quiet())
        assert second.knob_sweep_id != first.knob_sweep_id
        stored = store.get_knob_sweep(second.knob_sweep_id).result
    assert first.promoted == second.promoted == (folder / "01-service_ms-1.yaml").resolve()
    assert "a step beside the parent already" in second.notes[-1]
    assert stored is not None and stored["promoted"] == str(first.promoted)
    assert sorted(f.name for f in folder.glob("*.yaml")) == ["01-service_ms-1.yaml", "syn.yaml"]
    assert not list(folder.glob("knob-sweeps/*/*-1.yaml"))  # the sibling moved, as the first


class _StopInSecondSweep(_Quiet):
    """Ctrl-C in the second block of tune's second knob sweep (its first block measured)."""

    def __init__(self, stop: bool = True) -> None:
        self.armed = False
        self.stop = stop
        self.notes: list[str] = []

    def note(self, text: str) -> None:
        self.notes.append(text)
        if self.stop and text.startswith("tune: ofat: sweeping servers"):
            self.armed = True
        if self.armed and " block 2/3" in text:
            raise KeyboardInterrupt


def test_a_tune_asked_again_goes_on_where_it_stopped(folder: Path, sqlite_url: str) -> None:
    """The finished sweep is not measured again, the interrupted one resumes with its cells,
    and the promoted value stays one step file (a second file of the same experiment name
    would make every later command in the folder refuse it)."""
    path = write(folder, "syn.yaml", PARENT)
    options = TuneOptions(
        "service_ms,servers",
        ("service_ms=1,2", "servers=1,2"),
        25.0,  # the two knob sweeps (~16 s each), not the checks after them
        KnobOptions(
            knob="", values="", blocks=3, quick=True, duration_s=2.5, warmup_s=0.2, seed=1,
            tie_break="best",
        ),
    )  # fmt: skip
    with Store.open(sqlite_url) as store:
        with pytest.raises(KeyboardInterrupt):
            run_tune(path, store, options, _StopInSecondSweep())
        before = store.list_knob_sweeps()
        assert [r.status for r in before] == ["FINISHED", "KILLED"]
        assert len(before[0].cells) == 6 and len(before[1].cells) == 2
        progress = _StopInSecondSweep(stop=False)
        result, _ = run_tune(path, store, options, progress)
        after = store.list_knob_sweeps()
        assert [r.id for r in after] == [r.id for r in before]  # no sweep measured anew
        assert [r.status for r in after] == ["FINISHED", "FINISHED"]
        assert len(after[0].cells) == 6 and len(after[1].cells) == 6
        assert [s.document["knob_sweep_id"] for s in result.steps] == [r.id for r in before]
    assert any("answered before" in n for n in progress.notes)
    assert any("resuming (KILLED)" in n for n in progress.notes)
    said = [f"{s.purpose} {s.knob}: {s.document.get('sentence')}" for s in result.steps]
    assert [s.promoted for s in result.steps] == [1, 2], said
    assert result.final == (folder / "02-servers-2.yaml").resolve()
    names = [yaml.safe_load(f.read_text())["name"] for f in sorted(folder.glob("*.yaml"))]
    assert len(names) == 3 and len(set(names)) == 3, names


@not_root
def test_a_folder_it_cannot_write_is_refused_with_the_fix(
    folder: Path, invoke: Invoke, sqlite_url: str
) -> None:
    shelf = folder / "read-only"
    shelf.mkdir()
    path = write(shelf, "syn.yaml", PARENT)
    shelf.chmod(0o555)
    try:
        result = invoke("sweep-knob", str(path), "--knob", "service_ms", "--values", "1,3", *FAST)
    finally:
        shelf.chmod(0o755)
    assert result.exit_code == 2, result.output
    assert "cannot write the sibling steps" in result.stderr
    with Store.open(sqlite_url) as store:
        assert store.list_runs() == []
