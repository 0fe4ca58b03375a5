"""`optlab tune` on experiment files: the configs are step files, each knob sweep is a stored
`optlab sweep-knob` (resumable like any), and each value tune keeps is promoted beside the
experiment, so the stacked-gains table of the final step shows the whole tuned chain."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from optlab.chain.lineage import prepare
from optlab.errors import OptlabError
from optlab.knobs.search import KnobOptions, sweep_knob
from optlab.knobs.spec import current_value, derive_step, parse_key, parse_values, value_key
from optlab.knobs.tune import TuneResult, tune
from optlab.run.progress import Progress
from optlab.store import Store

__all__ = ["TUNE_SCHEMA_VERSION", "TuneOptions", "parse_space", "run_tune", "tune_document"]

TUNE_SCHEMA_VERSION = 1


@dataclass(frozen=True)
class TuneOptions:
    knobs: str  # "a,b,c"
    values: tuple[str, ...]  # ("a=1,2,4", "b=...")
    budget_s: float | None = None
    sweep: KnobOptions | None = None  # everything else a knob sweep is asked (metric, blocks..)


def parse_space(
    knobs: str, values: Sequence[str], parent_knobs: dict[str, Any], where: str
) -> list[tuple[str, tuple[Any, ...]]]:
    """`--knobs a,b` and one `--values KNOB=V1,V2,...` per knob, checked as sweep-knob checks
    them, all before anything is measured."""
    names = [k.strip() for k in knobs.split(",")]
    if len(names) < 1 or any(not n for n in names):
        raise OptlabError(
            f"--knobs {knobs!r} has an empty name", hint="e.g. --knobs servers,max_batch_size"
        )
    if len(set(names)) != len(names):
        raise OptlabError(f"--knobs {knobs!r} names a knob twice", hint="name each knob once")
    given: dict[str, str] = {}
    for text in values:
        knob, sep, listed = text.partition("=")
        if not sep or not knob.strip():
            raise OptlabError(
                f"--values {text!r} does not say which knob", hint="write --values KNOB=V1,V2,..."
            )
        if knob.strip() in given:
            raise OptlabError(f"--values for {knob.strip()} is given twice", hint="once per knob")
        given[knob.strip()] = listed
    space = []
    for name in names:
        if name not in given:
            raise OptlabError(
                f"--knobs names {name} but no --values {name}=...",
                hint=f"add --values {name}=V1,V2,... (two or more values)",
            )
        path = parse_key(name, parent_knobs, where)
        space.append((".".join(path), parse_values(given[name], current_value(parent_knobs, path))))
    extra = sorted(set(given) - set(names))
    if extra:
        raise OptlabError(
            f"--values for {', '.join(extra)}, which --knobs does not name",
            hint="add them to --knobs, or drop their --values",
        )
    return space


def run_tune(
    path: Path, store: Store, options: TuneOptions, progress: Progress
) -> tuple[TuneResult[Path], str]:
    """Tune the experiment at `path` (see `optlab.knobs.tune`); and the experiment's name."""
    base = options.sweep or KnobOptions(knob="", values="")
    start = prepare(path, store).chain[-1]
    space = parse_space(
        options.knobs, options.values, start.stored.config.get("knobs", {}), str(path)
    )
    promoted: dict[tuple[str, str, str], Path] = {}

    def value_of(config: Path, knob: str) -> Any:
        link = prepare(config, store).chain[-1]
        return current_value(link.stored.config.get("knobs", {}), knob.split("."))

    def sweep(config: Path, knob: str, values: Sequence[Any], purpose: str) -> dict[str, Any]:
        progress.note(f"tune: {purpose}: sweeping {knob} at {config.name}")
        asked = replace(
            base, knob=knob, values=tuple(values), promote=purpose != "2x2", reuse_finished=True
        )
        outcome = sweep_knob(config, store, asked, progress)
        if outcome.status != "FINISHED":
            raise (
                KeyboardInterrupt
                if outcome.status == "KILLED"
                else OptlabError(f"tune: the sweep of {knob} ended {outcome.status}")
            )
        doc = outcome.document
        if outcome.promoted is not None:
            pick = doc["winner"] if doc["winner"] is not None else doc["chosen"]
            promoted[(str(config), knob, value_key(pick))] = outcome.promoted
        return doc

    def derive(config: Path, knob: str, value: Any) -> Path:
        found = promoted.get((str(config), knob, value_key(value)))
        if found is not None:
            return found
        link = prepare(config, store).chain[-1]
        return derive_step(config, link.stored, link.name, knob.split("."), value)

    result = tune(
        path, space, sweep=sweep, derive=derive, value_of=value_of, budget_s=options.budget_s
    )
    return result, start.name


def tune_document(result: TuneResult[Path], experiment: str) -> dict[str, Any]:
    """`optlab tune --json`'s document (docs/sweep-knob-json.md, "tune")."""
    from optlab.knobs.document import TuneDocument

    return TuneDocument.model_validate(_tune_fields(result, experiment)).model_dump(mode="json")


def _tune_fields(result: TuneResult[Path], experiment: str) -> dict[str, Any]:
    return {
        "schema_version": TUNE_SCHEMA_VERSION,
        "experiment": experiment,
        "final": str(result.final),
        "steps": [
            {
                "purpose": s.purpose,
                "knob": s.knob,
                "knob_sweep_id": s.document.get("knob_sweep_id"),
                "winner": s.document["winner"],
                "tie": s.document["tie"],
                "promoted": s.promoted,
                "sentence": s.document["sentence"],
            }
            for s in result.steps
        ],
        "flags": result.flags,
        "interaction": result.interaction,
        "measured_s": round(result.measured_s, 3),
        "stopped": result.stopped,
    }
