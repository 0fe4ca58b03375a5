"""`optlab diagnose`: name a run's bottleneck from its evidence and write the next step."""

from __future__ import annotations

from pathlib import Path

import click

from optlab.cli.common import open_store, store_url
from optlab.cli.runs import echo_or_reader_gone


@click.command()
@click.argument("subject", required=False, metavar="[RUN_ID | EXPERIMENT | sweep:ID]")
@click.option("--json", "as_json", is_flag=True, help="The last stdout line is the JSON.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "markdown"]),
    default="text",
    show_default=True,
    help="markdown: for a pull request.",
)
@click.option(
    "--write-step",
    is_flag=True,
    help="Write the next one-variable step file (parent = the run's experiment).",
)
@click.option(
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="PATH",
    help="Where --write-step writes (default: beside the experiment's file).",
)
@click.pass_context
def diagnose(
    ctx: click.Context,
    subject: str | None,
    as_json: bool,
    fmt: str,
    write_step: bool,
    output: Path | None,
) -> None:
    """Name the bottleneck of a run from its evidence (stages, CPU, GIL, GPU, memory slope,
    I/O wait, queue, batching, send lag, neighbours), ranked by confidence, each finding with
    its numbers against the rule's thresholds, and the next one-variable step
    (docs/diagnose.md; --json: docs/diagnose-json.md).

    SUBJECT: a run id, an experiment name or file (its newest run), or sweep:ID (the level at
    the sweep's knee); the newest run when omitted. Exit codes: 0 diagnosed (healthy or not);
    2 bad input, no such run, no runs yet, or --write-step refused (nothing overwritten).
    """
    from optlab.diagnose import diagnose_run
    from optlab.diagnose.subject import measure_command, resolve, write_next_step
    from optlab.reports.diagnose import (
        diagnosis_json_line,
        render_diagnosis,
        render_diagnosis_markdown,
    )

    # An experiment file's project database when run from elsewhere (common.store_url).
    store = open_store(ctx, read_only=not write_step, url=store_url(ctx, subject))
    chosen = resolve(store, subject)
    diagnosis = diagnose_run(store, chosen.run_id, source=chosen.source)
    knobs = diagnosis.knobs
    command = "optlab diagnose" + (f" {subject}" if subject else f" {chosen.run_id}")
    if fmt == "markdown":
        text = render_diagnosis_markdown(diagnosis, knobs)
    else:
        text = render_diagnosis(diagnosis, knobs, command=None if write_step else command)
    if as_json:
        click.echo(text, err=True)
    else:
        echo_or_reader_gone(text)
    if write_step:
        path = write_next_step(store, diagnosis, command, output)
        disturbed = [f for f in diagnosis.findings if f.rule.invalidates]
        if disturbed:
            titles = "; ".join(f.rule.title for f in disturbed)
            click.echo(
                f"warning: the run was also disturbed ({titles}): measure the step and its "
                "parent again on a quiet machine before trusting the comparison",
                err=True,
            )
        click.echo(
            f"wrote {path}: check it with `optlab diff {path}`, measure it with "
            f"`{measure_command(store, diagnosis.run_id, path)}`",
            err=as_json,
        )
    if as_json:
        echo_or_reader_gone(diagnosis_json_line(diagnosis))
