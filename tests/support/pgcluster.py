"""A private PostgreSQL cluster that a test may stop and start: a database restart, for real.

The suite's shared server (OPTLAB_TEST_POSTGRES_URL) must stay up for the other tests, so the
outage tests run their own cluster (initdb takes ~2 s). Skipped where the server binaries are
missing; as root the server runs as the `postgres` user, as scripts/postgres.sh does.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.capabilities import lacks, module


def _bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    return Path(found[-1]) if found else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Cluster:
    def __init__(self, bindir: Path, folder: Path, port: int) -> None:
        self.bindir, self.folder, self.port = bindir, folder, port
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        self._as = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []

    def _ctl(self, *args: str) -> None:
        subprocess.run(
            [*self._as, str(self.bindir / "pg_ctl"), "-D", str(self.folder / "data"), *args],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd="/",  # the postgres user may not enter the test's folder
        )

    def init(self) -> None:
        subprocess.run(
            [*self._as, str(self.bindir / "initdb"), "-A", "trust", "-U", "postgres"]
            + ["-D", str(self.folder / "data")],
            check=True,
            stdout=subprocess.DEVNULL,
            cwd="/",
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200"
        )
        self._ctl("-w", "-l", str(self.folder / "log"), "-o", options, "start")

    def stop(self) -> None:
        self._ctl("-m", "fast", "-w", "stop")


@contextmanager
def private_cluster() -> Iterator[Cluster]:
    bindir = _bindir()
    if bindir is None or not (bindir / "initdb").exists():
        lacks("PostgreSQL server binaries are not installed (apt-get install postgresql)")
    if os.getuid() == 0 and shutil.which("runuser") is None:
        lacks("running as root without runuser: cannot start PostgreSQL as postgres")
    module("psycopg")  # the driver: pip install 'optlab[postgres]'
    folder = Path(tempfile.mkdtemp(prefix="optlab-pgtest-"))
    if os.getuid() == 0:
        shutil.chown(folder, "postgres")
    cluster = Cluster(bindir, folder, _free_port())
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # stopped by the test
            cluster.stop()
        time.sleep(0.1)
        shutil.rmtree(folder, ignore_errors=True)
