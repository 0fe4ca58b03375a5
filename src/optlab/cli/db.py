"""`optlab db`: schema upgrades and status."""

from __future__ import annotations

import click

from optlab.cli.common import db_url


@click.group()
def db() -> None:
    """Database schema: upgrade it, or show its revision."""


@db.command()
@click.pass_context
def upgrade(ctx: click.Context) -> None:
    """Upgrade the database to this optlab's schema (creating it if new); rows are kept."""
    from optlab.store import upgrade as upgrade_db

    before, after = upgrade_db(db_url(ctx))
    if before == after:
        click.echo(f"database already at {after}")
    else:
        click.echo(f"upgraded database from {before or 'empty'} to {after}")


@db.command()
@click.pass_context
def current(ctx: click.Context) -> None:
    """Show the database's schema revision and whether it is up to date."""
    from optlab.store import current as current_db

    status = current_db(db_url(ctx))
    state = "up to date" if status.up_to_date else "needs `optlab db upgrade`"
    click.echo(
        f"{status.url}\nrevision: {status.revision or 'none'}\nhead: {status.head} ({state})"
    )
