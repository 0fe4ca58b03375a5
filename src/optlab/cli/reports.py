"""`optlab table`, `optlab report`, `optlab audit`, `optlab check`: reading what was measured."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from optlab.cli.common import open_store
from optlab.errors import ConfigError

if TYPE_CHECKING:
    from optlab.reports.stacked import StackedTable
    from optlab.store import Store

EXIT_GATE_FAILED = 3
FC = TypeVar("FC", bound=Callable[..., object])


def _table(store: Store, head: str | None, slo: str | None = None) -> StackedTable:
    from optlab.config.slo import parse_slo
    from optlab.reports.chain import default_head_note, resolve_head
    from optlab.reports.table import stacked_table

    name = resolve_head(store, head)
    if head is None:
        click.echo(f"optlab: {default_head_note(store, name)}", err=True)
    return stacked_table(store, name, parse_slo(slo) if slo else None)


def _slo_option() -> Callable[[FC], FC]:
    return click.option(
        "--slo",
        "slo",
        metavar="pNN=TIME",
        help="The SLO capacity is judged by (p99=60ms); default: that of the head's newest "
        "finished sweep. Each step's newest comparable sweep under it stands for the step.",
    )


@click.command()
@click.argument("head", required=False)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["rich", "markdown", "csv", "json", "html"]),
    default="rich",
    show_default=True,
)
@click.option(
    "--wide",
    is_flag=True,
    help="On a terminal, every column in the table, however wide (rich format).",
)
@_slo_option()
@click.pass_context
def table(ctx: click.Context, head: str | None, fmt: str, wide: bool, slo: str | None) -> None:
    """The stacked-gains table of HEAD's chain, one row per step.

    HEAD is an experiment's name or its file; it defaults to the newest chain head.

    On a terminal the rich table fits its width: step, change, QPS and P99 with their step
    change, and the verdict always, other columns while there is room, and what it leaves
    out in a detail block under it. Piped, or with --wide, every column at full width.

    Where the chain was swept (`optlab sweep`), capacity under the SLO is a column too, with
    its change per step and against the baseline, and why a step has none.
    """
    store = open_store(ctx, read_only=True)
    stacked = _table(store, head, slo)
    if fmt == "rich":
        from optlab.reports.terminal import print_table

        header = stacked.header
        print_table(
            stacked, title=f"stacked gains: {header.head} ({header.protocol_label})", wide=wide
        )
    elif fmt == "markdown":
        from optlab.reports.markdown import render_markdown

        click.echo(render_markdown(stacked), nl=False)
    elif fmt == "csv":
        from optlab.reports.export import render_csv

        click.echo(render_csv(stacked), nl=False)
    elif fmt == "json":
        from optlab.reports.export import render_json

        click.echo(render_json(stacked))
    else:
        from optlab.reports.html import collect_report, render_html

        click.echo(render_html(stacked, collect_report(store, stacked)), nl=False)


@click.command()
@click.argument("head", required=False)
@click.option(
    "--html",
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Where to write the self-contained HTML report.",
)
@_slo_option()
@click.pass_context
def report(ctx: click.Context, head: str | None, path: Path, slo: str | None) -> None:
    """Write a self-contained HTML report of HEAD's chain: the table, latency CDFs, stage
    waterfalls, time series and the environment; for a swept chain, capacity and latency
    against throughput.

    HEAD is an experiment's name or its file; it defaults to the newest chain head.
    """
    from optlab.reports.html import collect_report, render_html
    from optlab.store.files import refuse_unsafe_target, write_atomic

    # Refused before the work of a report: a symlink, a device, a FIFO or a folder there.
    refuse_unsafe_target(path, "a report")
    store = open_store(ctx, read_only=True)
    stacked = _table(store, head, slo)
    text = render_html(stacked, collect_report(store, stacked))
    write_atomic(path, text, "a report")  # never a half-written report under the real name
    click.echo(f"wrote {path} ({len(text.encode()) / 1024:.0f} KiB)")


@click.command()
@click.argument("head", required=False)
@click.option("--json", "as_json", is_flag=True, help="The audit as one JSON object.")
@_slo_option()
@click.pass_context
def audit(ctx: click.Context, head: str | None, as_json: bool, slo: str | None) -> None:
    """Which change paid off, by how much and with what confidence; hypotheses against
    outcomes; who measured each step, when, from which commit, on which environment; INVALID
    and PROVISIONAL runs; steps skipped for environment drift.

    HEAD is an experiment's name or its file; it defaults to the newest chain head.
    """
    from optlab.reports.audit import build_audit, render_audit

    store = open_store(ctx, read_only=True)
    result = build_audit(store, _table(store, head, slo))
    if as_json:
        click.echo(json.dumps(result.as_dict(), default=str))
    else:
        click.echo(render_audit(result), nl=False)


@click.command()
@click.argument("head", required=False)
@click.option(
    "--max-regression",
    "regressions",
    multiple=True,
    metavar="METRIC=PCT",
    help="Fail when METRIC got worse by more than PCT (e.g. p99=5%). Repeatable.",
)
@click.option(
    "--min-gain",
    "gains",
    multiple=True,
    metavar="METRIC=PCT",
    help="Fail unless METRIC improved by at least PCT (e.g. qps=10%; capacity=10%: the "
    "head's capacity under the SLO against the baseline's, always). Repeatable.",
)
@click.option(
    "--against",
    type=click.Choice(["parent", "baseline"]),
    default="parent",
    show_default=True,
    help="Judge the head against its parent step, or against the chain's baseline.",
)
@_slo_option()
@click.pass_context
def check(
    ctx: click.Context,
    head: str | None,
    regressions: tuple[str, ...],
    gains: tuple[str, ...],
    against: str,
    slo: str | None,
) -> None:
    """A CI gate: exit 3 when HEAD regressed beyond a threshold (or missed a required gain),
    0 when it passed; prints a markdown summary for the CI log or a PR comment.

    HEAD is an experiment's name or its file; it defaults to the newest chain head (as for
    `optlab table`), and the summary names the head it judged.
    """
    from optlab.reports.gate import evaluate, parse_threshold, render_gate

    thresholds = [parse_threshold(t, "max-regression") for t in regressions]
    thresholds += [parse_threshold(t, "min-gain") for t in gains]
    if not thresholds:
        raise ConfigError(
            "optlab check needs at least one threshold",
            hint="for example: optlab check [HEAD] --max-regression p99=5% --min-gain qps=10%",
        )
    store = open_store(ctx, read_only=True)
    stacked = _table(store, head, slo)
    result = evaluate(stacked, thresholds, against)
    click.echo(render_gate(result, stacked.header.protocol_label), nl=False)
    if not result.passed:
        ctx.exit(EXIT_GATE_FAILED)
