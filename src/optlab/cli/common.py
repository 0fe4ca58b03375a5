"""What several command modules share: opening the store named by --db, and a stdout whose
reader has gone."""

from __future__ import annotations

import os
import sys
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
    read-only media and on a database they may not write, and never create one. Any command
    first stores the runs a refused final write left pending for this database."""
    from optlab.store import Store
    from optlab.store.database import default_url, masked
    from optlab.store.pending import pending_files

    url = db_url(ctx) or default_url()
    waiting = pending_files(masked(url))
    if read_only and waiting:
        # A run the database refused is stored by the next command that opens it, a reading
        # one too: `optlab log` after an outage must show the run, not miss it. Where the
        # database cannot be written (read-only media, still down), the command reads on.
        try:
            with Store.open(url) as writable:
                _store_pending(writable, waiting)
        except OptlabError as exc:
            click.echo(
                f"optlab: {len(waiting)} pending run(s) could not be stored now: {exc.message}",
                err=True,
            )
    store = Store.open(url, read_only=read_only)
    if not read_only and waiting:
        _store_pending(store, waiting)
    return store


def _store_pending(store: Store, paths: list[Path]) -> None:
    import os

    from optlab.store.pending import import_pending

    for result in import_pending(store, paths):
        shown = os.path.relpath(result.path) if result.path else None
        if result.action == "failed":
            click.echo(f"optlab: pending run bundle {shown} not stored: {result.error}", err=True)
        elif result.action == "skipped":
            click.echo(f"pending run {result.run_id} from {shown} was already stored", err=True)
        else:
            click.echo(f"stored pending run {result.run_id} from {shown}", err=True)


EXPERIMENT_PATH = click.Path(path_type=str)


def silence_stdout() -> None:
    """Point stdout at /dev/null: Python flushes it again at exit, and a closed pipe would
    print "Exception ignored ... BrokenPipeError" there."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        pass  # no usable stdout at all: nothing to silence
    finally:
        os.close(devnull)
