"""`optlab sweep` (capacity under the SLO, level by level) and `optlab sweeps` (what was
swept)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from optlab.cli.common import EXPERIMENT_PATH, open_store, store_url
from optlab.cli.runs import LiveProgress, PlainProgress, echo_or_reader_gone

if TYPE_CHECKING:
    from optlab.sweep.driver import SweepOutcome


def _percent(text: str) -> float:
    value = text.strip().rstrip("%")
    try:
        number = float(value)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not a percentage such as 5%") from None
    return number / 100


@click.command()
@click.argument("experiment", type=EXPERIMENT_PATH)
@click.option(
    "--slo",
    "slo_text",
    required=True,
    metavar="pNN=TIME",
    help="The latency objective each level is judged by: p99=60ms (p50, p95, p99, p99.9); "
    "for a streaming LLM target, bounds on its token series, all to be met: "
    "ttft_p99=500ms,tpot_p99=50ms (ttft, tpot, itl).",
)
@click.option(
    "--mode",
    type=click.Choice(["open", "closed"]),
    default="open",
    show_default=True,
    help="open: rates (the experiment's arrival process); closed: 1, 2, 4, ... clients.",
)
@click.option("--quick", is_flag=True, help="Seconds-long PROVISIONAL levels (demos, tests).")
@click.option("--level-duration", type=float, metavar="S", help="Measured seconds of a level.")
@click.option("--min-rate", type=float, metavar="R", help="First rate (clients when closed).")
@click.option("--max-rate", type=float, metavar="R", help="Highest rate (clients when closed).")
@click.option(
    "--tolerance", default="5%", show_default=True, help="Stop when the bracket is this narrow."
)
@click.option("--budget-s", type=float, metavar="S", help="Most measured seconds to spend.")
@click.option("--chain", is_flag=True, help="Sweep every experiment of the chain, baseline first.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown"]),
    default="text",
    show_default=True,
    help="How the levels are printed.",
)
@click.option("--json", "as_json", is_flag=True, help="One stdout line per sweep: its JSON.")
@click.pass_context
def sweep(
    ctx: click.Context,
    experiment: str,
    slo_text: str,
    mode: str,
    quick: bool,
    level_duration: float | None,
    min_rate: float | None,
    max_rate: float | None,
    tolerance: str,
    budget_s: float | None,
    chain: bool,
    fmt: str,
    as_json: bool,
) -> None:
    """Find the capacity of EXPERIMENT: the highest rate whose latency meets the SLO, with
    its interval, the knee, and what limited it (docs/sweep-json.md).

    Each level is a stored run; a level an earlier sweep measured under the same config,
    protocol, environment and code is reused. Exit codes: 0 swept; 2 bad input or refused;
    1 FAILED (the target failed at every level); 130 interrupted (the sweep is KILLED,
    its finished levels kept).
    """
    from optlab.config.slo import parse_slo
    from optlab.reports.sweep import load_sweep, render_sweep, render_sweep_markdown, sweep_json
    from optlab.run.progress import GuardedProgress
    from optlab.sweep.driver import SweepOptions, check_options
    from optlab.sweep.driver import sweep as run_sweep

    options = SweepOptions(
        slo=parse_slo(slo_text),
        mode="closed" if mode == "closed" else "open",
        quick=quick,
        level_duration_s=level_duration,
        min_rate=min_rate,
        max_rate=max_rate,
        tolerance=_percent(tolerance),
        budget_s=budget_s,
        chain=chain,
    )
    check_options(options)  # before the database is opened: a refusal leaves nothing behind
    store = open_store(ctx, url=store_url(ctx, experiment))  # the project's, from elsewhere
    live = sys.stderr.isatty() and not as_json
    shown: PlainProgress | LiveProgress = LiveProgress() if live else PlainProgress()
    progress = GuardedProgress(shown)

    def show(outcome: SweepOutcome) -> None:
        view = load_sweep(store, outcome.sweep_id)
        text = render_sweep_markdown(view) if fmt == "markdown" else render_sweep(view)
        if as_json:
            progress.note(text)
            echo_or_reader_gone(json.dumps(sweep_json(view), allow_nan=False))
        else:
            echo_or_reader_gone(text)

    try:
        outcomes = run_sweep(Path(experiment), store, options, progress, on_sweep=show)
    finally:
        shown.close()
    if any(o.status == "KILLED" for o in outcomes):
        ctx.exit(130)
    if any(o.status == "FAILED" for o in outcomes):
        ctx.exit(1)


@click.command()
@click.argument("experiment", required=False)
@click.option("--show", "show_id", type=int, metavar="ID", help="One sweep: its levels, as swept.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per sweep (sweep-json.md).")
@click.pass_context
def sweeps(ctx: click.Context, experiment: str | None, show_id: int | None, as_json: bool) -> None:
    """List sweeps (oldest first): SLO, status, capacity with its interval, what limited it;
    --show ID prints one sweep's levels."""
    from optlab.reports.sweep import load_sweep, render_sweep, render_sweep_list, sweep_json

    store = open_store(ctx, read_only=True)
    ids = [show_id] if show_id is not None else [s.id for s in store.list_sweeps(experiment)]
    if as_json:
        for sweep_id in ids:
            echo_or_reader_gone(json.dumps(sweep_json(load_sweep(store, sweep_id))))
        return
    if show_id is not None:
        echo_or_reader_gone(render_sweep(load_sweep(store, show_id)))
        return
    found = store.list_sweeps(experiment)
    if not found:
        click.echo("no sweeps yet" + (f" for {experiment}" if experiment else ""))
        return
    echo_or_reader_gone(render_sweep_list(found))
