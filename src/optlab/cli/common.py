"""What several command modules share: opening the store named by --db (or the database an
experiment's project already holds), and a stdout whose reader has gone."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from optlab.errors import NotFoundError, OptlabError, RefusedError

if TYPE_CHECKING:
    from optlab.store import Store

# The default database, relative to the folder a command runs in.
DEFAULT_DB = Path(".optlab") / "optlab.db"


def db_url(ctx: click.Context) -> str | None:
    root = ctx.find_root()
    return root.obj.get("db_url") if root.obj else None


def project_database(experiment: str | Path | None) -> Path | None:
    """The nearest `.optlab/optlab.db` in the folder of the experiment file, or above it."""
    if experiment is None:
        return None
    path = Path(experiment)
    try:
        if not path.is_file():
            return None
        folder = path.resolve().parent
    except OSError:
        return None
    for candidate in (folder, *folder.parents):
        try:
            if (candidate / DEFAULT_DB).is_file():
                return candidate / DEFAULT_DB
        except OSError:
            return None
    return None


def store_url(ctx: click.Context, experiment: str | Path | None = None) -> str:
    """--db (or OPTLAB_DB); else `.optlab/optlab.db` here when it exists; else the one nearest
    the experiment's file (its project's, with a note saying so); else a new one here.

    A step run from another folder must build on its parent's runs, which are in the
    project's database: a new empty one here would only say the parent has no run."""
    explicit = db_url(ctx)
    if explicit:
        return explicit
    here = Path.cwd() / DEFAULT_DB
    found = project_database(experiment)
    if here.is_file() or found is None:
        if found is not None and found.resolve() != here.resolve():
            click.echo(
                f"optlab: note: using the database here, sqlite:///{here}; {experiment}'s "
                f"folder has another, sqlite:///{found} (--db chooses)",
                err=True,
            )
        return f"sqlite:///{here}"
    click.echo(
        f"optlab: using the database sqlite:///{found}, the nearest to {experiment} (there is "
        "none in the current folder; --db chooses another)",
        err=True,
    )
    return f"sqlite:///{found}"


@contextmanager
def experiment_store(ctx: click.Context, experiment: str | Path) -> Iterator[Store]:
    """The store for a command on an experiment file (`store_url`), closed afterwards. When
    the command is refused, a default SQLite file it created and left without a run is
    removed: a refusal leaves no empty database where the user did not ask for one."""
    from sqlalchemy.engine import make_url

    from optlab.store.faults import sqlite_path

    url = store_url(ctx, experiment)
    try:
        file = sqlite_path(make_url(url))
    except Exception:  # noqa: BLE001 - an unusable URL is Store.open's to report
        file = None
    # Only the default database is the command's own choice; one named by --db or OPTLAB_DB
    # is where the user asked for it, and stays.
    created = _first_missing(file) if file is not None and db_url(ctx) is None else None
    store = open_store(ctx, url=url)
    try:
        yield store
    except OptlabError as exc:
        if created is not None and file is not None and not store.list_runs():
            store.close()
            _remove_created(file, created)
            if isinstance(exc, (NotFoundError, RefusedError)) and "parent" in exc.message:
                # The parent's runs are in a database this command did not find.
                exc.hint = (f"{exc.hint}; " if exc.hint else "") + (
                    f"no database was found here or in a folder above {experiment} (none "
                    "was left behind): `--db URL` names the one that holds its parent's runs"
                )
        raise
    finally:
        store.close()


def _first_missing(file: Path) -> Path | None:
    """The outermost of `file` and its folders that does not exist yet (None: it exists)."""
    path = file.absolute()
    if path.exists():
        return None
    while not path.parent.exists() and path.parent != path:
        path = path.parent
    return path


def _remove_created(file: Path, created: Path) -> None:
    for leftover in (file, *(file.with_name(file.name + s) for s in ("-wal", "-shm", "-journal"))):
        leftover.unlink(missing_ok=True)
    folder = file.absolute().parent
    while created != file.absolute() and folder.is_relative_to(created):
        try:
            folder.rmdir()  # only when empty: nothing else is ever removed
        except OSError:
            return
        if folder == created:
            return
        folder = folder.parent


def open_store(ctx: click.Context, *, read_only: bool = False, url: str | None = None) -> Store:
    """The store named by --db (or `url`). `read_only`: for commands that only read; they
    then work on read-only media and on a database they may not write, and never create one.
    Any command first stores the runs a refused final write left pending for this database."""
    from optlab.store import Store
    from optlab.store.database import default_url, masked
    from optlab.store.pending import pending_files

    url = url or db_url(ctx) or default_url()
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

    from optlab.run.imported import check_imported
    from optlab.store.pending import import_pending

    for result in import_pending(store, paths, check_imported):
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
