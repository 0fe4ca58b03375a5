"""`optlab sweep-knob`: k sibling steps of one parent, each changing only one knob, measured
in randomised interleaved blocks with the parent as the control in every block; each value's
paired effect against the parent, and a winner only where it beats the runner-up beyond noise.

A block measures every arm once (the parent and each value), in an order drawn from the
sweep's seed, so a slow drift of a shared machine is shared by the arms of a block and cancels
out of their differences. Each cell is a normal stored run tagged with the block (the runs'
`paired` tag: {"session": "knob-<uid>", "index": block, "role": "parent" | "step"}), or with
`--slo` a capacity sweep. The sweep is a stored record (`store.knob_sweeps`): Ctrl-C keeps the
cells measured, and asking the same question again resumes it, reusing its valid cells and
measuring an INVALID one again (once). The document it ends with is docs/sweep-knob-json.md's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optlab.chain.lineage import Link, prepare
from optlab.config.models import ResolvedConfig
from optlab.config.slo import Slo
from optlab.errors import OptlabError
from optlab.knobs.decision import checked, decide, promotable
from optlab.knobs.metric import (
    CAPACITY,
    CellFigure,
    Metric,
    capacity_figure,
    metric,
    missing,
    run_figure,
)
from optlab.knobs.promotion import promote
from optlab.knobs.spec import (
    KnobRequest,
    current_value,
    parse_key,
    parse_values,
    value_key,
    write_siblings,
)
from optlab.metrics.selection import Arm
from optlab.run.progress import GuardedProgress, Progress
from optlab.run.runner import (
    Context,
    RunOptions,
    measure_in_block,
    open_context,
    process_alive,
)
from optlab.store import KnobSweepRecord, Store
from optlab.sweep.driver import SweepOptions, sweep

__all__ = ["KnobOptions", "KnobOutcome", "TIE_BREAKS", "promote", "sweep_knob"]

TIE_BREAKS = ("nearest", "cheapest", "best")
MAX_BLOCKS = 50
SESSION_PREFIX = "knob-"


@dataclass(frozen=True)
class KnobOptions:
    knob: str
    values: str | tuple[Any, ...]  # as typed (comma-separated), or already parsed
    metric: str | None = None  # default: capacity with an SLO, else qps (closed) or p99 (open)
    slo: Slo | None = None
    blocks: int = 3
    quick: bool = False
    duration_s: float | None = None
    warmup_s: float | None = None
    seed: int | None = None
    tie_break: str = "nearest"
    promote: bool = False
    mode: str = "open"  # a capacity sweep's loop
    # `optlab tune`: a FINISHED sweep of the same question is the answer (a tune asked again
    # after Ctrl-C goes on where it stopped, and never promotes one value twice).
    reuse_finished: bool = False


@dataclass
class KnobOutcome:
    knob_sweep_id: int
    status: str
    document: dict[str, Any]
    measured_s: float
    promoted: Path | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _ArmSpec:
    value: Any
    experiment: str
    path: Path
    link: Link


def _check(options: KnobOptions) -> None:
    if not 1 <= options.blocks <= MAX_BLOCKS:
        raise OptlabError(
            f"--blocks {options.blocks} is outside 1..{MAX_BLOCKS}",
            hint="3 blocks (the default) measure each arm three times, interleaved",
        )
    if options.tie_break not in TIE_BREAKS:
        raise OptlabError(
            f"--tie-break {options.tie_break!r} is not one of {', '.join(TIE_BREAKS)}",
            hint="nearest: the tied value nearest the parent's; cheapest: the one using the "
            "least CPU; best: the one with the best mean",
        )
    if options.metric == CAPACITY and options.slo is None:
        raise OptlabError(
            "--metric capacity needs --slo: capacity is the highest rate meeting it",
            hint="e.g. --slo p99=60ms",
        )


def _metric_for(options: KnobOptions, config: ResolvedConfig, where: str) -> Metric:
    if options.metric is None:
        if options.slo is not None:
            return metric(CAPACITY)
        closed = config.workload.load.mode == "closed"
        return metric("qps" if closed else "p99")
    m = metric(options.metric)
    if m.streaming and config.target.kind != "openai":
        raise OptlabError(
            f"--metric {m.name} is a streaming LLM figure, and {where}'s target is "
            f"{config.target.kind}",
            hint="use qps, p50, p99 or capacity (with --slo)",
        )
    return m


def _order(seed: int, blocks: int, arms: int) -> list[list[int]]:
    """Each block's arms in a random order (the sweep's seed draws every block's)."""
    rng = random.Random(seed)
    order = []
    for _ in range(blocks):
        block = list(range(arms))
        rng.shuffle(block)
        order.append(block)
    return order


