"""`optlab import` checks a bundle as if its runs were measured here: real bundles written by
`optlab export` from real runs, tampered with as a careless or hostile hand would, imported by
the real command into a real SQLite file. Every refusal exits 2, names the file, line, run and
field with the fix, and stores nothing (the database is not even created)."""

from __future__ import annotations

import base64
import json
import math
import os
import shutil
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from optlab.cli.main import cli
from optlab.config.loading import config_hash
from optlab.store import Store
from tests.support.proc import run_optlab

Edit = Callable[[list[dict[str, Any]]], None]


@pytest.fixture
def exported(
    synthetic_chain: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """A bundle of the synthetic chain's two runs (baseline, faster service), as `optlab
    export` writes it; the working directory is its folder."""
    _, database = synthetic_chain
    shutil.copy(database, tmp_path / "measured.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPTLAB_DB", raising=False)
    done = optlab(f"sqlite:///{tmp_path / 'measured.db'}", "export", "--all", "-o", "runs.jsonl")
    assert done.exit_code == 0, done.output
    return tmp_path / "runs.jsonl"


def optlab(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--db", url, *args], catch_exceptions=False)


def tampered(source: Path, edit: Edit, name: str = "tampered.jsonl") -> Path:
    header, *lines = source.read_text().splitlines()
    runs = [json.loads(line) for line in lines]
    edit(runs)
    path = source.with_name(name)
    # json.dumps writes NaN and Infinity as such (not JSON, but what Python's reader accepts).
    path.write_text("\n".join([header, *(json.dumps(run) for run in runs)]) + "\n")
    return path


def refused(path: Path, *expected: str) -> Result:
    """Import `path` into a new database: refused with exit 2, every `expected` text in the
    message, and no database created."""
    team = path.with_name("team.db")
    result = optlab(f"sqlite:///{team}", "import", path.name)
    assert result.exit_code == 2, result.output
    for text in expected:
        assert text in result.stderr, result.stderr
    assert "unexpected error" not in result.stderr
    assert not team.exists()  # nothing stored: the database was never opened
    return result


def scaled(run: dict[str, Any], factor: float) -> None:
    run["run"]["qps"] *= factor
    run["run"]["requests"] = int(run["run"]["requests"] * factor)


def test_the_untouched_bundle_imports_and_reads_back(exported: Path) -> None:
    team = f"sqlite:///{exported.with_name('team.db')}"
    result = optlab(team, "import", exported.name)
    assert result.exit_code == 0, result.output
    assert "2 runs: 2 imported" in result.stdout
    log = optlab(team, "log", "--json")
    assert log.exit_code == 0
    runs = [json.loads(line) for line in log.stdout.splitlines()]  # strict JSON, one a line
    assert [run["requests"] for run in runs] == [
        json.loads(line)["run"]["requests"] for line in exported.read_text().splitlines()[1:]
    ]


def test_totals_that_the_histograms_contradict_are_refused(exported: Path) -> None:
    line = json.loads(exported.read_text().splitlines()[2])
    uid = line["run"]["uid"]

    def step_times_ten(runs: list[dict[str, Any]]) -> None:
        scaled(runs[1], 10)  # run.qps and run.requests x10, the histograms untouched

    result = refused(
        tampered(exported, step_times_ten),
        "tampered.jsonl:3: run " + uid,
        "run.requests is",
        "measured 'total' histogram holds",
        "nothing was imported",
        "export the run again",
    )
    assert "hint:" in result.stderr

    def qps_only(runs: list[dict[str, Any]]) -> None:
        runs[1]["run"]["qps"] *= 10
        runs[1]["run"]["summary"]["qps"] *= 10

    refused(tampered(exported, qps_only), "run.qps is", "requests over run.duration_s")

    def summary_only(runs: list[dict[str, Any]]) -> None:
        runs[0]["run"]["summary"]["qps"] *= 10

    refused(tampered(exported, summary_only), "run.summary.qps is")


def test_percentiles_that_the_histograms_contradict_are_refused(exported: Path) -> None:
    def halve_row(runs: list[dict[str, Any]]) -> None:
        for row in runs[0]["stage_stats"]:
            if (row["stage"], row["phase"]) == ("total", "measure"):
                row["p99_ms"] /= 2

    refused(tampered(exported, halve_row), "stage_stats 'total' (measure).p99_ms is")

    def halve_summary(runs: list[dict[str, Any]]) -> None:
        runs[0]["run"]["summary"]["latency_ms"]["total"]["p99"] /= 2

    refused(tampered(exported, halve_summary), "run.summary.latency_ms.total.p99 is")

    def swap_histograms(runs: list[dict[str, Any]]) -> None:
        # The baseline's measured histogram in the step's row: counts and figures disagree.
        mine = next(r for r in runs[1]["stage_stats"] if r["stage"] == "total")
        theirs = next(r for r in runs[0]["stage_stats"] if r["stage"] == "total")
        mine["histogram"] = theirs["histogram"]

    refused(tampered(exported, swap_histograms), "but its histogram holds")

    def windows_times_ten(runs: list[dict[str, Any]]) -> None:
        # The measured phase's only: a run with warmup windows is checked there first.
        for window in (w for w in runs[1]["windows"] if w["phase"] == "measure"):
            window["qps"] *= 10
            window["completed"] *= 10

    refused(tampered(exported, windows_times_ten), "measure windows count", "completed requests")

    def slower_seconds(runs: list[dict[str, Any]]) -> None:
        for window in runs[1]["windows"]:
            window["p99_ms"] = 10_000.0

    refused(tampered(exported, slower_seconds), ".p99_ms is 10000.0, above the largest value")


def test_a_histogram_that_would_inflate_to_gigabytes_is_refused(exported: Path) -> None:
    # A valid header with 64 MB of zero counts behind it: ~64 kB compressed.
    header = struct.pack(">IIIIQQd", 0x1C849313, 64 << 20, 0, 3, 1_000, 3_600 * 10**9, 1.0)
    payload = zlib.compress(header + bytes(64 << 20), 9)
    blob = struct.pack(">II", 0x1C849314, len(payload)) + payload
    bomb = base64.b64encode(blob).decode()

    def plant(runs: list[dict[str, Any]]) -> None:
        runs[0]["stage_stats"][0]["histogram"] = bomb

    refused(tampered(exported, plant), "inflates beyond any histogram optlab records")

    def other_settings(runs: list[dict[str, Any]]) -> None:
        small = struct.pack(">IIIIQQd", 0x1C849313, 0, 0, 2, 1, 10**18, 1.0)
        packed = zlib.compress(small)
        runs[0]["stage_stats"][0]["histogram"] = base64.b64encode(
            struct.pack(">II", 0x1C849314, len(packed)) + packed
        ).decode()

    refused(tampered(exported, other_settings), "not optlab's")


def test_a_config_that_is_not_its_hash_is_refused(exported: Path) -> None:
    def slower_baseline(runs: list[dict[str, Any]]) -> None:
        for run in runs:
            run["experiments"][0]["config"]["knobs"]["service_ms"] = 20.0

    refused(
        tampered(exported, slower_baseline),
        "experiments[0] ('synthetic-baseline').config_hash",
        "is not the hash of its config",
    )

    def rehashed_baseline(runs: list[dict[str, Any]]) -> None:
        # The baseline's hash recomputed: the step's parent_config_hash no longer matches.
        slower_baseline(runs)
        for run in runs:
            run["experiments"][0]["config_hash"] = config_hash(run["experiments"][0]["config"])
        runs[0]["run"]["config_hash"] = runs[0]["experiments"][0]["config_hash"]

    refused(tampered(exported, rehashed_baseline), "parent_config_hash")

    def step_changes_the_workload(runs: list[dict[str, Any]]) -> None:
        step = runs[1]["experiments"][1]
        step["config"]["workload"]["load"]["concurrency"] = 64
        step["config_hash"] = runs[1]["run"]["config_hash"] = config_hash(step["config"])

    refused(
        tampered(exported, step_changes_the_workload), "differs from its parent's beyond the knobs"
    )

    def change_says_otherwise(runs: list[dict[str, Any]]) -> None:
        runs[1]["experiments"][1]["change"] = {"sigma": 0.9}  # the config changes service_ms

    refused(tampered(exported, change_says_otherwise), "changes knob 'service_ms', but its change")

    def two_knobs(runs: list[dict[str, Any]]) -> None:
        step = runs[1]["experiments"][1]
        step["config"]["knobs"]["sigma"] = 0.9
        step["config_hash"] = runs[1]["run"]["config_hash"] = config_hash(step["config"])

    refused(
        tampered(exported, two_knobs), "changes 2 knobs against its parent", "a step changes one"
    )

    def not_a_config(runs: list[dict[str, Any]]) -> None:
        config = runs[0]["experiments"][0]["config"]
        config["workload"]["load"]["concurrency"] = -3
        runs[0]["experiments"][0]["config_hash"] = config_hash(config)
        runs[0]["run"]["config_hash"] = config_hash(config)

    refused(tampered(exported, not_a_config), "config does not fit this optlab")


def test_non_finite_and_oversized_numbers_are_refused(exported: Path) -> None:
    nan, inf = "run.qps: NaN is not a finite number", "run.qps: Infinity is not a finite"
    for value, said in ((math.nan, nan), (math.inf, inf)):

        def plant(runs: list[dict[str, Any]], value: float = value) -> None:
            runs[0]["run"]["qps"] = value

        refused(tampered(exported, plant), "tampered.jsonl:2: malformed run bundle", said)

    def errors_beyond_64_bits(runs: list[dict[str, Any]]) -> None:
        runs[0]["run"]["errors"] = 10**30

    refused(tampered(exported, errors_beyond_64_bits), "run.errors: 1e+30 is beyond a 64-bit")

    def errors_without_rows(runs: list[dict[str, Any]]) -> None:
        runs[0]["run"]["errors"] = runs[0]["run"]["summary"]["errors"] = 10**6

    refused(tampered(exported, errors_without_rows), "run.errors is 1000000, but its error rows")

    def negative_window(runs: list[dict[str, Any]]) -> None:
        runs[0]["windows"][0]["completed"] = -5

    refused(tampered(exported, negative_window), "windows[0].completed is -5, outside 0..")


def test_unknown_enums_and_names_that_break_the_rules_are_refused(exported: Path) -> None:
    def phase(runs: list[dict[str, Any]]) -> None:
        runs[0]["windows"][0]["phase"] = "cooldown"

    refused(tampered(exported, phase), "windows[0].phase 'cooldown' is not one of warmup, measure")

    def status(runs: list[dict[str, Any]]) -> None:
        runs[0]["run"]["status"] = "GREAT"

    refused(tampered(exported, status), "run.status 'GREAT' is not one of")

    for name in ("x" * 5000, "../../etc/evil"):

        def rename(runs: list[dict[str, Any]], name: str = name) -> None:
            for run in runs:
                run["experiments"][0]["name"] = name
                if len(run["experiments"]) > 1:
                    run["experiments"][1]["parent"] = name
            runs[0]["run"]["experiment"] = name

        refused(tampered(exported, rename), "is not an experiment name", "experiment files keep")

    def long_stage(runs: list[dict[str, Any]]) -> None:
        runs[0]["stage_stats"][0]["stage"] = "s" * 5000

    refused(tampered(exported, long_stage), "stage_stats[0].stage is 5,000 characters")

    def fingerprint(runs: list[dict[str, Any]]) -> None:
        runs[0]["environment"]["fingerprint"]["cpu_count"] = 512

    refused(tampered(exported, fingerprint), "environment.fingerprint_hash", "was changed")

    def material(runs: list[dict[str, Any]]) -> None:
        runs[1]["environment"]["material_hash"] = "0" * 64  # would hide a change of machine

    refused(tampered(exported, material), "tampered.jsonl:3: run", "environment.material_hash")


def test_one_bad_run_refuses_the_whole_bundle(exported: Path) -> None:
    """Refusing all is the rule (docs/bundles.md): half a chain stored would make the next
    step's comparison against a baseline the user did not mean."""

    def bad_step(runs: list[dict[str, Any]]) -> None:
        scaled(runs[1], 10)

    path = tampered(exported, bad_step)
    team = path.with_name("team.db")
    with Store.open(f"sqlite:///{team}") as store:
        store.list_runs()  # an existing, empty database
    result = optlab(f"sqlite:///{team}", "import", path.name, exported.name)
    assert result.exit_code == 2 and "tampered.jsonl:3" in result.stderr
    with Store.open(f"sqlite:///{team}") as store:
        assert store.list_runs() == [] and store.list_experiments() == []


def test_files_that_are_not_regular_or_too_large_are_refused(
    exported: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = exported.parent
    (folder / "zero.jsonl").symlink_to("/dev/zero")
    refused(folder / "zero.jsonl", "zero.jsonl: is a character device, not a run bundle")
    (folder / "dir.jsonl").mkdir()
    result = optlab(f"sqlite:///{folder / 'team.db'}", "import", "dir.jsonl")
    assert result.exit_code == 2 and "dir.jsonl" in result.stderr
    (folder / "link.jsonl").symlink_to(exported.name)  # a symlink to a bundle reads as one
    assert optlab(f"sqlite:///{folder / 'ok.db'}", "import", "link.jsonl").exit_code == 0

    big = folder / "big.jsonl"
    big.write_bytes(exported.read_bytes() + b"\n" * (2 << 20))
    monkeypatch.setenv("OPTLAB_MAX_BUNDLE_MIB", "1")
    refused(
        big,
        "larger than the 1,048,576-byte limit",
        "export fewer runs per file",
        "OPTLAB_MAX_BUNDLE_MIB",
    )


def test_a_fifo_is_refused_not_waited_on(exported: Path) -> None:
    # A subprocess, so that a regression blocks it (killed by the timeout), not the test run.
    os.mkfifo(exported.with_name("fifo.jsonl"))
    done = run_optlab("import", "fifo.jsonl", db="sqlite:///team.db", cwd=exported.parent)
    assert done.returncode == 2, done.stderr
    assert "fifo.jsonl: is a FIFO (named pipe), not a run bundle" in done.stderr
    assert not exported.with_name("team.db").exists()


def test_a_pending_run_is_checked_too(exported: Path) -> None:
    """A pending bundle is stored by the next command only if it holds up; else it stays,
    reported, and the command goes on."""
    team = exported.with_name("team.db")
    url = f"sqlite:///{team}"
    assert optlab(url, "import", exported.name).exit_code == 0
    pending = exported.parent / ".optlab" / "pending"
    pending.mkdir(parents=True, mode=0o700)
    header, first, _ = exported.read_text().splitlines()
    line = json.loads(first)
    line["run"]["uid"] = "f" * 32  # a new run, as a refused final write leaves one
    scaled(line, 10)
    source = json.loads(header)
    source["source"] = url
    bad = pending / f"{'f' * 32}.jsonl"
    bad.write_text(json.dumps(source) + "\n" + json.dumps(line) + "\n")
    log = optlab(url, "log")
    assert log.exit_code == 0
    assert f"pending run bundle .optlab/pending/{bad.name} not stored" in log.stderr
    assert "run.requests is" in log.stderr
    assert bad.exists()
    with Store.open(url) as store:
        assert len(store.list_runs()) == 2


def test_export_of_a_run_id_beyond_any_integer(exported: Path) -> None:
    url = f"sqlite:///{exported.with_name('measured.db')}"
    for text in ("99999999999999999999999", "0", "-4"):
        result = optlab(url, "export", "--runs", text, "-o", "out.jsonl")
        assert result.exit_code == 2, result.output
        assert f"run {text} does not exist" in result.stderr
    assert not exported.with_name("out.jsonl").exists()


def test_a_deep_or_huge_line_is_malformed_not_a_crash(exported: Path) -> None:
    header = exported.read_text().splitlines()[0]
    deep = exported.with_name("deep.jsonl")
    deep.write_text(header + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    refused(deep, "deep.jsonl:2: malformed run bundle")
    for depth in (150, 900, 990):  # within what Python's reader takes, beyond what optlab does
        text = json.dumps(json.loads(exported.read_text().splitlines()[1])).replace(
            '"protocol": {', '"protocol": {"deep": ' + "[" * depth + "]" * depth + ", ", 1
        )
        deep.write_text(header + "\n" + text + "\n")
        refused(deep, "deep.jsonl:2: malformed run bundle", "deep")
    digits = exported.with_name("digits.jsonl")
    line = json.loads(exported.read_text().splitlines()[1])
    text = json.dumps(line).replace('"errors": 0', '"errors": ' + "9" * 5000, 1)
    digits.write_text(header + "\n" + text + "\n")
    refused(digits, "digits.jsonl:2: malformed run bundle")


def test_genuine_runs_of_other_kinds_import_unrefused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks refuse no honest run: an open loop with failed requests (error rows, windows
    with errors) and a FAILED run with no request, exported and imported as they are."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPTLAB_DB", raising=False)
    (tmp_path / "open.yaml").write_text(
        "name: open-errors\ntarget: {kind: builtin, name: synthetic}\n"
        "knobs: {distribution: lognormal, service_ms: 2.0, sigma: 0.3, error_rate: 0.05}\n"
        "workload:\n  load: {mode: open, rate: 300}\nprotocol: {name: quick}\n"
    )
    (tmp_path / "broken.py").write_text("def factory(knobs):\n    raise RuntimeError('boom')\n")
    (tmp_path / "fails.yaml").write_text(
        "name: fails\ntarget: {kind: python, factory: 'broken:factory'}\n"
        "workload:\n  load: {mode: closed, concurrency: 1}\nprotocol: {name: quick}\n"
    )
    measured = f"sqlite:///{tmp_path / 'measured.db'}"
    for name in ("open.yaml", "fails.yaml"):
        ran = optlab(measured, "run", name, "--quick", "--duration", "2", "--warmup", "0.2")
        assert ran.exit_code in (0, 1, 2, 4), ran.output
    with Store.open(measured) as store:
        runs = store.list_runs()
    assert [(r.experiment, r.status) for r in runs] == [
        ("open-errors", "FINISHED"),
        ("fails", "FAILED"),
    ]
    assert runs[0].errors and runs[0].requests and not runs[1].requests
    assert optlab(measured, "export", "--all", "-o", "runs.jsonl").exit_code == 0
    team = f"sqlite:///{tmp_path / 'team.db'}"
    imported = optlab(team, "import", "runs.jsonl")
    assert imported.exit_code == 0, imported.output
    assert "2 runs: 2 imported" in imported.stdout
    with Store.open(team) as store:
        assert [(r.requests, r.errors, r.qps) for r in store.list_runs()] == [
            (r.requests, r.errors, r.qps) for r in runs
        ]
