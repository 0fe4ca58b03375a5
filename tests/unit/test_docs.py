"""The contract in docs/: the JSON Schemas are what the models generate, every example in the
docs validates against its schema (and loads in optlab), real output validates, and every
documented exit code is one optlab produces."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import Result
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from optlab.chain.catalog import Catalog, file_chain
from optlab.chain.lineage import resolve_step
from optlab.cli.main import EXIT_INTERRUPTED
from optlab.config.loading import load_experiment
from optlab.config.models import BaselineFile
from optlab.config.source import read_yaml
from optlab.errors import OptlabError
from optlab.reports.table_json import ProtocolInfo
from optlab.targets.resolve import resolve_baseline
from tests.conftest import REPO, write

DOCS = REPO / "docs"
SCHEMAS = DOCS / "schemas"
# Which schema each page's examples follow; a json or yaml block anywhere else is an error
# (write an illustration that is not a whole document as a ```text block).
EXAMPLES = {
    ("experiment-files.md", "yaml"): "experiment",
    ("run-json.md", "json"): "run-summary",
    ("table-json.md", "json"): "table",
    ("sweep-json.md", "json"): "sweep",
    ("diagnose-json.md", "json"): "diagnose",
}
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


@cache
def schema_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("optlab_schemas", REPO / "scripts" / "schemas.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the script's models through it
    spec.loader.exec_module(module)
    return module


@cache
def validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / f"{name}.schema.json").read_text("utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def problems(name: str, value: Any) -> list[str]:
    """Every way `value` breaks the schema, each with where."""
    found = []
    for error in validator(name).iter_errors(value):
        # Under anyOf/oneOf (baseline or step, each target kind), the deepest error says more.
        deepest = best_match([error]) or error
        found.append(f"{'/'.join(map(str, deepest.absolute_path)) or '(top)'}: {deepest.message}")
    return found


def fenced(page: Path) -> list[tuple[str, str, int]]:
    """(language, text, line) of each fenced block of a markdown page."""
    text = page.read_text("utf-8")
    return [
        (m.group(1), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)
    ]


def test_the_committed_schemas_are_generated_from_the_models() -> None:
    script = schema_script()
    stale = script.stale(SCHEMAS)
    assert not stale, (
        f"docs/schemas/ is stale ({', '.join(stale)}): a model changed. Regenerate with "
        f"`{script.REGENERATE}`, check the docs pages still say what the code does, and commit"
    )


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_every_example_in_the_docs_validates(page: str, tmp_path: Path) -> None:
    checked = 0
    for language, text, line in fenced(DOCS / page):
        language = {"yml": "yaml"}.get(language, language)
        if language not in ("json", "yaml"):
            continue
        schema = EXAMPLES.get((page, language))
        assert schema, f"docs/{page}:{line}: a {language} example with no schema to check it"
        if language == "json":
            value = json.loads(text)
        else:
            # Parsed as optlab parses files (YAML 1.2 booleans: `off` is a string).
            path = write(tmp_path, f"example-{line}.yaml", text)
            value = read_yaml(path).data
        assert not problems(schema, value), f"docs/{page}:{line}: {problems(schema, value)}"
        checked += 1
    expected = [schema for (name, _), schema in EXAMPLES.items() if name == page]
    assert checked or not expected, f"docs/{page} should show a {expected[0]} example"


def test_the_experiment_examples_load_in_optlab(tmp_path: Path) -> None:
    """The schema is not the whole check: each example is also a file optlab accepts, its
    knobs and inputs checked against its target's models, a step's parent found beside it."""
    shutil.copy(REPO / "experiments" / "examples" / "textclf" / "textclf.py", tmp_path)
    paths = [
        write(tmp_path, f"example-{line}.yaml", text)
        for language, text, line in fenced(DOCS / "experiment-files.md")
        if language == "yaml"
    ]
    assert len(paths) >= 5, paths
    try:
        for path in paths:
            experiment = load_experiment(path)
            if isinstance(experiment.spec, BaselineFile):
                resolve_baseline(experiment)
            else:
                chain = file_chain(experiment, Catalog.scan(tmp_path))
                assert not any(isinstance(item, str) for item in chain), (path, chain)
    finally:
        sys.modules.pop("textclf", None)  # the python example's knobs_model, imported here


def test_every_shipped_experiment_validates_against_the_schema() -> None:
    files = sorted((REPO / "experiments").rglob("*.yaml"))
    assert len(files) >= 20
    for path in files:
        assert not problems("experiment", read_yaml(path).data), path


LOAD = "workload: {load: {mode: closed, concurrency: 1}}\n"
REFUSED = {
    "a typo in a knob": "target: {kind: builtin}\nknobs: {engin: torch}\n" + LOAD,
    "a knob out of range": "target: {kind: builtin}\nknobs: {threads: 0}\n" + LOAD,
    "a synthetic knob": "target: {kind: builtin, name: synthetic}\nknobs: {x: 1}\n" + LOAD,
    "an unknown key": "target: {kind: builtin}\nknbos: {}\n" + LOAD,
    "an image input": "target: {kind: builtin}\n"
    "workload: {load: {mode: closed, concurrency: 1}, inputs: {sizes: 256}}\n",
    "a service input": "target: {kind: http, url: 'http://127.0.0.1:1/'}\n"
    "workload: {load: {mode: closed, concurrency: 1}, inputs: {body: a}}\n",
    "a step that sets slo": "parent: a\nchange: {slo: {p99_ms: 1}}\n",
}


@pytest.mark.parametrize("what", sorted(REFUSED))
def test_the_experiment_schema_refuses_what_optlab_refuses(what: str, tmp_path: Path) -> None:
    path = write(tmp_path, "b.yaml", "name: b\n" + REFUSED[what])
    assert problems("experiment", read_yaml(path).data), what
    with pytest.raises(OptlabError):
        experiment = load_experiment(path)
        if isinstance(experiment.spec, BaselineFile):
            resolve_baseline(experiment)
        else:
            resolve_step(experiment, {})


# -- real output ------------------------------------------------------------------------------

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


@pytest.mark.slow
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
    # Interrupting a run takes a subprocess and a signal: test_run.py does that
    # (test_interrupt_leaves_a_killed_run_with_partial_data); here, the CLI's own constant.
    referenced = {EXIT_INTERRUPTED: "optlab.cli.main.EXIT_INTERRUPTED"}
    documented = documented_exit_codes()
    assert documented == set(produced) | set(referenced), (documented, produced, referenced)
