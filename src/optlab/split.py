"""`optlab split`: rewrite a multi-variable step as a chain of one-variable steps."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from optlab.config.catalog import Catalog
from optlab.config.loading import load_experiment
from optlab.config.models import StepFile
from optlab.errors import ConfigError, RefusedError
from optlab.lineage import prepare, resolve_step
from optlab.plan import SplitFile, group_by_variable, propose_split

if TYPE_CHECKING:
    from optlab.store import Store


@dataclass(frozen=True)
class SplitResult:
    files: list[tuple[Path, str]]  # path and YAML text, in chain order
    backup: Path  # where the original file's text is kept
    written: bool


def _render(entry: SplitFile, spec: StepFile, original: str, last: bool) -> str:
    document: dict[str, Any] = {"name": entry.name, "parent": entry.parent}
    variable = next(iter(entry.change))
    if last:
        if spec.description:
            document["description"] = spec.description
        if spec.hypothesis:
            document["hypothesis"] = spec.hypothesis
    else:
        document["description"] = f"{variable} only, split from {original}"
    document["change"] = entry.change
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False, width=100)


def split_experiment(path: Path, store: Store, *, write: bool = True) -> SplitResult:
    experiment = load_experiment(path)
    spec = experiment.spec
    if not isinstance(spec, StepFile):
        raise RefusedError(
            f"{path}: is a baseline; only a step (a file with `parent` and `change`) can be split",
            hint="a baseline holds the full config and changes nothing",
        )
    parent_path = Catalog.scan(path.parent).find(spec.parent, path)
    if parent_path is not None:
        parent = prepare(parent_path, store).head.stored
    else:
        record = store.get_experiment(spec.parent)
        if record is None or record.current_config is None:
            raise Catalog.scan(path.parent).missing(spec.parent, path)
        parent = record.current_config
    config = resolve_step(experiment, parent.config)
    variables = group_by_variable(parent.config["knobs"], config["knobs"])
    if len(variables) < 2:
        raise RefusedError(
            f"{path}: changes {len(variables)} variable{'s' if len(variables) != 1 else ''}; "
            "there is nothing to split",
            hint=f"`optlab diff {path}` shows the change",
        )
    entries = propose_split(spec.name, spec.parent, experiment.source, variables, spec.change)
    files = [
        (path.parent / e.filename, _render(e, spec, spec.name, i == len(entries) - 1))
        for i, e in enumerate(entries)
    ]
    backup = path.with_name(path.name + ".orig")
    clashes = [p for p, _ in files[:-1] if p.exists()] + ([backup] if backup.exists() else [])
    if clashes:
        raise ConfigError(
            f"{path}: cannot split: {', '.join(str(p) for p in clashes)} already exist",
            hint="move or delete those files (nothing was written)",
        )
    if write:
        backup.write_text(experiment.source.path.read_text(encoding="utf-8"), encoding="utf-8")
        for target, text in files:
            target.write_text(text, encoding="utf-8")
    return SplitResult(files, backup, write)
