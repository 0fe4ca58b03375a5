"""The ray lane: load from several hosts (docs/hosts.md) on a Ray cluster of several nodes
on this machine. Each module skips, with the reason, where Ray is not installed
(`tests.support.capabilities.module`)."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from tests.support.proc import free_port, service
from tests.support.raycluster import OFFSETS_S, LocalCluster, time_namespaces


@pytest.fixture(scope="session")
def timens_missing() -> str | None:
    return time_namespaces()


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, timens_missing: str | None
) -> Iterator[LocalCluster]:
    """Three one-CPU nodes: the head on this clock, the others' monotonic clocks shifted by
    OFFSETS_S where time namespaces work (else on this clock too). Node i of `nodes.nodes`
    has the custom resource `optlab-test-<i>`, to find its Ray node ID by."""
    nodes = LocalCluster(tmp_path_factory.mktemp("ray"))
    try:
        nodes.head()
        for i, offset in enumerate(OFFSETS_S, start=1):
            nodes.add(
                offset_s=0.0 if timens_missing else offset,
                resources=f'{{"optlab-test-{i}": 1}}',
            )
        nodes.warm()
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
