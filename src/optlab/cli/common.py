"""What several command modules share: opening the store named by --db."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from optlab.store import Store


def db_url(ctx: click.Context) -> str | None:
    root = ctx.find_root()
    return root.obj.get("db_url") if root.obj else None


def open_store(ctx: click.Context) -> Store:
    from optlab.store import Store

    return Store.open(db_url(ctx))


EXPERIMENT_PATH = click.Path(path_type=str)
