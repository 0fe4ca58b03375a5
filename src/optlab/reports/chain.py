"""Which runs stand for each step of a chain, and which steps cannot be stacked (and why).

The head's newest finished run fixes the protocol and the environment of the whole table: a
step's runs count only when they were measured under the same protocol, on a materially
identical environment, with the step's current config. Runs under another protocol, or on
another machine or software stack, are never stacked together; such a step is shown missing
with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from optlab.chain.comparability import Environments, environment_difference, same_protocol
from optlab.chain.plan import render_value
from optlab.config.loading import load_experiment
from optlab.config.protocol import protocol_label
from optlab.errors import NotFoundError
from optlab.reports.format import describe_change

if TYPE_CHECKING:
    from optlab.store import EnvironmentRecord, ExperimentRecord, RunRecord, Store


MAX_REPEATS = 10


@dataclass
class ChainStep:
    experiment: str
    parent: str | None
    variable: str | None
    change: str | None
    hypothesis: str | None
    slo: dict[str, Any]
    # Comparable runs, newest first: every VALID one (repeats), or the newest INVALID one.
    runs: list[RunRecord] = field(default_factory=list)
    missing: str | None = None

    @property
    def run(self) -> RunRecord | None:
        return self.runs[0] if self.runs else None


def resolve_head(store: Store, head: str | None) -> str:
    """An experiment name from a name, an experiment file, or None (the newest chain head)."""
    if head is None:
        return newest_head(store)
    path = Path(head)
    if head.endswith((".yaml", ".yml")) or path.is_file():
        return load_experiment(path).name
    return head


def newest_head(store: Store) -> str:
    """The measured leaf (an experiment with runs that no measured experiment builds on)
    whose newest run is the newest of all. A step only diffed, never measured, is no child:
    `optlab diff` must not move the default head off the chain it extends."""
    experiments = store.list_experiments()
    all_runs = store.list_runs()
    measured = {r.experiment for r in all_runs}
    parents = {e.parent for e in experiments if e.parent and e.name in measured}
    leaves = measured - parents
    runs = [r for r in all_runs if r.experiment in leaves]
    if not runs:
        raise NotFoundError(
            f"no measured chain in {store.url}",
            hint="measure one first: `optlab run EXPERIMENT --chain` (or `optlab demo`)",
        )
    return max(runs, key=lambda r: (r.started_at, r.id)).experiment


def default_head_note(store: Store, head: str) -> str:
    """What a command that was given no HEAD says about the one it chose (and a head whose
    experiment file is gone: its runs stay, but the user may not expect it)."""
    note = f"HEAD not given: {head!r}, the newest measured chain head (name HEAD to choose)"
    record = store.get_experiment(head)
    source = record.current_config.source_path if record and record.current_config else None
    if source and not Path(source).exists():
        note += f"; its file {source} no longer exists"
    return note


def chain_names(store: Store, head: str) -> list[str]:
    """Experiment names from the baseline to `head`, following the stored parents."""
    names: list[str] = []
    current: str | None = head
    while current is not None:
        record = store.get_experiment(current)
        if record is None:
            raise NotFoundError(
                f"experiment {current!r} is not in the database {store.url}",
                hint="check the name (`optlab log` lists measured experiments) or --db",
            )
        if current in names:
            raise NotFoundError(f"experiment {current!r} is its own ancestor", hint="")
        names.append(current)
        current = record.parent
    return list(reversed(names))


def _finished(store: Store, name: str, config_hash: str | None) -> list[RunRecord]:
    runs = [
        r
        for r in store.list_runs(name)
        if r.status == "FINISHED" and r.summary and r.config_hash == config_hash
    ]
    return sorted(runs, key=lambda r: (r.started_at, r.id), reverse=True)


def _reference(runs: list[RunRecord]) -> RunRecord | None:
    """The head's run that fixes protocol and environment: its newest valid one, else newest."""
    valid = [r for r in runs if r.valid]
    candidates = valid or runs
    return candidates[0] if candidates else None


