"""`optlab sweep-knob` (which value of one knob, measured interleaved against the parent) and
`optlab tune` (several knobs in turn, then an interaction check)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from optlab.cli.common import EXPERIMENT_PATH, experiment_store, open_store
from optlab.cli.runs import EXIT_INVALID, LiveProgress, PlainProgress, echo_or_reader_gone

if TYPE_CHECKING:
    from optlab.knobs.search import KnobOptions
    from optlab.run.progress import Progress

METRIC_HELP = (
    "What the values are compared by: qps, p50, p99, ttft_p50, ttft_p99, tpot_p50, tpot_p99, "
    "tok_s, capacity (needs --slo). Default: capacity with --slo, else qps for a closed loop "
    "and p99 for an open one."
)


_MEASURING = (
    click.option("--metric", metavar="NAME", help=METRIC_HELP),
    click.option(
        "--slo",
        "slo_text",
        metavar="pNN=TIME",
        help="Compare capacities under this SLO (each cell is an `optlab sweep`), e.g. p99=60ms.",
    ),
    click.option(
        "--mode",
        type=click.Choice(["open", "closed"]),
        default="open",
        show_default=True,
        help="The capacity sweeps' loop (with --slo).",
    ),
    click.option(
        "--blocks",
        type=int,
        default=3,
        show_default=True,
        help="How many times each arm is measured, one block of every arm at a time.",
    ),
    click.option("--quick", is_flag=True, help="Seconds-long PROVISIONAL runs (demos, tests)."),
    click.option("--duration", type=float, metavar="S", help="Measured seconds of each run."),
    click.option("--warmup", type=float, metavar="S", help="Fixed warmup, not until-stable."),
    click.option("--seed", type=int, help="The blocks' random order (default: drawn)."),
    click.option(
        "--tie-break",
        type=click.Choice(["nearest", "cheapest", "best"]),
        default=None,
        help="Which tied value is chosen: the one nearest the parent's (sweep-knob's default), "
        "the one using least CPU, or the one with the best mean (tune's default: it seeks "
        "the optimum, and promotes only a value better than the parent beyond noise).",
    ),
)


def _measuring_options(command: Callable[..., None]) -> Callable[..., None]:
    """The options every knob sweep is asked with (sweep-knob's, and tune's for each sweep)."""
    for option in reversed(_MEASURING):
        command = option(command)
    return command


def _knob_options(
    knob: str, values: str, measuring: dict[str, Any], default_tie_break: str = "nearest"
) -> KnobOptions:
    from optlab.config.slo import parse_slo
    from optlab.knobs.search import KnobOptions

    slo_text = measuring["slo_text"]
    return KnobOptions(
        knob=knob,
        values=values,
        metric=measuring["metric"],
        slo=None if slo_text is None else parse_slo(slo_text),
        blocks=measuring["blocks"],
        quick=measuring["quick"],
        duration_s=measuring["duration"],
        warmup_s=measuring["warmup"],
        seed=measuring["seed"],
        tie_break=measuring["tie_break"] or default_tie_break,
        mode=measuring["mode"],
    )


@click.command("sweep-knob")
@click.argument("experiment", type=EXPERIMENT_PATH)
@click.option("--knob", required=True, metavar="KEY", help="One knob: NAME or NAME.FIELD.")
@click.option(
    "--values", "values_text", required=True, metavar="V1,V2,...", help="Two or more values."
)
@_measuring_options
@click.option(
    "--promote",
    is_flag=True,
    help="Write the winner as the next step file beside EXPERIMENT (the stacked table grows "
    "by one row).",
)
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: the sweep's JSON.")
@click.pass_context
def sweep_knob(
    ctx: click.Context,
    /,
    experiment: str,
    knob: str,
    values_text: str,
    promote: bool,
    as_json: bool,
    **measuring: Any,
) -> None:
    """Measure sibling steps of EXPERIMENT that each change only KEY to one of the values,
    in randomised interleaved blocks with EXPERIMENT as the control in every block; report
    each value's effect with its interval, and a winner only where it beats the runner-up
    beyond noise (docs/sweep-knob-json.md).

    Asked again after Ctrl-C, the same question resumes the stored sweep. Exit codes: 0
    swept; 4 swept, but a value (or the parent) has no valid measurement, so it is not judged
    (said, with why); 2 bad input or refused (before anything is measured); 1 FAILED; 130
    interrupted.
    """
    from optlab.knobs.search import sweep_knob as run_knob_sweep
    from optlab.reports.knob import render_knob
    from optlab.run.progress import GuardedProgress

    options = replace(_knob_options(knob, values_text, measuring), promote=promote)
    live = sys.stderr.isatty() and not as_json
    shown: PlainProgress | LiveProgress = LiveProgress() if live else PlainProgress()
    progress = GuardedProgress(shown)
    # A refused sweep (a value the knob model refuses) leaves no new empty database behind.
    with experiment_store(ctx, experiment) as store:
        try:
            outcome = run_knob_sweep(Path(experiment), store, options, progress)
        finally:
            shown.close()
    text = render_knob(outcome.document)
    for note in outcome.notes:
        text += f"\n{note}"
    if as_json:
        progress.note(text)
        echo_or_reader_gone(json.dumps(outcome.document, default=str, allow_nan=False))
    else:
        echo_or_reader_gone(text)
    if outcome.status == "KILLED":
        ctx.exit(130)
    if outcome.status == "FAILED":
        ctx.exit(1)
    _exit_if_unjudged(ctx, progress, [outcome.document], said=True)


def _exit_if_unjudged(
    ctx: click.Context, progress: Progress, documents: list[dict[str, Any]], said: bool = False
) -> None:
    """Exit 4 (docs/exit-codes.md) where a sweep's value has no valid measurement: each one
    said on stderr with why (unless the sweep's rendering `said` it), and the fix."""
    from optlab.knobs.decision import unjudged

    lines = [
        f"sweep-knob {doc['knob_sweep_id']}: {line}" for doc in documents for line in unjudged(doc)
    ]
    if not lines:
        return
    if not said:
        for line in lines:
            progress.note(line)
    progress.note(
        "hint: each reason says what to change (a run too short for its P99: a longer "
        "--duration; a FAILED one: its target), then ask again; every run stays stored "
        f"(`optlab log`). Exit {EXIT_INVALID}"
    )
    ctx.exit(EXIT_INVALID)


@click.command("knob-sweeps")
@click.argument("experiment", required=False)
@click.option("--show", "show_id", type=int, metavar="ID", help="One knob sweep, in full.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown", "svg"]),
    default="text",
    show_default=True,
    help="How --show prints it (svg: its knob-response chart).",
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per knob sweep.")
@click.pass_context
def knob_sweeps(
    ctx: click.Context, experiment: str | None, show_id: int | None, fmt: str, as_json: bool
) -> None:
    """List knob sweeps (oldest first), of one parent EXPERIMENT or all: the knob, the metric,
    the winner or the tie, the status; --show ID prints one (docs/sweep-knob-json.md)."""
    from optlab.reports.knob import (
        knob_chart_svg,
        render_knob,
        render_knob_list,
        render_knob_markdown,
    )

    store = open_store(ctx, read_only=True)
    records = (
        [store.get_knob_sweep(show_id)]
        if show_id is not None
        else store.list_knob_sweeps(experiment)
    )
    # A sweep without a result yet (running, or its process gone): what it asks, its status.
    documents = [
        r.result
        or {
            "knob_sweep_id": r.id,
            "status": r.status,
            "experiment": r.experiment,
            "knob": r.knob,
            "metric": r.metric,
        }
        for r in records
    ]
    if as_json:
        for doc in documents:
            echo_or_reader_gone(json.dumps(doc, default=str, allow_nan=False))
        return
    if not records:
        click.echo("no knob sweeps yet" + (f" for {experiment}" if experiment else ""))
        return
    if show_id is not None:
        doc = documents[0]
        if "sentence" not in doc:
            echo_or_reader_gone(f"knob sweep {show_id}: {records[0].status}, no result yet")
            return
        render = {"markdown": render_knob_markdown, "svg": knob_chart_svg}.get(fmt, render_knob)
        echo_or_reader_gone(render(doc))
        return
    echo_or_reader_gone(render_knob_list(documents))


