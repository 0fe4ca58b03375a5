"""The ray lane: load from several hosts (docs/hosts.md) on a Ray cluster of several nodes
on this machine. Skipped, with the reason, where Ray is not installed."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip(
    "ray", reason="Ray is not installed: pip install 'optlab[ray]' runs the ray lane"
)

from tests.ray.cluster import TIMENS, LocalCluster  # noqa: E402
from tests.support.proc import free_port, service  # noqa: E402

# The clock offsets injected into the nodes (Linux time namespaces), where this machine can.
OFFSETS_S = (3.7, -12.1)


def time_namespaces() -> str | None:
    """None when time namespaces work here; else why not."""
    done = subprocess.run(
        [sys.executable, str(TIMENS), "0.5", "--", "true"], capture_output=True, text=True
    )
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


@pytest.fixture(scope="session")
def timens_missing() -> str | None:
    return time_namespaces()


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, timens_missing: str | None
) -> Iterator[LocalCluster]:
    """Three one-CPU nodes: the head on this clock, the others' monotonic clocks shifted by
    OFFSETS_S where time namespaces work (else on this clock too)."""
    nodes = LocalCluster(tmp_path_factory.mktemp("ray"))
    try:
        nodes.head()
        for offset in OFFSETS_S:
            nodes.add(offset_s=0.0 if timens_missing else offset)
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture(scope="module")
def mmc_port() -> Iterator[int]:
    """The synthetic M/M/4 target (exponential service, mean 5 ms) served over HTTP."""
    port = free_port()
    argv = [sys.executable, "-m", "optlab.reference.synthetic", "--port", str(port),
            "--servers", "4", "--distribution", "exponential", "--service-ms", "5"]  # fmt: skip
    with service(argv, port):
        yield port


def hosts_experiment(
    folder: Path,
    name: str,
    port: int,
    address: str,
    *,
    load: str = "mode: open, rate: 300, arrival: constant",
    nodes: int = 3,
    workers: int = 1,
) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n"
        f"target: {{kind: http, url: 'http://127.0.0.1:{port}/', method: POST, "
        "code_version: mmc-1}\n"
        "knobs: {}\n"
        "workload:\n"
        f"  load: {{{load}, hosts: {{ray: '{address}', nodes: {nodes}, "
        f"workers_per_node: {workers}}}}}\n"
        "  inputs: {template: {id: '{i}'}, count: 5}\n"
    )
    return path