def chain_steps(store: Store, head: str) -> tuple[list[ChainStep], RunRecord | None, Any]:
    """The chain's steps with their comparable runs, the reference run, and its environment."""
    names = chain_names(store, head)
    records = {name: store.get_experiment(name) for name in names}
    envs = Environments(store)
    finished = {
        name: _finished(
            store,
            name,
            record.current_config.config_hash if record and record.current_config else None,
        )
        for name, record in records.items()
    }
    reference = _reference(finished[head])
    reference_env = envs.record(reference.environment_id) if reference else None
    steps: list[ChainStep] = []
    for name in names:
        record = records[name]
        assert record is not None
        step = _chain_step(name, record, records)
        steps.append(step)
        runs, step.missing = _comparable(finished[name], reference, reference_env, envs)
        if step.missing is not None:
            continue
        valid = [r for r in runs if r.valid]
        # Repeats beyond the newest few add little to the run-to-run spread, and each costs
        # a time-series read: the table stays fast on databases with thousands of runs.
        step.runs = valid[:MAX_REPEATS] or runs[:1]
    return steps, reference, reference_env


def _chain_step(
    name: str, record: ExperimentRecord, records: Mapping[str, ExperimentRecord | None]
) -> ChainStep:
    """The step an experiment is in the chain, before its runs are chosen."""
    config = record.current_config
    stored = config.config if config else {}
    return ChainStep(
        experiment=name,
        parent=record.parent,
        variable=config.variable if config else None,
        change=_change(record, records),
        hypothesis=record.hypothesis,
        slo={k: v for k, v in (stored.get("slo") or {}).items() if v is not None},
    )


def _change(record: ExperimentRecord, records: Mapping[str, ExperimentRecord | None]) -> str | None:
    """The step's one knob change against its parent's config; None where it changes none."""
    config = record.current_config
    if config is None or not config.change or not config.variable:
        return None
    parent = records.get(record.parent) if record.parent else None
    old = (
        (parent.current_config.config if parent and parent.current_config else {})
        .get("knobs", {})
        .get(config.variable)
    )
    return describe_change(old, config.config.get("knobs", {}).get(config.variable), render_value)


def _comparable(
    runs: list[RunRecord],
    reference: RunRecord | None,
    reference_env: EnvironmentRecord | None,
    envs: Environments,
) -> tuple[list[RunRecord], str | None]:
    """A step's finished runs that stack with the head's reference run (the same protocol, a
    materially identical environment), or none and why not."""
    if not runs:
        return [], "no finished run of its current config"
    if reference is None:
        return runs, None
    measured_alike = [r for r in runs if same_protocol(r.protocol, reference.protocol)]
    if not measured_alike:
        wanted = protocol_label(reference.protocol, warmup=True)
        return [], (
            f"no finished run under the head's protocol ({wanted}); its runs are "
            f"under {protocol_label(runs[0].protocol, warmup=True)}"
        )
    if reference_env is None:
        return measured_alike, None
    same_env = [
        r
        for r in measured_alike
        if envs.record(r.environment_id) is not None
        and environment_difference(reference_env.fingerprint, envs.fingerprint(r.environment_id))
        is None
    ]
    if not same_env:
        return [], _environment_differs(reference_env, measured_alike[0], envs)
    return same_env, None


def _environment_differs(
    reference_env: EnvironmentRecord, run: RunRecord, envs: Environments
) -> str:
    """Why a step's newest run does not stack: the first material difference from the head's."""
    detail = environment_difference(reference_env.fingerprint, envs.fingerprint(run.environment_id))
    first = (detail or "").splitlines()[0] if detail else "material fields differ"
    return (
        "measured in a materially different environment from the head run's "
        f"(run {run.id}: {first}); re-measure it here"
    )
