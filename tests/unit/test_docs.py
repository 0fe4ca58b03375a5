"""The contract in docs/: the JSON Schemas are what the models generate, and every example in
the docs validates against its schema (and loads in optlab). That real output validates and
every documented exit code is one optlab produces: tests/integration/test_docs_real.py."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

import pytest

from optlab.chain.catalog import Catalog, file_chain
from optlab.chain.lineage import resolve_step
from optlab.config.loading import load_experiment
from optlab.config.models import BaselineFile
from optlab.config.source import read_yaml
from optlab.errors import OptlabError
from optlab.targets.resolve import resolve_baseline
from tests.support.files import write
from tests.support.paths import REPO
from tests.support.schemas import SCHEMAS, problems

DOCS = REPO / "docs"
# Which schema each page's examples follow; a json or yaml block anywhere else is an error
# (write an illustration that is not a whole document as a ```text block).
EXAMPLES = {
    ("experiment-files.md", "yaml"): "experiment",
    ("hosts.md", "yaml"): "experiment",
    ("run-json.md", "json"): "run-summary",
    ("table-json.md", "json"): "table",
    ("sweep-json.md", "json"): "sweep",
    ("diagnose-json.md", "json"): "diagnose",
    ("sweep-knob-json.md", "json"): "sweep-knob",
    ("tune-json.md", "json"): "tune",
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