def _question(
    options: KnobOptions, m: Metric, config_hash: str, arms: Sequence[_ArmSpec]
) -> dict[str, Any]:
    """What makes two requests the same question: a resumed sweep must match it."""
    return {
        "knob": options.knob,
        "values": [value_key(a.value) for a in arms],
        "arms": [a.experiment for a in arms],
        "metric": m.name,
        "blocks": options.blocks,
        "slo": None if options.slo is None else options.slo.model_dump(mode="json"),
        "mode": options.mode if m.name == CAPACITY else None,
        "quick": options.quick,
        "duration_s": options.duration_s,
        "warmup_s": options.warmup_s,
        "parent_config_hash": config_hash,
    }


def _stored(
    store: Store, parent: str, question: dict[str, Any], *, finished: bool
) -> KnobSweepRecord | None:
    """The newest sweep of this very question: FINISHED with its document (`finished`), or
    one that stopped before its end (KILLED, CRASHED, FAILED: resumable)."""
    for record in reversed(store.list_knob_sweeps(parent)):
        if record.spec.get("question") != question or record.status == "RUNNING":
            continue
        if finished == (record.status == "FINISHED") and (not finished or record.result):
            return record
    return None


class _KnobSweep:
    def __init__(
        self,
        store: Store,
        options: KnobOptions,
        progress: Progress,
        context: Context,
        arms: list[_ArmSpec],
        m: Metric,
        request: KnobRequest,
        parent_value: Any,
        on_cell: Callable[[KnobOutcome], None] | None,
    ) -> None:
        self.store, self.options, self.progress, self.context = store, options, progress, context
        self.arms, self.metric, self.request = arms, m, request
        self.parent_value = parent_value
        self.on_cell = on_cell
        parent = arms[0]
        question = _question(options, m, parent.link.stored.config_hash, arms)
        found = _stored(store, parent.experiment, question, finished=False)
        if found is not None:
            self.id = found.id
            self.uid = found.uid
            self.order: list[list[int]] = found.spec["order"]
            self.seed = int(found.spec["seed"])
            self.measured_s = found.measured_s or 0.0
            store.resume_knob_sweep(found.id)
            kept = sum(1 for c in found.cells if c.run_id is not None or c.sweep_id is not None)
            progress.note(
                f"sweep-knob {found.id}: resuming ({found.status}); {kept} of "
                f"{len(arms) * options.blocks} cells measured before"
            )
        else:
            self.seed = (
                options.seed if options.seed is not None else random.SystemRandom().randrange(2**31)
            )
            self.order = _order(self.seed, options.blocks, len(arms))
            spec = {
                "question": question,
                "seed": self.seed,
                "order": self.order,
                "tie_break": options.tie_break,
                "parent_value": value_key(parent_value),
            }
            self.id = store.create_knob_sweep(
                experiment=parent.experiment, knob=request.key, metric=m.name, spec=spec
            )
            self.uid = store.get_knob_sweep(self.id).uid
            self.measured_s = 0.0
        self.outcome = KnobOutcome(self.id, "RUNNING", {}, self.measured_s)

    # -- measuring ------------------------------------------------------------------------

    def _figure(self, run_id: int | None, sweep_id: int | None) -> CellFigure:
        if self.metric.name == CAPACITY:
            return capacity_figure(None if sweep_id is None else self.store.get_sweep(sweep_id))
        return run_figure(
            self.store, None if run_id is None else self.store.get_run(run_id), self.metric
        )

    def _cells(self) -> dict[tuple[int, int], tuple[int | None, int | None]]:
        record = self.store.get_knob_sweep(self.id)
        return {(c.block, c.arm): (c.run_id, c.sweep_id) for c in record.cells}

    def run(self) -> KnobOutcome:
        try:
            cells = self._cells()
            for block, order in enumerate(self.order):
                for position, arm in enumerate(order):
                    held = cells.get((block, arm))
                    last = None if held is None else self._figure(*held)
                    if last is not None and last.value is not None:
                        continue
                    # A cell measured before and not usable is measured once more; a new one
                    # twice at most.
                    for _ in range(1 if last is not None else 2):
                        status, figure = self._measure(
                            block, position, arm, "" if last is None else last.why
                        )
                        if status == "KILLED":
                            return self._finish("KILLED")
                        if figure.value is not None:
                            break
                        last = figure
        except KeyboardInterrupt:
            self._finish("KILLED")
            raise
        except Exception as exc:
            self._finish("FAILED", error=f"{type(exc).__name__}: {exc}")
            raise
        return self._finish("FINISHED")

    def _measure(
        self, block: int, position: int, arm: int, unusable: str
    ) -> tuple[str, CellFigure]:
        """Measure one cell; `unusable`: why the cell's last measurement is not a figure
        ("" for a cell not measured before)."""
        spec = self.arms[arm]
        what = "the parent" if arm == 0 else f"{self.request.key} = {spec.value}"
        self.progress.note(
            f"sweep-knob {self.id} block {block + 1}/{len(self.order)}, "
            f"{position + 1}/{len(self.arms)}: {what} ({spec.experiment})"
            + (f" again: the last one is not usable ({unusable})" if unusable else "")
        )
        run_id = sweep_id = None
        if self.metric.name == CAPACITY:
            assert self.options.slo is not None
            outcomes = sweep(
                spec.path,
                self.store,
                SweepOptions(
                    slo=self.options.slo,
                    mode="closed" if self.options.mode == "closed" else "open",
                    quick=self.options.quick,
                    reuse=False,
                ),
                self.progress,
            )
            out = outcomes[-1]
            status, sweep_id, seconds = out.status, out.sweep_id, out.measured_s
        else:
            tag = {
                "session": f"{SESSION_PREFIX}{self.uid}",
                "index": block,
                "role": "parent" if arm == 0 else "step",
            }
            run_options = RunOptions(
                self.options.quick, self.options.duration_s, self.options.warmup_s
            )
            outcome = measure_in_block(
                self.store, spec.link, run_options, self.progress, self.context, tag
            )
            status, run_id = outcome.status, outcome.run_id
            record = self.store.get_run(run_id) if not outcome.pending else None
            seconds = (
                0.0 if record is None else (record.warmup_s or 0.0) + (record.duration_s or 0.0)
            )
        self.measured_s += seconds
        if status == "KILLED":
            return status, self._figure(None, None)
        self.store.set_knob_cell(
            self.id,
            block=block,
            arm=arm,
            position=position,
            run_id=run_id,
            sweep_id=sweep_id,
            measured_s=seconds,
        )
        figure = self._figure(run_id, sweep_id)
        if self.on_cell is not None:
            self.outcome.measured_s = self.measured_s
            self.on_cell(self.outcome)
        return status, figure

    # -- reading --------------------------------------------------------------------------

    def arm_data(self) -> tuple[list[Arm], list[float | None], list[str]]:
        """Each arm's block entries, its mean CPU (for the `cheapest` tie-break), and why
        its last cell that is not a figure is not ("" where none)."""
        cells = self._cells()
        blocks = len(self.order)
        arms, cpu, unusable = [], [], []
        for arm in range(len(self.arms)):
            logs, ses, dfs, cpus = [], [], [], []
            why = ""
            for block in range(blocks):
                held = cells.get((block, arm))
                figure = self._figure(*held) if held else missing("not measured")
                why = figure.why or why
                logs.append(figure.log)
                ses.append(figure.se)
                dfs.append(figure.df)
                if held and held[0] is not None and figure.value is not None:
                    summary = self.store.get_run(held[0]).summary
                    if summary is not None:
                        used = summary.resources.mean_of("service_cpu_pct")
                        used = (
                            used
                            if used is not None
                            else summary.resources.mean_of("cpu_process_pct")
                        )
                        if used is not None:
                            cpus.append(used)
            arms.append(Arm(logs, ses, dfs, averages_out=self.metric.name != CAPACITY))
            cpu.append(sum(cpus) / len(cpus) if cpus else None)
            unusable.append(why)
        return arms, cpu, unusable

    def _finish(self, status: str, error: str | None = None) -> KnobOutcome:
        arms, cpu, unusable = self.arm_data()
        document = decide(
            arms,
            values=[a.value for a in self.arms],
            experiments=[a.experiment for a in self.arms],
            asked=list(self.request.values),
            parent_value=self.parent_value,
            knob=self.request.key,
            m=self.metric,
            tie_break=self.options.tie_break,
            cpu=cpu,
            unusable=unusable,
        )
        document |= {
            "knob_sweep_id": self.id,
            "status": status,
            "blocks": len(self.order),
            "measured_s": round(self.measured_s, 3),
            "promoted": None,
            "promoted_experiment": None,
        }
        document = checked(document)
        self.store.finish_knob_sweep(
            self.id, status=status, result=document, measured_s=self.measured_s, error=error
        )
        self.outcome = KnobOutcome(self.id, status, document, self.measured_s)
        return self.outcome


