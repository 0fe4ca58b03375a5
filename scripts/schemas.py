"""Write the JSON Schemas of optlab's files and outputs to docs/schemas/, from the models.

    .venv/bin/python scripts/schemas.py          # (re)write docs/schemas/*.schema.json
    .venv/bin/python scripts/schemas.py --check  # exit 1 when a committed schema is stale

The models are the truth (pydantic's `model_json_schema`); this script only adds what a model
cannot say alone: which knobs and inputs a target kind takes (checked by optlab when it loads
the file) and which keys a step's `change` may not set. tests/unit/test_docs.py fails when the
committed schemas differ from what this script generates.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, RootModel
from pydantic.json_schema import models_json_schema

from optlab.config.knobs import ImageInputs
from optlab.config.models import (
    BASELINE_ONLY_KEYS,
    BaselineFile,
    BuiltinTarget,
    HttpInputs,
    StepFile,
)
from optlab.diagnose.document import DiagnoseDocument
from optlab.knobs.document import KnobSweepDocument, TuneDocument
from optlab.reports.sweep_json import SweepDocument
from optlab.reports.table_json import TableDocument
from optlab.store.summary import RunSummary
from optlab.targets.registry import kind_of

OUT = Path(__file__).resolve().parents[1] / "docs" / "schemas"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
REGENERATE = ".venv/bin/python scripts/schemas.py"


class ExperimentFile(RootModel[BaselineFile | StepFile]):
    """An optlab experiment file (YAML): a baseline, with the full config, or a step, with
    `parent` and `change`. See docs/experiment-files.md."""


def _with_defs(
    root: type[BaseModel], extra: tuple[type[BaseModel], ...] = ()
) -> tuple[dict[str, Any], dict[str, str]]:
    """`root`'s schema with `extra`'s definitions beside its own; and each model's $ref."""
    models = (root, *extra)
    refs, shared = models_json_schema(
        [(model, "validation") for model in models], ref_template="#/$defs/{model}"
    )
    defs: dict[str, Any] = shared.get("$defs", {})
    names = {model.__name__: refs[(model, "validation")]["$ref"] for model in models}
    top = defs.pop(names[root.__name__].rsplit("/", 1)[1])
    return {**top, "$defs": defs}, names


def _target_is(kind: str, name: str | None = None) -> dict[str, Any]:
    """A JSON Schema `if`: the file's target is of this kind (and builtin name; an absent
    name is the default, image-classifier)."""
    target: dict[str, Any] = {"properties": {"kind": {"const": kind}}, "required": ["kind"]}
    if name is not None:
        target["properties"]["name"] = {"const": name}
        if name != "image-classifier":
            target["required"] = ["kind", "name"]
    return {"properties": {"target": target}, "required": ["target"]}


def _uses(knobs: str | None, inputs: str | None) -> dict[str, Any]:
    then: dict[str, Any] = {"properties": {}}
    if knobs is not None:
        then["properties"]["knobs"] = {"$ref": knobs}
    if inputs is not None:
        then["properties"]["workload"] = {"properties": {"inputs": {"$ref": inputs}}}
    return then


def builtin_knobs(name: str) -> type[BaseModel]:
    """The knob model the registry's kind for `kind: builtin, name: NAME` checks knobs with."""
    target = BuiltinTarget(kind="builtin", name=name)
    model = kind_of(target).knob_model(target, [])
    assert model is not None, f"the builtin target {name!r} has no knob model"
    return model


def experiment_schema() -> dict[str, Any]:
    """The file models, with the knobs and inputs each target kind checks at load."""
    classifier, synthetic = builtin_knobs("image-classifier"), builtin_knobs("synthetic")
    schema, refs = _with_defs(ExperimentFile, (classifier, ImageInputs, synthetic, HttpInputs))
    defs = schema["$defs"]
    defs["BaselineFile"]["allOf"] = [
        {
            "if": _target_is("builtin", "image-classifier"),
            "then": _uses(refs[classifier.__name__], refs["ImageInputs"]),
        },
        {
            "if": _target_is("builtin", "synthetic"),
            "then": _uses(refs[synthetic.__name__], None),
        },
        {"if": _target_is("command"), "then": _uses(None, refs["HttpInputs"])},
        {"if": _target_is("http"), "then": _uses(None, refs["HttpInputs"])},
    ]
    # A step changes knobs only: these keys define a baseline (the loader refuses them).
    defs["StepFile"]["properties"]["change"]["propertyNames"] = {
        "not": {"enum": list(BASELINE_ONLY_KEYS)}
    }
    return schema


def run_summary_schema() -> dict[str, Any]:
    """One line of `optlab run --json` (which leaves `schema_version` out), or a bundle's
    `run.summary` (which has it)."""
    schema, _ = _with_defs(RunSummary)
    return schema


def table_schema() -> dict[str, Any]:
    schema, _ = _with_defs(TableDocument)
    return schema


def sweep_schema() -> dict[str, Any]:
    schema, _ = _with_defs(SweepDocument)
    return schema


def knob_schemas() -> tuple[dict[str, Any], dict[str, Any]]:
    return _with_defs(KnobSweepDocument)[0], _with_defs(TuneDocument)[0]


def diagnose_schema() -> dict[str, Any]:
    schema, _ = _with_defs(DiagnoseDocument)
    return schema


def schemas() -> dict[str, dict[str, Any]]:
    """File name -> schema, each with its dialect first."""
    found = {
        "experiment.schema.json": experiment_schema(),
        "run-summary.schema.json": run_summary_schema(),
        "table.schema.json": table_schema(),
        "sweep.schema.json": sweep_schema(),
        "diagnose.schema.json": diagnose_schema(),
        "sweep-knob.schema.json": knob_schemas()[0],
        "tune.schema.json": knob_schemas()[1],
    }
    return {name: {"$schema": DIALECT, **schema} for name, schema in found.items()}


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def stale(folder: Path = OUT) -> list[str]:
    """The schema files in `folder` that are missing, differ from the models, or are extra."""
    wanted = schemas()
    found = {p.name for p in folder.glob("*.schema.json")} if folder.is_dir() else set()
    wrong = [
        name
        for name, schema in wanted.items()
        if not (folder / name).is_file() or (folder / name).read_text("utf-8") != render(schema)
    ]
    return sorted(wrong + sorted(found - set(wanted)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when a schema is stale")
    args = parser.parse_args(argv)
    if args.check:
        wrong = stale()
        for name in wrong:
            print(f"docs/schemas/{name} is stale; run `{REGENERATE}`", file=sys.stderr)
        return 1 if wrong else 0
    OUT.mkdir(parents=True, exist_ok=True)
    wanted = schemas()
    for extra in set(p.name for p in OUT.glob("*.schema.json")) - set(wanted):
        (OUT / extra).unlink()
    for name, schema in wanted.items():
        (OUT / name).write_text(render(schema), encoding="utf-8")
        print(f"wrote docs/schemas/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
