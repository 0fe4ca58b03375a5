"""Resolving an experiment file's target, knobs and workload into the config a run measures,
with the checks each kind of target asks for (`TargetKind`): its knob model, its templates,
its inputs, and whether its load can leave optlab's process.

Parsing the file is the config layer's (`optlab.config.loading`); what the kinds check needs
the target layer above it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from optlab.config.limits import check_load
from optlab.config.loading import ExperimentFile, search_paths
from optlab.config.models import BaselineFile, ResolvedConfig, Target
from optlab.config.source import KeyPath, SourceFile
from optlab.config.validation import config_error
from optlab.errors import ConfigError
from optlab.targets.registry import kind_of

__all__ = ["resolve_baseline", "validate_knobs"]


def validate_knobs(
    target: Target,
    knobs: dict[str, Any],
    source: SourceFile,
    file_prefix: KeyPath,
    paths: Sequence[Path],
) -> dict[str, Any]:
    """Knobs checked against the target's model and filled with its defaults; a service's
    templates must name knobs these knobs hold."""
    kind = kind_of(target)
    model = kind.knob_model(target, paths)
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
    try:
        kind.check_knobs(target, checked)
    except ConfigError as exc:
        # The field at fault where the check names it (a declared remedy), else the knobs.
        where = source.where(exc.at if exc.at is not None else file_prefix)
        raise ConfigError(f"{where}: {exc.message}", exc.hint) from None
    return checked


def resolve_baseline(experiment: ExperimentFile) -> dict[str, Any]:
    """A baseline file's resolved config, as stored and hashed."""
    spec = experiment.spec
    assert isinstance(spec, BaselineFile)
    kind = kind_of(spec.target)
    paths = search_paths(experiment.source)
    knobs = validate_knobs(spec.target, spec.knobs, experiment.source, ("knobs",), paths)
    kind.check_code(spec.target, paths, experiment.source)
    workload = kind.resolve_inputs(spec.workload, experiment.source)
    if kind.in_process and workload.load.processes > 1:
        raise ConfigError(
            f"{experiment.source.where(('workload', 'load', 'processes'))}: "
            f"{workload.load.processes} load-generator processes need a target measured over "
            f"the network (kind http or command); a {spec.target.kind} target runs inside "
            "optlab's own process, so each process would build its own copy",
            hint="remove `processes`, or serve the model (`optlab serve`) and measure it as a "
            "command target",
        )
    if kind.in_process and workload.load.hosts is not None:
        raise ConfigError(
            f"{experiment.source.where(('workload', 'load', 'hosts'))}: workload.load.hosts: "
            "load from other hosts "
            f"needs a target measured over the network (kind http or command); a "
            f"{spec.target.kind} target runs inside optlab's own process",
            hint="remove `hosts`, or serve the model where the nodes can reach it and measure "
            "it as an http target",
        )
    check_load(workload, experiment.source, threaded=kind.in_process, kind=spec.target.kind)
    resolved = ResolvedConfig(
        target=spec.target,
        knobs=knobs,
        workload=workload,
        protocol=spec.protocol,
        slo=spec.slo,
    )
    return resolved.model_dump(mode="json")
