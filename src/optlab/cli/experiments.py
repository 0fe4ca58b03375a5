"""`optlab diff` and `optlab split`: the one-variable rule from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import click

from optlab.chain.plan import render_value
from optlab.cli.common import EXPERIMENT_PATH, experiment_store
from optlab.config.diff import describe_path


@click.command()
@click.argument("experiment", type=EXPERIMENT_PATH)
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.pass_context
def diff(ctx: click.Context, experiment: str, as_json: bool) -> None:
    """Show the ONE variable EXPERIMENT changes against its parent, or refuse it.

    Resolves the file against its parents' stored configs and stores any config
    seen for the first time (exit 0), or explains a refusal (exit 2).
    """
    from optlab.chain.lineage import prepare

    with experiment_store(ctx, experiment) as store:
        prepared = prepare(Path(experiment), store)
    plan = prepared.plan
    variable = plan.variable
    if as_json:
        payload = {
            "experiment": plan.experiment,
            "parent": plan.parent,
            "config_hash": plan.config_hash,
            "repeat": plan.repeat,
            "variable": None
            if variable is None
            else {
                "name": variable.name,
                "old": variable.old,
                "new": variable.new,
                "fields": [
                    {"path": f.path, "keys": list(f.keys), "old": f.old, "new": f.new}
                    for f in variable.fields
                ],
            },
            "chain": [{"experiment": link.name, "action": link.action} for link in prepared.chain],
        }
        click.echo(json.dumps(payload, default=str))
        return
    chain = " -> ".join(link.name for link in prepared.chain)
    click.echo(f"chain: {chain}")
    if plan.parent is None:
        click.echo(f"{plan.experiment}: baseline (full config, no parent)")
    elif variable is None:
        click.echo(f"{plan.experiment}: repeat of {plan.parent} (no variable changed)")
    else:
        click.echo(f"{plan.experiment}: changes 1 variable against {plan.parent}")
        click.echo(f"  {variable.describe()}")
        if len(variable.fields) > 1 or variable.fields[0].keys != (variable.name,):
            for field in variable.fields:
                old, new = render_value(field.old), render_value(field.new)
                click.echo(f"    {describe_path(('knobs', *field.keys))}: {old} -> {new}")
    for link in prepared.chain:
        if link.action not in ("unchanged", "from database"):
            click.echo(f"config of {link.name}: {link.action}", err=True)


@click.command()
@click.argument("experiment", type=EXPERIMENT_PATH)
@click.option("--dry-run", is_flag=True, help="Print the files without writing them.")
@click.pass_context
def split(ctx: click.Context, experiment: str, dry_run: bool) -> None:
    """Rewrite a step that changes several variables as a chain of one-variable steps.

    Writes one file per variable, in the order the change lists them. The last keeps
    the original name (children still resolve); the original text is kept as FILE.orig.
    """
    from optlab.chain.split import split_experiment

    with experiment_store(ctx, experiment) as store:
        result = split_experiment(Path(experiment), store, write=not dry_run)
    for path, text in result.files:
        if dry_run:
            click.echo(f"--- {path}\n{text}")
        else:
            click.echo(f"wrote {path}")
    if result.written:
        click.echo(f"kept the original as {result.backup}")
        click.echo(f"next: optlab diff {result.files[0][0]}")
