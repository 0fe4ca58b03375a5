"""Opening a file a user names (an experiment file, a bundle to import) without trusting it:
only a regular file is read, a symlink to one included.

Opening a FIFO blocks until someone writes to it, and reading /dev/zero never ends; so the
file is checked with stat before it is opened, opened without blocking, and checked again on
the open descriptor (it may have been swapped meanwhile). Each caller words its own refusals.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from optlab.errors import OptlabError

__all__ = ["file_kind", "open_regular"]

KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a folder",
    stat.S_IFLNK: "a symlink",
}


def file_kind(info: os.stat_result) -> str:
    """What a stat result is, in words ("a FIFO (named pipe)")."""
    return KINDS.get(stat.S_IFMT(info.st_mode), "not a regular file")


@contextmanager
def open_regular(
    path: Path,
    check: Callable[[Path, os.stat_result], None],
    unreadable: Callable[[Path, OSError], OptlabError],
) -> Iterator[BinaryIO]:
    """`path` opened for reading in binary. `check(path, info)` raises the caller's refusal
    for a file that is not one it reads (not regular, too large), on the stat before opening
    and on the descriptor after; `unreadable` words an OSError. The caller bounds its reads."""
    try:
        info = os.stat(path)  # follows symlinks: the target is what must be a regular file
    except OSError as exc:
        raise unreadable(path, exc) from exc
    check(path, info)
    # O_NONBLOCK: had the file been swapped for a FIFO since the stat, open must not block;
    # the fstat below then refuses it.
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise unreadable(path, exc) from exc
    with os.fdopen(fd, "rb") as handle:
        check(path, os.fstat(fd))
        yield handle
