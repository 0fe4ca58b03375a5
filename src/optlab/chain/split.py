"""`optlab split`: rewrite a multi-variable step as a chain of one-variable steps."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import ValidationError

from optlab.chain.catalog import Catalog
from optlab.chain.lineage import prepare, resolve_step
from optlab.chain.plan import SplitFile, check_new_knobs, group_by_variable, propose_split
from optlab.config.diff import ABSENT
from optlab.config.loading import load_experiment
from optlab.config.models import StepFile
from optlab.config.source import parse_yaml, read_bytes
from optlab.errors import ConfigError, RefusedError

if TYPE_CHECKING:
    from optlab.store import Store


@dataclass(frozen=True)
class SplitResult:
    files: list[tuple[Path, str]]  # path and YAML text, in chain order
    backup: Path  # where the original file's text is kept
    written: bool


class _NoAliases(yaml.SafeDumper):
    """Values written out in full: optlab's loader refuses anchors and aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _render(entry: SplitFile, spec: StepFile, original: str, last: bool, added: set[str]) -> str:
    document: dict[str, Any] = {"name": entry.name, "parent": entry.parent}
    variable = next(iter(entry.change))
    if last:
        if spec.description:
            document["description"] = spec.description
        if spec.hypothesis:
            document["hypothesis"] = spec.hypothesis
    else:
        document["description"] = f"{variable} only, split from {original}"
    if variable in added:
        document["new_knob"] = True  # the original declared its new knobs; this one is one
    document["change"] = entry.change
    return yaml.dump(
        document, Dumper=_NoAliases, sort_keys=False, default_flow_style=False, width=100
    )


def split_experiment(path: Path, store: Store, *, write: bool = True) -> SplitResult:
    experiment = load_experiment(path)
    spec = experiment.spec
    if not isinstance(spec, StepFile):
        raise RefusedError(
            f"{path}: is a baseline; only a step (a file with `parent` and `change`) can be split",
            hint="a baseline holds the full config and changes nothing",
        )
    catalog = Catalog.scan(path.parent)
    parent_path = catalog.find(spec.parent)
    if parent_path is not None:
        parent = prepare(parent_path, store).head.stored
    else:
        record = store.get_experiment(spec.parent)
        if record is None or record.current_config is None:
            raise catalog.missing(spec.parent, path)
        parent = record.current_config
    config = resolve_step(experiment, parent.config)
    variables = group_by_variable(parent.config["knobs"], config["knobs"])
    if len(variables) < 2:
        raise RefusedError(
            f"{path}: changes {len(variables)} variable{'s' if len(variables) != 1 else ''}; "
            "there is nothing to split",
            hint=f"`optlab diff {path}` shows the change",
        )
    knobs = parent.config["knobs"]
    check_new_knobs(variables, spec.parent, knobs, experiment.source, spec.new_knob)
    added = {v.name for v in variables if v.old is ABSENT}
    entries = propose_split(spec.name, spec.parent, experiment.source, variables, spec.change)
    files = [
        (path.parent / e.filename, _render(e, spec, spec.name, i == len(entries) - 1, added))
        for i, e in enumerate(entries)
    ]
    backup = path.with_name(path.name + ".orig")
    # Every check before anything is written: a refusal leaves the folder as it was.
    _check_targets(path, files, backup, entries, catalog)
    if write:
        _write_all(path, read_bytes(path), backup, files)
    return SplitResult(files, backup, write)


def _check_targets(
    path: Path,
    files: list[tuple[Path, str]],
    backup: Path,
    entries: list[SplitFile],
    catalog: Catalog,
) -> None:
    clashes = [p for p, _ in files[:-1] if p.exists()] + ([backup] if backup.exists() else [])
    if clashes:
        raise ConfigError(
            f"{path}: cannot split: {', '.join(str(p) for p in clashes)} already exist",
            hint="move or delete those files (nothing was written)",
        )
    taken = [e.name for e in entries[:-1] if e.name in catalog.by_name]
    if taken:
        raise ConfigError(
            f"{path}: cannot split: experiment name{'s' if len(taken) > 1 else ''} "
            f"{', '.join(repr(n) for n in taken)} already used in {path.parent}",
            hint="rename those experiments, or this one (nothing was written)",
        )
    for target, text in files:
        # The proposed files must load as experiments; a failure here is optlab's bug, and
        # is caught before the user's folder holds half a chain.
        try:
            StepFile.model_validate(parse_yaml(text, target).data)
        except (ConfigError, ValidationError) as exc:
            raise ConfigError(
                f"{path}: cannot split: the proposed {target.name} would not load ({exc})",
                hint="report this; nothing was written",
            ) from exc


def _write_all(path: Path, original: bytes, backup: Path, files: list[tuple[Path, str]]) -> None:
    """Write every file to a temporary name first and rename them into place only once all
    are written; the original file is replaced last. Any failure removes what was placed."""
    real = path.resolve()  # a linked experiment file keeps its link; the file it names changes
    # mkstemp makes 0600 files: give every file the original's permissions instead.
    mode = stat.S_IMODE(os.stat(real).st_mode)
    writes = [(backup, original)]
    writes += [(real if p == path else p, t.encode("utf-8")) for p, t in files]
    temps: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    try:
        for target, data in writes:
            fd, name = tempfile.mkstemp(dir=target.parent, prefix=".optlab-split-", suffix=".tmp")
            temps.append((Path(name), target))
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.chmod(name, mode)
        for temp, target in temps:
            if target != real and target.exists():  # appeared since the checks
                raise FileExistsError(errno.EEXIST, "already exists", str(target))
            os.replace(temp, target)
            if target != real:
                placed.append(target)
    except OSError as exc:
        for target in placed:
            target.unlink(missing_ok=True)
        raise ConfigError(
            f"{path}: cannot split: {exc.filename or path}: {exc.strerror or exc}",
            hint="fix the cause (permissions, disk space) and run split again; "
            "nothing was left behind",
        ) from exc
    finally:
        for temp, _ in temps:
            temp.unlink(missing_ok=True)
