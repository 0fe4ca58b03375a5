"""Finding experiments by name in a folder, and walking a file's chain of parents."""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path

from optlab.config.loading import ExperimentFile, load_experiment
from optlab.config.source import read_name
from optlab.errors import ConfigError, NotFoundError

EXPERIMENT_SUFFIXES = (".yaml", ".yml")


@dataclass
class Catalog:
    """The experiment files of one folder, indexed by their `name`."""

    folder: Path
    by_name: dict[str, list[Path]] = field(default_factory=dict)
    unreadable: dict[Path, str] = field(default_factory=dict)

    @classmethod
    def scan(cls, folder: Path) -> Catalog:
        """Index the folder by `name`. Only each file's first YAML events are read (a
        neighbour is loaded in full only once it is a parent), so one odd or hostile file
        beside the experiment cannot make a command slow; such files are noted, not fatal."""
        catalog = cls(folder)
        for path in sorted(folder.iterdir()):
            # is_file() follows links and is false for FIFOs and devices: never opened.
            if path.suffix not in EXPERIMENT_SUFFIXES or not path.is_file():
                continue
            try:
                name = read_name(path)
            except ConfigError as exc:
                catalog.unreadable[path] = exc.message
                continue
            if name is not None:
                catalog.by_name.setdefault(name, []).append(path)
        return catalog

    def find(self, name: str) -> Path | None:
        """The file that defines `name`, None when no file does; ambiguity is an error."""
        paths = self.by_name.get(name, [])
        if len(paths) > 1:
            raise ConfigError(
                f"{self.folder}: experiment name {name!r} is defined by "
                + " and ".join(str(p) for p in paths),
                hint="experiment names must be unique within a folder; rename one of them",
            )
        return paths[0] if paths else None

    def missing(self, name: str, wanted_by: Path) -> NotFoundError:
        known = sorted(self.by_name)
        stems = {p.stem: n for n, ps in self.by_name.items() for p in ps}
        guess = difflib.get_close_matches(name, known, n=1) or [
            stems[s] for s in difflib.get_close_matches(Path(name).stem, list(stems), n=1)
        ]
        hint = f"did you mean {guess[0]!r}? " if guess else ""
        hint += "`parent` names another experiment's `name` (not its file name); "
        hint += f"experiments in {self.folder}: {', '.join(known) or 'none'}"
        if self.unreadable:
            hint += "; unreadable files there: " + ", ".join(p.name for p in self.unreadable)
        return NotFoundError(
            f"{wanted_by}: parent {name!r} not found in {self.folder} nor in the database",
            hint=hint,
        )


def file_chain(experiment: ExperimentFile, catalog: Catalog) -> list[ExperimentFile | str]:
    """The file's ancestors, leaf first. A str entry is a parent with no file (maybe stored)."""
    chain: list[ExperimentFile | str] = [experiment]
    seen = {experiment.name: experiment.path}
    current = experiment
    while current.parent is not None:
        parent_name = current.parent
        if parent_name in seen:
            names = [e.name for e in chain if isinstance(e, ExperimentFile)]
            cycle = " -> ".join([*names, parent_name])
            raise ConfigError(
                f"{current.path}: parent chain loops back: {cycle}",
                hint="one experiment in the loop must be a baseline (no `parent`)",
            )
        path = catalog.find(parent_name)
        if path is None:
            chain.append(parent_name)
            break
        parent = load_experiment(path)
        seen[parent.name] = parent.path
        chain.append(parent)
        current = parent
    return chain
