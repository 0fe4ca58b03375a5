"""Real output against the contract in docs/: `run --json` and `table --format json` of a
real chain validate against docs/schemas/, and every exit code docs/exit-codes.md documents is
one optlab produces. The schemas and the docs' examples themselves: tests/unit/test_docs.py."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from optlab.cli.main import EXIT_INTERRUPTED
from optlab.reports.table_json import ProtocolInfo
from tests.support.files import write
from tests.support.paths import REPO
from tests.support.schemas import problems

DOCS = REPO / "docs"

BASELINE = """\
name: docs-baseline
target: {kind: builtin, name: synthetic}
knobs: {distribution: fixed, service_ms: 1.0}
workload:
  load: {mode: closed, concurrency: 2}
# A short run on a shared machine: the halves may differ; this test checks shapes, not noise.
protocol: {name: quick, stability_pct: 100}
"""
STEP = "name: docs-faster\nparent: docs-baseline\nchange: {service_ms: 0.5}\n"
ERRORS = "name: docs-errors\nparent: docs-faster\nchange: {error_rate: 0.5}\n"
BROKEN = """\
name: docs-broken
target: {kind: python, factory: "docs_broken_target:build"}
workload:
  load: {mode: closed, concurrency: 1}
protocol: {name: quick}
"""
QUICK = ("--quick", "--warmup", "0.5", "--duration", "2", "--json")


def json_lines(result: Result) -> list[dict[str, Any]]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def documented_exit_codes() -> set[int]:
    text = (DOCS / "exit-codes.md").read_text("utf-8")
    return {int(code) for code in re.findall(r"^\| (\d+) \|", text, re.MULTILINE)}


def test_real_output_validates_and_every_documented_exit_code_is_produced(
    invoke: Callable[..., Result], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "exp"
    folder.mkdir()
    monkeypatch.chdir(tmp_path)
    for name, text in (("baseline", BASELINE), ("01-faster", STEP), ("02-errors", ERRORS)):
        write(folder, f"{name}.yaml", text)
    write(folder, "broken.yaml", BROKEN)
    write(folder, "docs_broken_target.py", "def build(knobs):\n    raise RuntimeError('no')\n")
    produced: dict[int, str] = {}

    ran = invoke("run", "exp/01-faster.yaml", "--chain", *QUICK)
    produced[ran.exit_code] = "run --chain of a valid chain"
    assert ran.exit_code == 0, ran.output
    summaries = json_lines(ran)
    assert [s["experiment"] for s in summaries] == ["docs-baseline", "docs-faster"]
    assert ran.stdout.splitlines()[-1].startswith("{"), "the head's summary is the last line"
    for summary in summaries:
        assert not problems("run-summary", summary), problems("run-summary", summary)
    assert summaries[-1]["parent"]["run_id"] == summaries[0]["run_id"]

    table = invoke("table", "docs-faster", "--format", "json")
    assert table.exit_code == 0, table.output
    document = json.loads(table.stdout)
    assert not problems("table", document), problems("table", document)
    assert [row["experiment"] for row in document["chain"]] == ["docs-baseline", "docs-faster"]
    assert document["chain"][1]["service_p50_ms"] is not None  # a stage column, open in the schema
    # The protocol object is open to keys older runs lack; the model names every key of today's.
    assert set(document["protocol"]) == set(ProtocolInfo.model_fields)

    gate = invoke("check", "docs-faster", "--min-gain", "qps=100000%")
    produced[gate.exit_code] = "check with a gain no step makes"

    invalid = invoke("run", "exp/02-errors.yaml", *QUICK)
    produced[invalid.exit_code] = "run of an INVALID step (half its requests fail)"
    (summary,) = json_lines(invalid)
    assert summary["valid"] is False and summary["reasons"]
    assert not problems("run-summary", summary), problems("run-summary", summary)

    failed = invoke("run", "exp/broken.yaml", *QUICK)
    produced[failed.exit_code] = "run of a target whose factory raises"
    for summary in json_lines(failed):
        assert summary["status"] == "FAILED"
        assert not problems("run-summary", summary), problems("run-summary", summary)

    refused = invoke("run", "exp/no-such-file.yaml", *QUICK)
    produced[refused.exit_code] = "run of a file that does not exist"
    assert refused.stdout == ""

    assert set(produced) == {0, 1, 2, 3, 4}, produced
    # Interrupting a run takes a subprocess and a signal: tests/integration/test_run.py does that
    # (test_interrupt_leaves_a_killed_run_with_partial_data); here, the CLI's own constant.
    referenced = {EXIT_INTERRUPTED: "optlab.cli.main.EXIT_INTERRUPTED"}
    documented = documented_exit_codes()
    assert documented == set(produced) | set(referenced), (documented, produced, referenced)
