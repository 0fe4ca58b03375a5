"""Loading experiment files into validated models; the stored config's hash and re-validation.

What each kind of target checks in a file (its knobs, its inputs) runs in the target layer
above this one: `optlab.targets.resolve`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from optlab.config.canonical import canonical_json
from optlab.config.models import BASELINE_ONLY_KEYS, BaselineFile, ResolvedConfig, StepFile
from optlab.config.source import SourceFile, read_yaml
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


def config_hash(config: dict[str, Any]) -> str:
    """The identity of what is measured: the canonical JSON of the config without
    `target.remedies` (what diagnose suggests is advice, not a variable: declaring or editing
    remedies keeps the hash, and the stored config takes the new ones; docs/experiment-files.md
    "Remedies")."""
    return hashlib.sha256(
        canonical_json(measured_part(config), ascii_only=True).encode()
    ).hexdigest()


def remedies_of(config: dict[str, Any]) -> Any:
    """The config's `target.remedies` (None when it declares none)."""
    target = config.get("target")
    return target.get("remedies") if isinstance(target, dict) else None


def measured_part(config: dict[str, Any]) -> dict[str, Any]:
    """The config without `target.remedies`."""
    target = config.get("target")
    if not isinstance(target, dict) or "remedies" not in target:
        return config
    return {**config, "target": {k: v for k, v in target.items() if k != "remedies"}}


def search_paths(source: SourceFile) -> list[Path]:
    """Where user target code is looked for: the experiment's folder, then the working dir."""
    folder = source.path.resolve().parent
    return [folder, Path.cwd()] if folder != Path.cwd() else [folder]


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
