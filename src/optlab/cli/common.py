"""What several command modules share: opening the store named by --db."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from optlab.errors import OptlabError

if TYPE_CHECKING:
    from optlab.store import Store


def db_url(ctx: click.Context) -> str | None:
    root = ctx.find_root()
    return root.obj.get("db_url") if root.obj else None


def open_store(ctx: click.Context, *, read_only: bool = False) -> Store:
    """The store named by --db. `read_only`: for commands that only read; they then work on
    read-only media and on a database they may not write, and never create one. A command
    that writes first stores the runs a failed final write left under .optlab/pending/ for
    this database."""
    from optlab.store import Store
    from optlab.store.bundle import PENDING_DIR

    if read_only and (Path.cwd() / PENDING_DIR).is_dir() and any(
        (Path.cwd() / PENDING_DIR).glob("*.jsonl")
    ):
        # A run the database refused is stored by the next command that opens it, a reading
        # one too: `optlab log` after an outage must show the run, not miss it. Where the
        # database cannot be written (read-only media), the command still reads.
        try:
            with Store.open(db_url(ctx)) as writable:
                _store_pending(writable)
        except OptlabError as exc:
            click.echo(
                f"optlab: runs waiting in {PENDING_DIR}/ could not be stored now: {exc.message}",
                err=True,
            )
    store = Store.open(db_url(ctx), read_only=read_only)
    if not read_only:
        _store_pending(store)
    return store


def _store_pending(store: Store) -> None:
    import os

    from optlab.store.bundle import import_pending

    for result in import_pending(store):
        shown = os.path.relpath(result.path) if result.path else None
        if result.action == "failed":
            click.echo(f"optlab: pending run bundle {shown} not stored: {result.error}", err=True)
        elif result.action == "skipped":
            click.echo(f"pending run {result.run_id} from {shown} was already stored", err=True)
        else:
            click.echo(f"stored pending run {result.run_id} from {shown}", err=True)


EXPERIMENT_PATH = click.Path(path_type=str)
