"""What `optlab diagnose` is asked about (a run id, an experiment, `sweep:ID`), and writing the
next step's file for it (docs/diagnose.md)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from optlab.chain.catalog import EXPERIMENT_SUFFIXES, Catalog
from optlab.config.source import read_name
from optlab.diagnose.diagnosis import Diagnosis, Finding
from optlab.diagnose.remedies import stamp, step_document, step_name, step_path, write_step
from optlab.errors import ConfigError, NotFoundError
from optlab.store import Store

__all__ = ["Subject", "resolve", "write_next_step"]


@dataclass(frozen=True)
class Subject:
    run_id: int
    source: str | None  # how the run was chosen, when not named by its id


def resolve(store: Store, text: str | None) -> Subject:
    """The run that `text` names: a run id, `sweep:ID` (the level at its knee), an experiment
    name or file (its newest run), or None (the newest run of all)."""
    if text is None:
        runs = store.list_runs()
        if not runs:
            raise NotFoundError(
                "the database holds no runs to diagnose",
                hint="measure one first: `optlab run EXPERIMENT.yaml --quick`",
            )
        return Subject(runs[-1].id, f"the newest run, of {runs[-1].experiment}")
    text = text.strip()
    if text.isdigit():
        store.get_run(int(text))  # NotFoundError with the id
        return Subject(int(text), None)
    if text.lower().startswith("sweep:"):
        return _sweep_level(store, text.split(":", 1)[1])
    name = text
    path = Path(text)
    if path.suffix in EXPERIMENT_SUFFIXES and not path.is_file():
        raise NotFoundError(
            f"{path}: no such file",
            hint="give an experiment file that exists, its name, a run id or sweep:ID",
        )
    if path.suffix in EXPERIMENT_SUFFIXES:
        found = read_name(path)
        if found is None:
            raise ConfigError(f"{path}: no `name`", hint="an experiment file names itself")
        name = found
    if store.get_experiment(name) is None:
        known = [e.name for e in store.list_experiments()]
        guess = difflib.get_close_matches(name, known, n=1)
        raise NotFoundError(
            f"no experiment {name!r} in this database",
            hint=(f"did you mean {guess[0]!r}? " if guess else "")
            + "give a run id, an experiment name or file, or sweep:ID (`optlab log` lists runs)",
        )
    runs = store.list_runs(name)
    if not runs:
        raise NotFoundError(
            f"experiment {name!r} has no runs yet",
            hint=f"measure it first: `optlab run {text if path.suffix else name + '.yaml'}`",
        )
    return Subject(runs[-1].id, f"the newest run of {name}")


def _sweep_level(store: Store, ident: str) -> Subject:
    if not ident.strip().isdigit():
        raise ConfigError(
            f"sweep:{ident}: a sweep is named by its number", hint="e.g. sweep:3 (`optlab sweeps`)"
        )
    sweep = store.get_sweep(int(ident))
    # Each level is a stored run; its achieved throughput is the run's own QPS.
    achieved = {level.run_id: store.get_run(level.run_id).qps or 0.0 for level in sweep.levels}
    if not achieved:
        raise NotFoundError(
            f"sweep {sweep.id} has no measured levels",
            hint="diagnose one of its experiment's runs instead (`optlab log`)",
        )
    result = sweep.result or {}
    knee = result.get("knee_qps")
    if isinstance(knee, int | float):
        chosen = min(achieved, key=lambda run_id: abs(achieved[run_id] - knee))
        why = f"the level at its knee ({knee:,.1f}/s)"
    else:
        chosen = max(achieved, key=lambda run_id: achieved[run_id])
        why = "its busiest level (no knee was found)"
    return Subject(chosen, f"sweep {sweep.id}: {why}")


def write_next_step(
    store: Store, diagnosis: Diagnosis, command: str, output: Path | None = None
) -> Path:
    """Write the top finding's step: parent = the run's experiment, change = the one knob,
    hypothesis = the finding and its numbers. Refuses when there is no knob to change."""
    # Measurement findings (a neighbour, a late generator, errors) rank first but name no knob:
    # the step answers the first finding about the target itself, and the caller warns.
    about_target = [f for f in diagnosis.findings if not f.rule.invalidates]
    top = about_target[0] if about_target else diagnosis.top
    if top is None:
        raise ConfigError(
            f"run {diagnosis.run_id} of {diagnosis.experiment} is healthy: no rule fired, so "
            "there is no step to write",
            hint="sweep it (`optlab sweep`) to find where it bends, and diagnose that level",
        )
    if top.suggestion is None:
        raise ConfigError(
            f"the bottleneck ({top.bottleneck}: {top.rule.title}) is not one of the target's "
            "knobs optlab knows, so no step file was written",
            hint=f"try: {top.advice}" if top.advice else "change the target by hand",
        )
    run = store.get_run(diagnosis.run_id)
    config = store.get_config(run.config_id)
    parent_file = Path(config.source_path) if config.source_path else None
    folder = parent_file.parent if parent_file is not None else Path.cwd()
    if output is None:
        if not folder.is_dir():
            folder = Path.cwd()
        path = step_path(folder, parent_file, top.suggestion)
    else:
        path = output
    taken = {e.name for e in store.list_experiments()}
    if path.parent.is_dir():
        taken |= set(Catalog.scan(path.parent).by_name)
    name = step_name(diagnosis.experiment, top.suggestion, taken)
    document = step_document(diagnosis.experiment, top.suggestion, _hypothesis(top), name)
    header = (
        f"written by `{command} --write-step` on {stamp()} from run {diagnosis.run_id}: "
        f"{top.rule.title} ({top.bottleneck}, confidence {top.confidence:.2f})"
    )
    return write_step(path, document, header)


def _hypothesis(top: Finding) -> str:
    numbers = "; ".join(m.describe() for m in top.evidence if m.threshold is not None)
    why = top.suggestion.why if top.suggestion is not None else ""
    stage = top.stage or "the latency"
    return (
        f"diagnosis {top.rule.id}: {top.summary} ({numbers}). {why[:1].upper() + why[1:]}; "
        f"expect {stage} time to fall and QPS to rise"
    )
