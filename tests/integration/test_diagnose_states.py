"""`optlab diagnose` on runs it must not call healthy and on what it writes, with real runs:
a FAILED run without a request, one KILLED in its warmup, one whose process died while RUNNING
(no data; abandoned), a run id past the database's range (refused), and `--write-step` beside
an experiment file only when the file is here (docs/diagnose.md "States"). That the synthetic
example's lognormal service time is neither a lock nor GIL-bound is a rule's identity: the unit
lane's (tests/unit/test_diagnose_verdict.py, on the same service times constructed)."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from optlab.diagnose import RULES
from tests.support.diagnosing import Invoke, diagnosed, experiment, run
from tests.support.files import write
from tests.support.waits import wait_for_phase


def test_failed_killed_and_abandoned_runs_without_requests_are_no_data(
    synth: Path, invoke: Invoke, sqlite_url: str, tmp_path: Path, folder: Path
) -> None:
    from tests.support.proc import start_optlab

    # A target whose build fails: a FAILED run, no request.
    code = "def build(knobs):\n    raise RuntimeError('no model')\n\n\n"
    code += "def inputs(w):\n    return [1]\n"
    write(folder, "nobuild.py", code)
    path = write(
        folder,
        "nobuild.yaml",
        "name: nobuild\n"
        "target: {kind: python, factory: 'nobuild:build', inputs: 'nobuild:inputs'}\n"
        "workload: {load: {mode: closed, concurrency: 1}}\nprotocol: {name: quick}\n",
    )
    invoke("run", str(path), "--quick", "--duration", "1")
    failed = diagnosed(invoke, "nobuild")
    assert failed["status"] == "FAILED", failed
    assert failed["state"] == "no-data" and not failed["healthy"] and not failed["findings"]
    assert "FAILED" in failed["state_reason"]
    text = invoke("diagnose", "nobuild").output
    assert "no data: " in text and "healthy" not in text

    db = Path(sqlite_url.removeprefix("sqlite:///"))
    args = ["run", str(synth / "baseline.yaml"), "--quick", "--duration", "60", "--warmup", "60"]
    for how in (signal.SIGINT, signal.SIGKILL):  # KILLED in its warmup; gone without a word
        with (tmp_path / "err.txt").open("w") as err:
            proc = start_optlab(*args, db=db, stdout=subprocess.DEVNULL, stderr=err)
            try:
                run_id = wait_for_phase(db, "warmup")
            finally:
                proc.send_signal(how)
                proc.wait(timeout=120)
        document = diagnosed(invoke, str(run_id))
        assert document["state"] == "no-data" and not document["healthy"], document
        if how == signal.SIGKILL:
            assert document["status"] == "RUNNING"
            assert "abandoned" in document["partial_reason"]
            assert f"pid {proc.pid}" in document["partial_reason"]
        else:
            assert document["status"] == "KILLED"


def test_a_run_id_past_the_database_range_is_refused(invoke: Invoke, folder: Path) -> None:
    path = experiment(folder, "fresh", "{mode: sleep, sleep_ms: 1}")
    assert invoke("diff", str(path)).exit_code == 0
    huge = invoke("diagnose", "99999999999999999999999")
    assert huge.exit_code == 2 and "run 99999999999999999999999 does not exist" in huge.stderr
    assert "unexpected" not in huge.stderr and "optlab log" in huge.stderr


def test_a_step_is_written_only_beside_a_file_here(
    invoke: Invoke, folder: Path, sqlite_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    from optlab.diagnose import diagnose_run
    from optlab.diagnose.diagnosis import Finding
    from optlab.diagnose.remedies import Suggestion
    from optlab.diagnose.subject import measure_command, write_next_step
    from optlab.errors import ConfigError
    from optlab.store import Store

    path = experiment(folder, "calm", "{mode: sleep, sleep_ms: 1}")
    run(invoke, path)  # --quick --duration 3 --warmup 0.5
    # Whatever the machine made of the run, a finding with a knob to change:
    change = Suggestion("batching", {"mode": "dynamic"}, "a test's change")
    with Store.open(sqlite_url) as store:
        found = diagnose_run(store, 1)
        rule = next(r for r in RULES if r.id == "queueing")
        finding = Finding(rule, "queue", 0.9, (), "requests queue", change, "")
        diagnosis = replace(found, findings=(finding,))
        written = write_next_step(store, diagnosis, "optlab diagnose calm")
        assert written.parent == folder and written.is_file()
        assert measure_command(store, 1, written).endswith("--quick --duration 3 --warmup 0.5")
        written.unlink()
    # The database carried to another folder (an import's run names a file of elsewhere):
    away = tmp_path_factory.mktemp("away")
    copy = away / "optlab.db"
    with (
        sqlite3.connect(sqlite_url.removeprefix("sqlite:///")) as source,
        sqlite3.connect(copy) as to,
    ):
        source.backup(to)
    before = sorted(p.name for p in folder.iterdir())
    with (
        pytest.MonkeyPatch.context() as patch,
        Store.open(f"sqlite:///{away / 'optlab.db'}") as other,
    ):
        patch.chdir(away)
        with pytest.raises(ConfigError, match="is not here") as refused:
            write_next_step(other, diagnosis, "optlab diagnose calm")
        assert "--output" in (refused.value.hint or "")
        assert sorted(p.name for p in folder.iterdir()) == before  # nothing beside the file
        placed = write_next_step(other, diagnosis, "optlab diagnose calm", away / "next.yaml")
        assert placed == away / "next.yaml" and placed.is_file()
