"""SQLite databases a test copies: a measured database is shared, a test edits its own copy."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path


def checkpoint(database: Path) -> None:
    """Everything in the write-ahead log into the main file, so a plain file copy has it."""
    with sqlite3.connect(database) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def copy_database(source: Path, folder: Path, name: str = "optlab.db") -> str:
    """A copy of the (checkpointed) SQLite database `source` in `folder`, as a URL."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    shutil.copy(source, target)
    return f"sqlite:///{target}"
