"""Loading experiment files into validated models, and validating knobs against the target."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from optlab.config.canonical import canonical_json
from optlab.config.knobs import BuiltinKnobs, ImageInputs
from optlab.config.limits import check_load
from optlab.config.models import (
    BASELINE_ONLY_KEYS,
    BaselineFile,
    BuiltinTarget,
    CommandTarget,
    HttpInputs,
    HttpTarget,
    PythonTarget,
    ResolvedConfig,
    StepFile,
)
from optlab.config.source import KeyPath, SourceFile, read_yaml
from optlab.config.validation import config_error
from optlab.errors import ConfigError


@dataclass(frozen=True)
class ExperimentFile:
    """A parsed and validated experiment file: a baseline or a step."""

    source: SourceFile
    spec: BaselineFile | StepFile

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def path(self) -> Path:
        return self.source.path

    @property
    def parent(self) -> str | None:
        return self.spec.parent if isinstance(self.spec, StepFile) else None


def is_step(data: dict[str, Any]) -> bool:
    return "parent" in data or "change" in data


def load_experiment(path: Path) -> ExperimentFile:
    source = read_yaml(path)
    data = source.data
    if "parent" in data and data["parent"] is None:
        # An explicit decision either way: a null parent is neither a baseline nor a step.
        raise ConfigError(
            f"{source.where(('parent',))}: parent: null names no parent experiment",
            hint="remove the `parent` key for a baseline (a file with the full config), or "
            "name the experiment this step builds on, e.g. parent: baseline",
        )
    if is_step(data):
        misplaced = [k for k in (*BASELINE_ONLY_KEYS, "knobs") if k in data]
        if misplaced:
            first = misplaced[0]
            raise ConfigError(
                f"{source.where((first,))}: a step (it has `parent`) may not set "
                f"{', '.join(repr(k) for k in misplaced)}",
                hint="a step only declares `change` (knob: value) against its parent; a new "
                "target, workload, protocol or SLO is a new baseline: a file without `parent`",
            )
        model: type[StepFile] | type[BaselineFile] = StepFile
    else:
        model = BaselineFile
    try:
        spec = model.model_validate(data)
    except ValidationError as exc:
        raise config_error(exc, model, source) from exc
    return ExperimentFile(source=source, spec=spec)


def knob_model(target: Any, paths: Sequence[Path]) -> type[BaseModel] | None:
    """The pydantic model that checks this target's knobs; None means free-form knobs."""
    if isinstance(target, BuiltinTarget):
        if target.name == "synthetic":
            from optlab.reference.synthetic import SyntheticKnobs

            return SyntheticKnobs
        return BuiltinKnobs
    if isinstance(target, PythonTarget | CommandTarget | HttpTarget) and target.knobs_model:
        # Imported lazily: only here do we run user code, and only when the user asked for it.
        from optlab.targets.references import import_reference

        found = import_reference(target.knobs_model, paths, "target.knobs_model")
        if not (isinstance(found, type) and issubclass(found, BaseModel)):
            raise ConfigError(
                f"target.knobs_model: {target.knobs_model!r} is not a pydantic model class",
                hint="point it at a class that subclasses pydantic.BaseModel, or remove the field "
                "to take free-form knobs",
            )
        return found
    return None


def validate_knobs(
    target: Any,
    knobs: dict[str, Any],
    source: SourceFile,
    file_prefix: KeyPath,
    paths: Sequence[Path],
) -> dict[str, Any]:
    """Knobs checked against the target's model and filled with its defaults; a service's
    templates must name knobs these knobs hold."""
    model = knob_model(target, paths)
    if model is None:
        try:
            json.dumps(knobs, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ConfigError(
                f"{source.where(file_prefix)}: knobs must be plain YAML values ({exc})",
                hint="use strings, numbers, booleans, lists and mappings",
            ) from exc
        checked = knobs
    else:
        try:
            checked = model.model_validate(knobs).model_dump(mode="json")
        except ValidationError as exc:
            raise config_error(exc, model, source, file_prefix) from exc
    if isinstance(target, CommandTarget | HttpTarget):
        from optlab.targets.templates import check_knob_references, target_templates

        try:
            check_knob_references(target_templates(target), checked)
        except ConfigError as exc:
            raise ConfigError(f"{source.where(file_prefix)}: {exc.message}", exc.hint) from None
    return checked


def config_hash(config: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(config, ascii_only=True).encode()).hexdigest()


def search_paths(source: SourceFile) -> list[Path]:
    """Where user target code is looked for: the experiment's folder, then the working dir."""
    folder = source.path.resolve().parent
    return [folder, Path.cwd()] if folder != Path.cwd() else [folder]


def resolve_baseline(experiment: ExperimentFile) -> dict[str, Any]:
    spec = experiment.spec
    assert isinstance(spec, BaselineFile)
    knobs = validate_knobs(
        spec.target, spec.knobs, experiment.source, ("knobs",), search_paths(experiment.source)
    )
    workload = spec.workload
    if isinstance(spec.target, BuiltinTarget) and spec.target.name == "image-classifier":
        # Checked here, at load, so a typo in the payload spec names its line before any run.
        try:
            inputs = ImageInputs.model_validate(workload.inputs).model_dump(mode="json")
        except ValidationError as exc:
            raise config_error(exc, ImageInputs, experiment.source, ("workload", "inputs")) from exc
        workload = workload.model_copy(update={"inputs": inputs})
    if isinstance(spec.target, CommandTarget | HttpTarget):
        try:
            inputs = HttpInputs.model_validate(workload.inputs).model_dump(
                mode="json", exclude_defaults=True
            )
        except ValidationError as exc:
            raise config_error(exc, HttpInputs, experiment.source, ("workload", "inputs")) from exc
        if "images" in inputs:
            try:
                ImageInputs.model_validate(inputs["images"])
            except ValidationError as exc:
                raise config_error(
                    exc, ImageInputs, experiment.source, ("workload", "inputs", "images")
                ) from exc
        from optlab.targets.http import check_input_files

        try:
            check_input_files(inputs, experiment.source.path.resolve().parent)
        except ConfigError as exc:
            where = experiment.source.where(("workload", "inputs"))
            raise ConfigError(f"{where}: {exc.message}", exc.hint) from None
        workload = workload.model_copy(update={"inputs": inputs})
    elif workload.load.processes > 1:
        raise ConfigError(
            f"{experiment.source.where(('workload', 'load', 'processes'))}: "
            f"{workload.load.processes} load-generator processes need a target measured over "
            f"the network (kind http or command); a {spec.target.kind} target runs inside "
            "optlab's own process, so each process would build its own copy",
            hint="remove `processes`, or serve the model (`optlab serve`) and measure it as a "
            "command target",
        )
    check_load(
        workload,
        experiment.source,
        threaded=isinstance(spec.target, BuiltinTarget | PythonTarget),
        kind=spec.target.kind,
    )
    resolved = ResolvedConfig(
        target=spec.target,
        knobs=knobs,
        workload=workload,
        protocol=spec.protocol,
        slo=spec.slo,
    )
    return resolved.model_dump(mode="json")


def parse_stored(config: dict[str, Any], experiment: str) -> ResolvedConfig:
    """Re-validate a stored config; a failure means it was stored by an incompatible optlab."""
    try:
        return ResolvedConfig.model_validate(config)
    except ValidationError as exc:
        raise ConfigError(
            f"the stored config of {experiment!r} no longer matches this optlab's schema: "
            + "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()),
            hint="start a new baseline (a new name) for this version of optlab",
        ) from exc
