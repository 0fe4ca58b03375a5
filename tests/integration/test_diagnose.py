"""`optlab diagnose` on real runs (docs/diagnose.md, docs/diagnose-json.md): quick runs of python
targets made GIL-bound (profiled), serialised on a lock, failing, or asleep, and the reference
classifier's baseline, each diagnosed through the CLI. What a busy machine cannot change is
asserted: the run is diagnosed, its JSON validates against docs/schemas, the notebook API returns
what the CLI prints, every finding shows its evidence, the states agree across forms, and a
`--write-step` that cannot write leaves the folder as it was. Which rule fires on which evidence
is the unit lane's (tests/unit/diagnose, on constructed and recorded evidence); here a recorded
run (tests/fixtures/diagnose) gives its declared remedy's step. Bad subjects are refused."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml

from optlab import api
from optlab.diagnose import diagnose_run
from optlab.reports.diagnose import render_diagnosis_html, run_line
from optlab.store import Store
from tests.support.diagnosing import (
    Invoke,
    diagnosed,
    experiment,
    last_json,
    run,
    single_server,
)
from tests.support.paths import FIXTURES, REPO
from tests.support.waits import wait_for_phase

STATES = ("healthy", "findings", "undecided", "no-data")


def shows_its_evidence(document: dict[str, Any]) -> None:
    """Every finding names its rule, bottleneck and confidence and shows the numbers it read;
    the state agrees with the findings."""
    for finding in document["findings"]:
        assert finding["evidence"] or finding["rule"] == "errors", finding  # stuck: no number
        assert 0 < finding["confidence"] <= 1 and finding["summary"], finding
        for measure in finding["evidence"]:
            assert measure["metric"] and measure["op"] in (">=", "<="), measure
    assert document["state"] in STATES
    assert (document["state"] == "findings") == bool(document["findings"]), document
    assert document["healthy"] is (document["state"] == "healthy"), document


def test_real_runs_are_diagnosed_with_their_evidence(
    invoke: Invoke, folder: Path, sqlite_url: str
) -> None:
    run(invoke, experiment(folder, "spin", "{mode: gil, loops: 20000}"), "--profile")
    spin = diagnosed(invoke, "spin")
    assert api.diagnosis(sqlite_url, "spin") == spin  # what a notebook gets
    assert spin["experiment"] == "spin" and spin["status"] == "FINISHED"
    shows_its_evidence(spin)
    text = invoke("diagnose", "spin").output
    assert text.startswith(f"run {spin['run_id']} · spin · FINISHED")
    assert "profile (py-spy, " in text  # --profile: the threads' samples beside the findings
    # A python target declares no remedies: advice in prose, never a knob.
    assert all(f["suggestion"] is None for f in spin["findings"]), spin["findings"]

    run(invoke, experiment(folder, "locked", "{mode: lock, hold_ms: 4}"))
    locked = diagnosed(invoke, "locked")
    assert api.diagnosis(sqlite_url, "locked") == locked
    shows_its_evidence(locked)
    text = invoke("diagnose", "locked").output
    for finding in locked["findings"]:  # the text shows each finding the JSON holds
        assert f"{finding['title']} (confidence {finding['confidence']:.2f})" in text


def test_healthy_failing_and_partial_runs(invoke: Invoke, folder: Path) -> None:
    run(invoke, experiment(folder, "calm", "{mode: sleep, sleep_ms: 20}"))
    calm = diagnosed(invoke, "calm")
    shows_its_evidence(calm)
    text = invoke("diagnose", "calm").output
    assert ("healthy: no rule fired" in text) is (calm["state"] == "healthy"), text

    # Every other request raises: an error rate of about half, whatever the machine did.
    run(invoke, experiment(folder, "broken", "{mode: fail, sleep_ms: 1}"))
    broken = diagnosed(invoke, "broken")
    shows_its_evidence(broken)
    assert broken["partial"] and "INVALID" in broken["partial_reason"]  # error rate: INVALID
    errors = next(f for f in broken["findings"] if f["rule"] == "errors")
    assert errors["bottleneck"]["resource"] == "errors"
    rate = errors["evidence"][0]
    assert rate["metric"] == "error rate" and 40 <= rate["value"] <= 60


def test_bad_subjects_exit_2_with_a_hint(invoke: Invoke, folder: Path) -> None:
    nothing = invoke("diagnose")
    assert nothing.exit_code == 2 and "there is no optlab database" in nothing.stderr
    # An experiment stored (by `optlab diff`) but never measured.
    path = experiment(folder, "fresh", "{mode: sleep, sleep_ms: 1}")
    assert invoke("diff", str(path)).exit_code == 0
    empty = invoke("diagnose")
    assert empty.exit_code == 2 and "no runs" in empty.stderr and "optlab run" in empty.stderr
    missing = invoke("diagnose", "99")
    assert missing.exit_code == 2 and "run 99 does not exist" in missing.stderr
    never = invoke("diagnose", "fresh")
    assert never.exit_code == 2 and "has no runs yet" in never.stderr
    assert "optlab run" in never.stderr
    typo = invoke("diagnose", "frsh")
    assert typo.exit_code == 2 and "did you mean 'fresh'" in typo.stderr
    gone = invoke("diagnose", "nowhere/base.yaml")
    assert gone.exit_code == 2 and "nowhere/base.yaml: no such file" in gone.stderr
    sweep = invoke("diagnose", "sweep:x")
    assert sweep.exit_code == 2 and "sweep:3" in sweep.stderr
    assert invoke("diagnose", "sweep:7").exit_code == 2


def test_the_reference_baseline_is_diagnosed_where_it_is_shown(
    invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sqlite_url: str
) -> None:
    folder = tmp_path / "cpu"
    shutil.copytree(REPO / "experiments" / "cpu", folder)
    monkeypatch.chdir(tmp_path)
    # 8 s: >= 662 queries at ~100/s or more; a slow shared machine's INVALID run still reads.
    quick = ("--quick", "--duration", "8", "--warmup", "0.5", "--allow-invalid")
    measured = invoke("run", str(folder / "baseline.yaml"), *quick)
    assert measured.exit_code == 0, measured.output
    document = diagnosed(invoke, "cpu-baseline")
    assert api.diagnosis(sqlite_url, "cpu-baseline") == document
    shows_its_evidence(document)
    # `optlab run` printed this diagnosis's line under the run, and the report shows it.
    with Store.open(sqlite_url) as store:
        stored = diagnose_run(store, document["run_id"])
    assert stored.to_json() == {**document, "source": None}  # the CLI says how it chose
    assert f"  {run_line(stored, stored.knobs)}" in measured.stderr, measured.stderr
    report = tmp_path / "report.html"
    assert invoke("report", "cpu-baseline", "--html", str(report)).exit_code == 0
    html = report.read_text("utf-8")
    assert render_diagnosis_html([("cpu-baseline", stored)]) in html
    # The classifier's knobs are its kind's: whatever fired, a suggestion names one of them.
    knobs = yaml.safe_load((folder / "baseline.yaml").read_text("utf-8"))["knobs"]
    for finding in document["findings"]:
        assert finding["suggestion"] is None or finding["suggestion"]["knob"] in knobs, finding

    # A target whose knobs optlab does not know and that declares no remedies: no file.
    python_target = experiment(folder, "spin", "{mode: sleep, sleep_ms: 1}")
    monkeypatch.syspath_prepend(str(folder))
    run(invoke, python_target)
    before = sorted(p.name for p in folder.iterdir())
    refused = invoke("diagnose", "spin", "--write-step")
    assert refused.exit_code == 2
    assert sorted(p.name for p in folder.iterdir()) == before


def test_a_saturated_open_loop_run_is_the_targets(invoke: Invoke, folder: Path) -> None:
    # A lock held 4 ms a request (at most ~250/s) offered 600/s: the backlog grows, and the
    # verdict says so; the diagnosis reads its reason's code, never the generator.
    path = experiment(
        folder, "flooded", "{mode: lock, hold_ms: 4}", "{mode: open, rate: 600, arrival: poisson}"
    )
    run(invoke, path)
    document = diagnosed(invoke, "flooded")
    shows_its_evidence(document)
    assert document["valid"] is False and "saturated" in document["partial_reason"], document
    rules = [f["rule"] for f in document["findings"]]
    assert "load-generator" not in rules, document["findings"]
    saturated = next(f for f in document["findings"] if f["rule"] == "saturated")
    assert saturated["bottleneck"]["resource"] == "queue"


# -- a recorded run ------------------------------------------------------------------------------

RECORDED = FIXTURES / "diagnose"


def test_a_declared_remedy_writes_its_step(
    invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A python target serialised on a lock whose file declares {rule: serialised, knob:
    # workers, increment: 1, max: 8}, measured once and exported (tests/fixtures/diagnose).
    monkeypatch.chdir(tmp_path)
    imported = invoke("import", str(RECORDED / "declared-remedy.jsonl"))
    assert imported.exit_code == 0, imported.output
    document = diagnosed(invoke, "locked")
    serialised = next(f for f in document["findings"] if f["rule"] == "serialised")
    assert serialised["suggestion"] == {
        "knob": "workers",
        "value": 3,
        "why": "another worker takes requests while one waits",
    }
    assert "next step: workers: 2 -> 3" in invoke("diagnose", "locked").output
    # Its file was on another machine: the step goes where --output says.
    wrote = invoke("diagnose", "locked", "--write-step", "--output", "next.yaml")
    assert wrote.exit_code == 0, wrote.output
    step = yaml.safe_load((tmp_path / "next.yaml").read_text("utf-8"))
    assert step["parent"] == "locked" and step["change"] == {"workers": 3}, step
    assert step["hypothesis"].startswith("diagnosis serialised: "), step


def test_remedies_declared_after_a_run_keep_the_experiment(
    invoke: Invoke, folder: Path, sqlite_url: str
) -> None:
    # Measure first, then declare what diagnose should suggest: remedies are advice, not a
    # measured variable, so the file is not refused as an edited stored config; the hash and
    # the runs stay, and the stored config takes the remedies (docs/experiment-files.md).
    path = experiment(folder, "asleep", "{mode: sleep, sleep_ms: 1}")
    run(invoke, path)
    store = Store.open(sqlite_url)
    before = store.get_experiment("asleep")
    assert before is not None and before.current_config is not None
    remedy = {"rule": "serialised", "knob": "sleep_ms", "multiply": 0.5, "why": "sleep less"}
    spec = yaml.safe_load(path.read_text("utf-8"))
    spec["target"]["remedies"] = [remedy]
    path.write_text(yaml.safe_dump(spec), "utf-8")
    diffed = invoke("diff", str(path))
    assert diffed.exit_code == 0, diffed.output
    assert "config of asleep: remedies updated" in diffed.output, diffed.output
    after = store.get_experiment("asleep")
    assert after is not None and after.current_config is not None
    assert after.current_config.id == before.current_config.id
    assert after.current_config.config_hash == before.current_config.config_hash
    stored = after.current_config.config["target"]["remedies"]
    assert [r["knob"] for r in stored] == ["sleep_ms"], stored
    assert store.count_runs("asleep") == 1
    # The same file again: nothing to update. A measured variable still is refused.
    assert "remedies updated" not in invoke("diff", str(path)).output
    spec["knobs"]["sleep_ms"] = 2
    path.write_text(yaml.safe_dump(spec), "utf-8")
    refused = invoke("diff", str(path))
    assert refused.exit_code == 2 and "knobs.sleep_ms: 1 -> 2" in refused.output, refused.output


def test_running_and_killed_runs_are_diagnosed_as_partial(
    synth: Path, invoke: Invoke, sqlite_url: str, tmp_path: Path
) -> None:
    from tests.support.proc import start_optlab

    db = Path(sqlite_url.removeprefix("sqlite:///"))
    args = ["run", str(synth / "baseline.yaml"), "--quick", "--duration", "60", "--warmup", "0.3"]
    # The child's output goes to files: a pipe nobody reads while it runs fills on a slow
    # machine and stalls the run.
    with (tmp_path / "out.txt").open("w") as out, (tmp_path / "err.txt").open("w") as err:
        proc = start_optlab(*args, db=db, stdout=out, stderr=err)
        try:
            run_id = wait_for_phase(db, "measure", timeout_s=120)
            running = diagnosed(invoke, str(run_id))
            assert running["status"] == "RUNNING" and running["partial"]
            assert "still RUNNING" in running["partial_reason"]
            # What it can still say: the windows written so far are there; the stage breakdown
            # comes at the end, so the rules that need it say what they lack (the CPU samples
            # too, when the sampler has not flushed yet on a busy machine), and nothing is
            # called healthy meanwhile.
            missing = {entry["rule"]: entry["missing"] for entry in running["not_evaluated"]}
            assert missing["cpu-bound"].startswith(("no stage timings", "no CPU samples"))
            assert not running["healthy"] and running["state"] in ("undecided", "findings")
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
    assert proc.returncode == 130, (tmp_path / "err.txt").read_text()
    killed = diagnosed(invoke, str(run_id))
    assert killed["status"] == "KILLED" and killed["partial"]
    assert "KILLED" in killed["partial_reason"] and "before it stopped" in killed["partial_reason"]
    text = invoke("diagnose", str(run_id)).output
    assert "partial evidence: the run was KILLED" in text


def test_a_sweep_is_diagnosed_at_its_knee_or_busiest_level(
    invoke: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = single_server(tmp_path, "slow", ms=1)  # one server: ~1,000 queries in a 1 s level
    swept = invoke(
        "sweep", str(path), "--slo", "p99=0.5ms", "--quick", "--level-duration", "1", "--json"
    )
    assert swept.exit_code == 0, swept.output
    sweep = last_json(swept)
    assert sweep["knee_qps"] is None  # no rate met the SLO: the busiest level is read
    busiest = max(sweep["levels"], key=lambda level: level["achieved_qps"] or 0)
    document = diagnosed(invoke, f"sweep:{sweep['sweep_id']}")
    assert document["run_id"] == busiest["run_id"]
    assert document["source"] == f"sweep {sweep['sweep_id']}: its busiest level (no knee was found)"
