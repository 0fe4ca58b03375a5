"""Resolving an experiment file against its parents' STORED configs.

The first `diff` or `run` of an experiment stores its resolved config. After that
the stored config is what children build on, and it is immutable once runs point
at it: an edited file is refused, with the difference and the way forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optlab.chain.catalog import Catalog, file_chain
from optlab.chain.plan import Plan, check_change_keys, plan_step, render_value
from optlab.config.diff import diff_values
from optlab.config.loading import (
    ExperimentFile,
    config_hash,
    load_experiment,
    parse_stored,
    remedies_of,
    search_paths,
)
from optlab.config.merge import deep_merge
from optlab.config.models import StepFile
from optlab.errors import RefusedError
from optlab.targets.resolve import resolve_baseline, validate_knobs

if TYPE_CHECKING:
    from optlab.store import Store, StoredConfig


@dataclass(frozen=True)
class Link:
    """One experiment of a chain: its plan, its stored config and what happened to it now."""

    name: str
    path: Path | None
    plan: Plan | None  # None for an ancestor known only from the database
    stored: StoredConfig
    # "stored", "unchanged", "remedies updated", "replaced (no runs yet)", "from database"
    action: str


@dataclass(frozen=True)
class Prepared:
    chain: list[Link]  # baseline first

    @property
    def head(self) -> Link:
        return self.chain[-1]

    @property
    def plan(self) -> Plan:
        plan = self.head.plan
        assert plan is not None
        return plan


def resolve_step(experiment: ExperimentFile, parent_config: dict[str, Any]) -> dict[str, Any]:
    spec = experiment.spec
    assert isinstance(spec, StepFile)
    check_change_keys(spec.change, experiment.source)
    parent = parse_stored(parent_config, spec.parent)
    merged = deep_merge(parent.knobs, spec.change)
    knobs = validate_knobs(
        parent.target, merged, experiment.source, ("change",), search_paths(experiment.source)
    )
    return parent.model_copy(update={"knobs": knobs}).model_dump(mode="json")


def plan_file(experiment: ExperimentFile, parent: StoredConfig | None) -> Plan:
    """The plan for one file, given its parent's stored config (None for a baseline)."""
    spec = experiment.spec
    if not isinstance(spec, StepFile):
        config = resolve_baseline(experiment)
        return Plan(spec.name, None, config, config_hash(config), None)
    assert parent is not None
    config = resolve_step(experiment, parent.config)
    return plan_step(
        name=spec.name,
        parent=spec.parent,
        parent_config=parent.config,
        config=config,
        config_hash=config_hash(config),
        change=spec.change,
        repeat=spec.repeat,
        source=experiment.source,
        new_knob=spec.new_knob,
    )


def _same_file(stored_path: str | None, path: Path) -> bool:
    if not stored_path:
        return True
    stored = Path(stored_path)
    # A stored file that no longer exists was moved or renamed: the same experiment.
    return not stored.exists() or stored.resolve() == path.resolve()


def reconcile(
    store: Store, experiment: ExperimentFile, plan: Plan, parent: StoredConfig | None
) -> tuple[StoredConfig, str]:
    """Store the plan's config, or keep it, or refuse because runs already measured another."""
    existing = store.get_experiment(plan.experiment)
    current = existing.current_config if existing is not None else None
    if existing is not None and current is not None:
        if not _same_file(current.source_path, experiment.path):
            raise RefusedError(
                f"{experiment.path}: experiment name {plan.experiment!r} is already used by "
                f"{current.source_path}",
                hint="names are unique in a database; give this experiment another `name`",
            )
        parent_hash = parent.config_hash if parent is not None else None
        same_parent = existing.parent == plan.parent
        same = (
            current.config_hash == plan.config_hash
            and same_parent
            and current.parent_config_hash == parent_hash
        )
        if same and remedies_of(current.config) == remedies_of(plan.config):
            return current, "unchanged"
        runs = store.count_runs(plan.experiment)
        if same:
            action = "remedies updated"  # the same measured config, other advice for diagnose
        elif runs:
            changes = diff_values(current.config, plan.config)
            lines = [f"  {c.path}: {render_value(c.old)} -> {render_value(c.new)}" for c in changes]
            if not same_parent:
                lines.insert(0, f"  parent: {existing.parent} -> {plan.parent}")
            raise RefusedError(
                f"{experiment.path}: refused: {plan.experiment!r} has {runs} stored "
                f"run{'s' if runs != 1 else ''}, and its file no longer matches the stored "
                "config (stored configs are immutable once measured):\n" + "\n".join(lines),
                hint=f"restore the file, or give it a new `name` (a new experiment"
                f"{'; for a baseline, a new baseline' if plan.parent is None else ''}, "
                f"e.g. {plan.experiment}-v2) and point its children's `parent` at that name",
            )
        else:
            action = "replaced (no runs yet)"
    else:
        action = "stored"
    variable = plan.variable
    stored = store.save_config(
        name=plan.experiment,
        kind="baseline" if plan.parent is None else "step",
        parent=plan.parent,
        description=experiment.spec.description,
        hypothesis=experiment.spec.hypothesis,
        config=plan.config,
        config_hash=plan.config_hash,
        change=experiment.spec.change if isinstance(experiment.spec, StepFile) else None,
        variable=variable.name if variable is not None else None,
        parent_config_hash=parent.config_hash if parent is not None else None,
        source_path=str(experiment.path.resolve()),
        source_hash=experiment.source.sha256,
    )
    return stored, action


def prepare(path: Path, store: Store) -> Prepared:
    """Load the file and its ancestors, check each against the rule and the store, leaf last."""
    experiment = load_experiment(path)
    chain = file_chain(experiment, Catalog.scan(path.parent))
    links: list[Link] = []
    root = chain[-1]
    if isinstance(root, str):
        # The oldest ancestor has no file here: build on what the database holds.
        record = store.get_experiment(root)
        if record is None or record.current_config is None:
            wanted_by = chain[-2].path if isinstance(chain[-2], ExperimentFile) else path
            raise Catalog.scan(path.parent).missing(root, wanted_by)
        links.append(Link(root, None, None, record.current_config, "from database"))
        chain = chain[:-1]
    for item in reversed(chain):
        assert isinstance(item, ExperimentFile)
        parent = links[-1].stored if links else None
        plan = plan_file(item, parent)
        stored, action = reconcile(store, item, plan, parent)
        links.append(Link(item.name, item.path, plan, stored, action))
    return Prepared(links)
