"""benchmarks/ray_hosts.py still runs (its --smoke mode, as a subprocess) and prints its
figure and verdict lines; the figures are the benchmark's to judge, never this test's."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.support.capabilities import module
from tests.support.paths import REPO

module("ray")  # the lane needs Ray: skipped, with the reason, where it is not installed

VERDICT = r"(PASS|MISS)$"
EXPECTED = [
    r"^300/s constant, round 1: merged [\d,]+ = sum of nodes [\d,]+: count for count YES",
    r"^  node-a: offset [-+][\d.]+ ms \+-[\d.]+ \(rtt [\d.]+; drift over the run [-+][\d.]+ "
    r"\+-[\d.]+\), first-send lag [\d.]+ ms",
    r"^2,000/s Poisson: merged = sum of the nodes' histograms.*" + VERDICT,
    r"^2,000/s Poisson: per-node send-lag P99 <= 2 ms in \d/3 node-runs .*" + VERDICT,
    r"^2,000/s Poisson: merged P99 median [\d.]+ ms against one host's [\d.]+ ms .*" + VERDICT,
    r"^overhead, both at once, Ray / local \(median of 1 rounds\): send-lag P99 [\d.]+ .*CPU "
    r"per request [\d.]+ .*" + VERDICT,
]


def test_ray_hosts_benchmark_smoke() -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "ray_hosts.py"), "--smoke"],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for pattern in EXPECTED:
        assert any(re.search(pattern, line) for line in lines), (
            f"no line matches {pattern!r}\n{done.stdout}"
        )
