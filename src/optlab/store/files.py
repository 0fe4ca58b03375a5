"""The files a user names to optlab for data (a bundle to import, a bundle or report to write):
only regular files are read, never more than a limit, and a write replaces a regular file or
creates one, never a device, a FIFO, a folder or what a symlink points at.

Opening a FIFO blocks until someone writes to it, and reading /dev/zero never ends; so a file
is checked with stat before it is opened, opened without blocking, and checked again on the
open descriptor (it may have been swapped meanwhile). A write goes to a temporary file in the
same folder, then `os.replace`: a crash leaves the old file or the new one, never half.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from contextlib import AbstractContextManager
from pathlib import Path
from typing import BinaryIO

from optlab.config import regular
from optlab.config.regular import file_kind
from optlab.errors import NotFoundError, OptlabError, StoreError


def _unreadable(path: Path, exc: OSError) -> OptlabError:
    if exc.errno == errno.ELOOP:
        return StoreError(
            f"{path}: symlink loop (the link points, through other links, back to itself)",
            hint="give the path of the file itself",
        )
    if isinstance(exc, FileNotFoundError):
        if path.is_symlink():
            return NotFoundError(
                f"{path}: a symlink to {os.readlink(path)}, which does not exist",
                hint="give the path of the file itself",
            )
        return NotFoundError(f"cannot read {path}: no such file", hint="check the path")
    return StoreError(f"cannot read {path}: {exc.strerror or exc}", hint="check the path")


def _check_regular(path: Path, info: os.stat_result, what: str) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise StoreError(
            f"{path}: is {file_kind(info)}, not {what}; optlab reads only regular files",
            hint=f"give the path of {what} (a regular file)",
        )


def open_regular(path: Path, what: str) -> AbstractContextManager[BinaryIO]:
    """`path` opened for reading in binary, refused (StoreError, NotFoundError) unless it is a
    regular file, a symlink to one included. `what` names the file in messages ("a run
    bundle"). The caller bounds how much it reads."""
    return regular.open_regular(path, lambda p, info: _check_regular(p, info, what), _unreadable)


def lstat_kind(path: Path) -> str | None:
    """None when `path` is a regular file (not a symlink) or does not exist; else what it is."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    return None if stat.S_ISREG(info.st_mode) else file_kind(info)


def _write_error(path: Path, exc: OSError) -> StoreError:
    folder = path.parent
    why = exc.strerror or str(exc)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return StoreError(
            f"cannot write {path}: {why}: the folder {folder} (or the file) may not be "
            "written by this user, or is immutable",
            hint="choose another path in a folder you may write, or fix its permissions "
            "(chmod u+w; chattr -i for an immutable one)",
        )
    if exc.errno == errno.EROFS:
        return StoreError(
            f"cannot write {path}: {folder} is on a read-only file system",
            hint="choose a path on a writable disk",
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreError(
            f"cannot write {path}: {why} (nothing was written)",
            hint="free disk space, or choose a path on another disk",
        )
    if exc.errno in (errno.ENOTDIR, errno.ENOENT):
        what_is = (
            "does not exist"
            if exc.errno == errno.ENOENT
            else "(or a folder above it) is a file, not a folder"
        )
        return StoreError(
            f"cannot write {path}: {folder} {what_is}",
            hint="create the folder first, or choose another path",
        )
    return StoreError(f"cannot write {path}: {why}", hint="choose another path")


def refuse_unsafe_target(path: Path, what: str) -> None:
    """Refuse to write `what` onto `path` when it exists and is not a regular file: a device,
    a FIFO or a folder would be replaced by a regular file, and a symlink is not followed
    (the file it points at may be anybody's)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _write_error(path, exc) from exc
    if stat.S_ISLNK(info.st_mode):
        raise StoreError(
            f"{path} is a symlink (to {os.readlink(path)}); optlab does not write {what} "
            "through a symlink, nor replace it",
            hint="give the path the file should have (the link's target, if that is what you "
            "mean), or remove the link first",
        )
    if not stat.S_ISREG(info.st_mode):
        raise StoreError(
            f"{path} is {file_kind(info)}, not a regular file; optlab writes {what} only to a "
            "new or a regular file, never in place of anything else",
            hint="choose another path (a file name in an existing folder)",
        )


def write_atomic(path: str | Path, text: str, what: str) -> Path:
    """Write `text` to `path` as `what` (a new or a replaced regular file, never half of one);
    refuses a path that is a symlink or not a regular file, and says why a write failed
    (StoreError, nothing left behind)."""
    path = Path(path)
    refuse_unsafe_target(path, what)
    folder = path.parent
    if not folder.is_dir():
        what_is = "is not a folder" if folder.exists() else "does not exist"
        raise StoreError(
            f"cannot write {path}: {folder} {what_is}",
            hint="create the folder first, or choose another path",
        )
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise _write_error(path, exc) from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileNotFoundError):
            # A replaced file keeps its permissions (a report shared with the group stays so).
            os.chmod(tmp, stat.S_IMODE(os.stat(path).st_mode))
        refuse_unsafe_target(path, what)  # swapped for something else while we wrote
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _write_error(path, exc) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)
    return path


def _sync_folder(folder: Path) -> None:
    # The rename itself is durable only once the folder is synced; where a folder cannot be
    # opened for that (some network file systems), the file is written all the same.
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)