@click.command("tune")
@click.argument("experiment", type=EXPERIMENT_PATH)
@click.option("--knobs", "knobs_text", required=True, metavar="A,B,...", help="Knobs, in order.")
@click.option(
    "--values",
    "values_texts",
    multiple=True,
    required=True,
    metavar="KNOB=V1,V2,...",
    help="One per knob: the values to sweep it over.",
)
@click.option("--budget-s", type=float, metavar="S", help="Most measured seconds to spend.")
@_measuring_options
@click.option("--json", "as_json", is_flag=True, help="Last stdout line: the tune's JSON.")
@click.pass_context
def tune(
    ctx: click.Context,
    /,
    experiment: str,
    knobs_text: str,
    values_texts: tuple[str, ...],
    budget_s: float | None,
    as_json: bool,
    **measuring: Any,
) -> None:
    """Tune EXPERIMENT one knob at a time: sweep each knob in the order given (`optlab
    sweep-knob`), promote its winner, then check for interactions: the first knob swept again
    at the final config ("order-dependent gain" when its best value moved) and a 2x2 of the
    two knobs that gained most. Exit codes as sweep-knob's (4: a value of one of its sweeps has
    no valid measurement)."""
    from optlab.knobs.tune_run import TuneOptions, run_tune, tune_document
    from optlab.run.progress import GuardedProgress

    options = TuneOptions(
        knobs_text, values_texts, budget_s, _knob_options("", "", measuring, "best")
    )
    live = sys.stderr.isatty() and not as_json
    shown: PlainProgress | LiveProgress = LiveProgress() if live else PlainProgress()
    progress = GuardedProgress(shown)
    with experiment_store(ctx, experiment) as store:
        try:
            result, name = run_tune(Path(experiment), store, options, progress)
        except KeyboardInterrupt:
            progress.note(
                "tune: interrupted; every finished cell is stored, and the same command goes "
                "on where it stopped (docs/tune-json.md). Exit 130"
            )
            ctx.exit(130)
        finally:
            shown.close()
    doc = tune_document(result, name)
    lines = [f"tune {experiment}: {len(result.steps)} knob sweeps, {result.measured_s:,.0f} s"]
    lines += [f"  {s['purpose']}: {s['sentence']}" for s in doc["steps"]]
    lines += [f"FLAG {flag}" for flag in result.flags] or ["no interaction flagged"]
    if result.stopped:
        lines.append(f"stopped: {result.stopped}")
    lines.append(f"final: {result.final}")
    text = "\n".join(lines)
    if as_json:
        progress.note(text)
        echo_or_reader_gone(json.dumps(doc, default=str, allow_nan=False))
    else:
        echo_or_reader_gone(text)
    _exit_if_unjudged(ctx, progress, [s.document for s in result.steps])
