"""`optlab export -o` and `optlab report --html` write only where the user asked, only a new or a
regular file, all or nothing: the real commands against a real database, onto real device nodes,
symlinks, FIFOs, a read-only file system, a full one and an immutable folder. Each refusal exits
2 with the path and the fix, and leaves every file as it was."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from optlab.cli.main import cli
from tests.support.capabilities import lacks, not_root
from tests.support.proc import run_optlab


@pytest.fixture
def url(synthetic_chain: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A copy of the measured synthetic chain; the working directory is its folder."""
    shutil.copy(synthetic_chain[1], tmp_path / "measured.db")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("OPTLAB_DB", raising=False)
    return f"sqlite:///{tmp_path / 'measured.db'}"


def optlab(url: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--db", url, *args], catch_exceptions=False)


def refused(result: Result, *expected: str) -> None:
    assert result.exit_code == 2, result.output
    for text in expected:
        assert text in result.stderr, result.stderr
    assert "unexpected error" not in result.stderr and "hint:" in result.stderr


def listing(folder: Path) -> dict[str, bytes | str]:
    """What a folder holds: each file's bytes, each link's target."""
    found: dict[str, bytes | str] = {}
    for path in sorted(folder.iterdir()):
        if path.is_symlink():
            found[path.name] = os.readlink(path)
        elif path.is_file():
            found[path.name] = path.read_bytes()
    return found


@contextmanager
def tmpfs(folder: Path, options: str) -> Iterator[Path]:
    """A real file system of its own at `folder` (root only: mounting needs it)."""
    if os.geteuid() != 0:
        lacks("mounting a tmpfs needs root")
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "optlab-test", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        lacks(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_a_device_node_or_a_symlink_is_never_replaced(url: str, tmp_path: Path) -> None:
    keep = tmp_path / "someone-elses.txt"
    keep.write_text("keep me\n")
    (tmp_path / "link.jsonl").symlink_to(keep)
    (tmp_path / "null.jsonl").symlink_to("/dev/null")
    before = listing(tmp_path)

    refused(optlab(url, "export", "--all", "-o", "/dev/null"), "/dev/null is a character device")
    refused(
        optlab(url, "export", "--all", "-o", "link.jsonl"),
        f"link.jsonl is a symlink (to {keep})",
        "does not write a run bundle through a symlink",
        "remove the link",
    )
    refused(optlab(url, "export", "--all", "-o", "null.jsonl"), "null.jsonl is a symlink")
    refused(optlab(url, "report", "--html", "/dev/null"), "/dev/null is a character device")
    refused(optlab(url, "report", "--html", "link.jsonl"), "does not write a report through")

    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
    assert listing(tmp_path) == before  # the links, their targets and the folder as they were
    for args in (("export", "--all", "-o"), ("report", "--html")):  # click's own check
        folder = optlab(url, *args, str(tmp_path))
        assert folder.exit_code == 2 and "is a directory" in folder.stderr


def test_a_fifo_is_refused_without_opening_it(url: str, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.jsonl")
    # A subprocess, so that a regression blocks it (killed by the timeout), not the test run.
    done = run_optlab("export", "--all", "-o", "pipe.jsonl", db=url, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "pipe.jsonl is a FIFO (named pipe), not a regular file" in done.stderr
    assert stat.S_ISFIFO(os.lstat(tmp_path / "pipe.jsonl").st_mode)


def test_a_regular_file_is_replaced_whole_and_keeps_its_mode(url: str, tmp_path: Path) -> None:
    target = tmp_path / "runs.jsonl"
    target.write_text("old\n")
    target.chmod(0o640)
    result = optlab(url, "export", "--all", "-o", "runs.jsonl")
    assert result.exit_code == 0, result.output
    assert target.read_text().startswith('{"kind": "optlab-bundle"')
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_folder_that_is_missing_or_a_file(url: str, tmp_path: Path) -> None:
    refused(
        optlab(url, "export", "--all", "-o", "nowhere/runs.jsonl"),
        "nowhere does not exist",
        "create the folder first",
    )
    (tmp_path / "plain.txt").write_text("x")
    refused(
        optlab(url, "report", "--html", "plain.txt/report.html"),
        "plain.txt (or a folder above it) is a file, not a folder",
    )
    assert not (tmp_path / "nowhere").exists() and (tmp_path / "plain.txt").read_text() == "x"


def test_a_read_only_file_system(url: str, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "media", "size=1m") as media:
        (media / "old.jsonl").write_text("old\n")
        subprocess.run(["mount", "-o", "remount,ro", str(media)], check=True)
        for args in (("export", "--all", "-o"), ("report", "--html")):
            refused(
                optlab(url, *args, str(media / "old.jsonl")),
                f"cannot write {media / 'old.jsonl'}: {media} is on a read-only file system",
                "choose a path on a writable disk",
            )
        assert listing(media) == {"old.jsonl": b"old\n"}


def test_a_full_disk_loses_nothing(url: str, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "small", "size=64k") as small:
        (small / "runs.jsonl").write_text("the previous export\n")
        filler = small / "filler"
        filler.write_bytes(bytes(56 * 1024))  # all but a block: far less than a bundle
        result = optlab(url, "export", "--all", "-o", str(small / "runs.jsonl"))
        refused(
            result,
            f"cannot write {small / 'runs.jsonl'}: No space left on device",
            "free disk space",
        )
        # The previous file whole, and no temporary file left behind.
        assert (small / "runs.jsonl").read_text() == "the previous export\n"
        assert sorted(p.name for p in small.iterdir()) == ["filler", "runs.jsonl"]


def test_an_immutable_folder(url: str, tmp_path: Path) -> None:
    folder = tmp_path / "frozen"
    folder.mkdir()
    (folder / "runs.jsonl").write_text("old\n")
    frozen = subprocess.run(["chattr", "+i", str(folder)], capture_output=True, text=True)
    if frozen.returncode != 0:
        lacks(f"cannot make a folder immutable here: {frozen.stderr.strip()}")
    try:
        for args in (("export", "--all", "-o"), ("report", "--html")):
            refused(
                optlab(url, *args, str(folder / "runs.jsonl")),
                f"cannot write {folder / 'runs.jsonl'}: Operation not permitted",
                "chattr -i",
            )
        assert listing(folder) == {"runs.jsonl": b"old\n"}
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=False)


@not_root  # root writes into a 0o500 folder regardless
def test_a_folder_without_write_permission(url: str, tmp_path: Path) -> None:
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        refused(
            optlab(url, "export", "--all", "-o", str(folder / "runs.jsonl")),
            "Permission denied",
            "chmod u+w",
        )
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o700)


def test_a_fifo_among_pending_runs_blocks_no_command(url: str, tmp_path: Path) -> None:
    pending = tmp_path / ".optlab" / "pending"
    pending.mkdir(parents=True, mode=0o700)
    os.mkfifo(pending / "0123456789abcdef0123456789abcdef.jsonl")
    for args in (("log",), ("export", "--all", "-o", "runs.jsonl")):
        # Subprocesses, so that a regression blocks them (killed by the timeout), not the test.
        done = run_optlab(*args, db=url, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        said = "is a FIFO (named pipe), not a pending run bundle: passed over without opening"
        assert said in done.stderr and "remove it" in done.stderr
    assert (tmp_path / "runs.jsonl").read_text().startswith('{"kind": "optlab-bundle"')
    assert stat.S_ISFIFO(os.lstat(pending / "0123456789abcdef0123456789abcdef.jsonl").st_mode)
