"""The one way a test starts a process: `optlab` (as a user would, in its own interpreter), a
`python -c` snippet, or a service on a free port that is killed with its whole process group.

Every child gets `PYTHONPATH` pointing at this checkout's `src/`, so it runs the code under test
whatever is installed; a database given as `db=` reaches it as `OPTLAB_DB` (a `Path` is a SQLite
file, a `str` a SQLAlchemy URL), which every sub-command and every process the run starts reads.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO

SRC = Path(__file__).resolve().parents[2] / "src"  # this checkout's code
Db = str | Path
Stream = int | IO[str] | None


def db_url(db: Db) -> str:
    """A SQLAlchemy URL: a `Path` is a SQLite file, a `str` is already a URL."""
    return f"sqlite:///{db}" if isinstance(db, Path) else db


def optlab_env(db: Db | None = None, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, with the checkout's `src/` importable, `OPTLAB_DB` when a
    database is given, and `env` on top (it wins)."""
    merged = {**os.environ, "PYTHONPATH": str(SRC)}
    if db is not None:
        merged["OPTLAB_DB"] = db_url(db)
    merged.update(env or {})
    return merged


def optlab_argv(*args: str, python: str | Path = sys.executable) -> list[str]:
    """The command line of `optlab ARGS` run as a module by `python`."""
    return [str(python), "-m", "optlab", *args]


def start_optlab(
    *args: str,
    db: Db | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
    stdout: Stream = subprocess.PIPE,
    stderr: Stream = subprocess.PIPE,
    python: str | Path = sys.executable,
) -> subprocess.Popen[str]:
    """`optlab ARGS` started in the background, text mode. `new_session=True` gives it its own
    process group (a test then signals the group, as a terminal does its foreground job)."""
    return _start(
        optlab_argv(*args, python=python),
        optlab_env(db, env),
        cwd,
        stdout=stdout,
        stderr=stderr,
        new_session=new_session,
    )


def run_optlab(
    *args: str,
    db: Db | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 60,
    input: str | None = None,
    python: str | Path = sys.executable,
) -> subprocess.CompletedProcess[str]:
    """`optlab ARGS` run to its end, output captured; the timeout only bounds a hang. The exit
    status is the test's to check."""
    return _run(optlab_argv(*args, python=python), optlab_env(db, env), cwd, timeout, input)


def run_python(
    code: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60,
    args: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """`python -c CODE` in a fresh interpreter (what a module imports, a clean process's view),
    output captured; the exit status is the test's to check."""
    return _run([sys.executable, "-c", code, *args], optlab_env(None, env), cwd, timeout)


def start_python(
    code: str,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdout: Stream = subprocess.DEVNULL,
    stderr: Stream = subprocess.DEVNULL,
    stdin: Stream = None,
) -> subprocess.Popen[str]:
    """`python -c CODE` started in the background (a neighbour burning CPU, a helper process);
    the test ends it."""
    return _start([sys.executable, "-c", code], optlab_env(None, env), cwd, stdin, stdout, stderr)


def _start(
    argv: list[str],
    env: dict[str, str],
    cwd: Path | None,
    stdin: Stream = None,
    stdout: Stream = subprocess.PIPE,
    stderr: Stream = subprocess.PIPE,
    new_session: bool = False,
) -> subprocess.Popen[str]:
    """The one background start, text mode (`start_optlab`, `start_python`)."""
    return subprocess.Popen(
        argv,
        env=env,
        cwd=cwd,
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        text=True,
        start_new_session=new_session,
    )


def _run(
    argv: list[str],
    env: dict[str, str],
    cwd: Path | None,
    timeout: float,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """The one run to the end, output captured, exit status left to the test (`run_optlab`,
    `run_python`); the timeout only bounds a hang."""
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (a test's server binds it next)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_listening(port: int, timeout_s: float = 60, host: str = "127.0.0.1") -> None:
    """Return once something accepts connections on `port`; the deadline only bounds a hang."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=0.5).close()
            return
        except OSError as refused:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"nothing listens on {host}:{port} after {timeout_s:g} s"
                ) from refused
            time.sleep(0.05)


def kill_group(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> None:
    """SIGKILL a process started with its own session, and everything it started."""
    with suppress(ProcessLookupError):  # already gone, group and all
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


@contextmanager
def service(
    argv: Sequence[str | Path],
    port: int,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    stdout: Stream = subprocess.DEVNULL,
    stderr: Stream = None,
) -> Iterator[subprocess.Popen[str]]:
    """A server started from `argv` in its own process group, yielded once it listens on
    `port`, and killed with its whole group on the way out (a graceful stop would wait for
    requests still asleep in it)."""
    proc = subprocess.Popen(
        [str(part) for part in argv],
        env=optlab_env(None, env),
        cwd=cwd,
        stdout=stdout,
        stderr=stderr,
        text=True,
        start_new_session=True,
    )
    try:
        wait_listening(port)
        yield proc
    finally:
        kill_group(proc)
