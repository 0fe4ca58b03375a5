"""`optlab demo`: the README's main command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from optlab.cli.runs import LiveProgress, PlainProgress, render_summary
from optlab.errors import RefusedError

if TYPE_CHECKING:
    from optlab.run.runner import RunOutcome


@click.command()
@click.option(
    "--chain",
    type=click.Choice(["auto", "cpu", "gpu", "llm"]),
    default="auto",
    show_default=True,
    help="Which reference chain: auto picks gpu where CUDA is available, cpu otherwise; "
    "llm is the reference LLM served over HTTP (TTFT, TPOT, tokens/s, goodput).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(".optlab/demo"),
    show_default=True,
    help="Folder for the demo's fresh database (a new file each time).",
)
@click.option("--verbose", is_flag=True, help="Print each run's full summary as it finishes.")
@click.option("--wide", is_flag=True, help="On a terminal, every column in the table.")
# Hidden: the project's end-to-end test runs the demo with a short warmup (tests/e2e/test_demo.py).
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), hidden=True)
@click.option("--warmup", type=click.FloatRange(min=0), hidden=True)
def demo(
    chain: str,
    out: Path,
    verbose: bool,
    wide: bool,
    duration: float | None,
    warmup: float | None,
) -> None:
    """Measure the reference chain under the quick protocol and print its stacked table.

    Every step changes one knob of the built-in image classifier; each run is PROVISIONAL
    (seconds, not the full protocol's 10 minutes). The database is new, so the demo never
    touches your results; --db is not used. A step whose run is INVALID is measured again,
    at most twice, and each retry is listed under the table; one still INVALID ends the
    chain there (the table of what was measured, then exit 2).
    """
    from optlab.demo import (
        DEMO_DURATION_S,
        DEMO_WARMUP_S,
        choose_chain,
        fresh_database,
        reasons,
        run_demo,
    )
    from optlab.reports.terminal import print_table

    chosen = choose_chain(chain)
    database = fresh_database(out)
    live = sys.stderr.isatty()
    progress: PlainProgress | LiveProgress = LiveProgress() if live else PlainProgress()
    progress.note(f"optlab demo: the {chosen} chain, quick protocol, into {database}")

    def show(outcome: RunOutcome) -> None:
        if verbose:
            progress.note(render_summary(outcome))
        else:
            s = outcome.summary
            verdict = "VALID" if s.valid else "INVALID"
            tokens = ""
            if s.llm is not None and s.llm.ttft_ms is not None:
                tokens = (
                    f", TTFT P99 {s.llm.ttft_ms.p99 or 0:.2f} ms, "
                    f"{s.llm.output_tokens_per_s or 0:.0f} tok/s"
                )
            progress.note(
                f"  {s.experiment}: {s.status} {verdict}, QPS {s.qps or 0:.1f}, "
                f"P99 {s.total.p99 or 0:.2f} ms{tokens}"
            )

    try:
        result = run_demo(
            chosen,
            database,
            progress,
            show,
            duration_s=DEMO_DURATION_S if duration is None else duration,
            warmup_s=DEMO_WARMUP_S if warmup is None else warmup,
        )
    finally:
        progress.close()
    complete = result.stopped is None
    print_table(
        result.table,
        title=f"stacked gains: {result.head} ({chosen} chain, quick protocol: PROVISIONAL)"
        + ("" if complete else ", INCOMPLETE"),
        wide=wide,
    )
    for outcome in result.retried:
        click.echo(
            f"measured again: {outcome.experiment}'s run {outcome.run_id} was INVALID "
            f"({reasons(outcome)})"
        )
    click.echo(
        f"measured {len(result.outcomes)} runs in {result.seconds:.0f} s; database: {database}\n"
        f"explore it: {result.log_command}"
    )
    if result.stopped is not None:
        last = result.stopped
        tries = 1 + sum(o.experiment == last.experiment for o in result.retried)
        state = f"INVALID after {tries} tries" if last.status == "FINISHED" else last.status
        raise RefusedError(
            f"{last.experiment}'s run {last.run_id} is {state} ({reasons(last)})"
            + ("" if last.experiment == result.chain_head else "; the chain stops there"),
            hint=f"see every run's reasons with `{result.log_command}`; on a busy machine, "
            "run `optlab demo` again when it is quieter",
        )
