"""What `optlab diagnose` is asked about (a run id, an experiment, `sweep:ID`), and writing the
next step's file for it (docs/diagnose.md)."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from optlab.chain.catalog import EXPERIMENT_SUFFIXES, Catalog
from optlab.config.models import FULL_MIN_DURATION_S
from optlab.config.protocol import QUICK_DURATION_S, QUICK_WARMUP_S
from optlab.config.source import read_name
from optlab.diagnose.diagnosis import Diagnosis, Finding
from optlab.diagnose.remedies import stamp, step_document, step_name, step_path, write_step
from optlab.errors import ConfigError, NotFoundError
from optlab.store import Store

__all__ = ["Subject", "measure_command", "resolve", "write_next_step"]

MAX_RUN_ID = 2**63 - 1  # the database's integer ids (SQLite and PostgreSQL bigint)


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
        if int(text) > MAX_RUN_ID:
            raise NotFoundError(
                f"run {text} does not exist (run ids are at most {MAX_RUN_ID:,})",
                hint="give a run id that `optlab log` lists, an experiment name or file, or "
                "sweep:ID",
            )
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
    knee = sweep.result.knee_qps if sweep.result else None
    if knee is not None:
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
    # The saturation finding is a symptom: the step answers what limits the target.
    about_target = [f for f in diagnosis.findings if not f.rule.invalidates]
    causes = [f for f in about_target if f.rule.id != "saturated"]
    top = causes[0] if causes else (about_target[0] if about_target else diagnosis.top)
    if top is None:
        state = "healthy" if diagnosis.healthy else diagnosis.state
        raise ConfigError(
            f"run {diagnosis.run_id} of {diagnosis.experiment} is {state}: no rule fired, so "
            "there is no step to write"
            + (f" ({diagnosis.state_reason})" if diagnosis.state_reason else ""),
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
    parent_file = _local_file(store, config.source_path)
    if output is None:
        if parent_file is None:
            raise ConfigError(
                f"run {diagnosis.run_id}'s experiment file "
                + (f"({config.source_path}) " if config.source_path else "")
                + "is not here (not a file under this folder or this database's project, "
                "e.g. an imported run): nothing was written",
                hint="say where the step goes: --output PATH (e.g. --output "
                f"./{step_path(Path('.'), None, top.suggestion).name})",
            )
        path = step_path(parent_file.parent, parent_file, top.suggestion)
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


def _local_file(store: Store, source: str | None) -> Path | None:
    """The experiment file a run was measured from, when it is a file here: under the
    current folder or the database's project (the folder holding `.optlab/`). A path a
    bundle named, or one that no longer exists, is not written beside."""
    if not source:
        return None
    path = Path(source)
    try:
        resolved = path.resolve()
        if not resolved.is_file():
            return None
    except OSError:
        return None
    roots = [Path.cwd().resolve()]
    database = store.engine.url.database
    if store.engine.url.get_backend_name() == "sqlite" and database:
        folder = Path(database).resolve().parent
        roots.append(folder.parent if folder.name == ".optlab" else folder)
    return resolved if any(resolved.is_relative_to(root) for root in roots) else None


def _hypothesis(top: Finding) -> str:
    numbers = "; ".join(m.describe() for m in top.evidence if m.threshold is not None)
    why = top.suggestion.why if top.suggestion is not None else ""
    stage = top.stage or "the latency"
    return (
        f"diagnosis {top.rule.id}: {top.summary} ({numbers}). {why[:1].upper() + why[1:]}; "
        f"expect {stage} time to fall and QPS to rise"
    )


def measure_command(store: Store, run_id: int, path: Path) -> str:
    """`optlab run PATH` with the protocol the diagnosed run was measured under (--quick,
    --duration, --warmup), so the step is measured as its parent was: a quick parent's step
    run without --quick is compared against a parent with no run of its protocol."""
    protocol = store.get_run(run_id).protocol or {}
    flags: list[str] = []
    quick = protocol.get("name") == "quick"
    if quick:
        flags.append("--quick")
    duration = protocol.get("duration_s")
    default = QUICK_DURATION_S if quick else FULL_MIN_DURATION_S
    if isinstance(duration, int | float) and duration != default:
        flags += ["--duration", f"{duration:g}"]
    warmup = protocol.get("warmup_s")
    fixed = protocol.get("warmup") == "fixed"
    if isinstance(warmup, int | float) and fixed and not (quick and warmup == QUICK_WARMUP_S):
        flags += ["--warmup", f"{warmup:g}"]
    return " ".join(["optlab run", str(path), *flags])