# -- the command ----------------------------------------------------------------------------


def _arms(
    path: Path, store: Store, context: Context, request: KnobRequest, parent_value: Any
) -> list[_ArmSpec]:
    link = context.chain[-1]
    hypothesis = f"sweep-knob: {request.key} = {{}} against {link.name}"
    siblings = write_siblings(path, link.stored, link.name, request, hypothesis)
    arms = [_ArmSpec(parent_value, link.name, path, link)]
    for sibling in siblings:
        sibling_link = prepare(sibling.path, store).chain[-1]
        arms.append(_ArmSpec(sibling.value, sibling.name, sibling.path, sibling_link))
    return arms


def sweep_knob(
    path: Path,
    store: Store,
    options: KnobOptions,
    progress: Progress,
    on_cell: Callable[[KnobOutcome], None] | None = None,
) -> KnobOutcome:
    """Sweep one knob of the experiment at `path` (see the module's docstring)."""
    _check(options)
    progress = GuardedProgress(progress)
    for knob_id in store.mark_knob_sweeps_crashed(process_alive):
        progress.note(f"sweep-knob {knob_id} was left RUNNING by a process that is gone: CRASHED")
    context = open_context(path, store, progress)
    link = context.chain[-1]
    config = ResolvedConfig.model_validate(link.stored.config)
    knobs = link.stored.config.get("knobs", {})
    key_path = parse_key(options.knob, knobs, str(path))
    parent_value = current_value(knobs, key_path)
    values = (
        parse_values(options.values, parent_value)
        if isinstance(options.values, str)
        else tuple(options.values)
    )
    request = KnobRequest(".".join(key_path), key_path, values)
    m = _metric_for(options, config, str(path))
    arms = _arms(path, store, context, request, parent_value)
    answered = (
        _stored(
            store,
            arms[0].experiment,
            _question(options, m, link.stored.config_hash, arms),
            finished=True,
        )
        if options.reuse_finished
        else None
    )
    if answered is not None and answered.result is not None:
        progress.note(
            f"sweep-knob {answered.id}: this question was answered before (FINISHED); its "
            "answer is used, nothing is measured again"
        )
        outcome = KnobOutcome(
            answered.id, "FINISHED", dict(answered.result), answered.measured_s or 0.0
        )
    else:
        search = _KnobSweep(
            store, options, progress, context, arms, m, request, parent_value, on_cell
        )
        outcome = search.run()
    if options.promote and outcome.status == "FINISHED":
        _promote_outcome(path, store, outcome, arms)
    return outcome


def _promote_outcome(
    path: Path, store: Store, outcome: KnobOutcome, arms: Sequence[_ArmSpec]
) -> None:
    """Promote a finished sweep's value (`promote`) and store where it went in its document."""
    promoted, note = promote(path, outcome.document, arms)
    outcome.promoted = promoted
    outcome.notes.append(note)
    if promoted is None or outcome.document.get("promoted") == str(promoted):
        return
    outcome.document["promoted"] = str(promoted)
    outcome.document["promoted_experiment"] = next(
        a.experiment for a in arms if value_key(a.value) == value_key(promotable(outcome.document))
    )
    outcome.document = checked(outcome.document)
    store.finish_knob_sweep(
        outcome.knob_sweep_id,
        status=outcome.status,
        result=outcome.document,
        measured_s=outcome.measured_s,
    )
