"""A Ray cluster of several nodes on this one machine, and experiment files whose load it
sends, for the ray lane (docs/hosts.md).

Each node is a `ray start --block` process in a session of its own (killing its process
group kills the node: its raylet and its workers), optionally:
- in a Linux time namespace whose CLOCK_MONOTONIC is shifted by a fractional offset (the
  offsets a real cluster's hosts have, injected: `timens.py`), and
- starved of CPU (`RayNode.starved`), or killed whole (`RayNode.kill`), mid-run;
- run by another Python environment (`python`), with extra environment variables (`env`):
  a node where optlab cannot be imported, or imports another version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
TIMENS = HERE / "timens.py"  # runs a command in a time namespace of its own
START_TIMEOUT_S = 90.0
# The head's health checks of its nodes (Ray's system config, from its environment): a node
# killed is counted dead in ~2 s rather than Ray's default ~30 s.
FAST_DEATH = {
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "500",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_initial_delay_ms": "500",
}
# The clock offsets injected into two of the lane's three nodes (Linux time namespaces).
OFFSETS_S = (3.7, -12.1)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RayNode:
    process: subprocess.Popen[bytes]
    log: Path
    offset_s: float

    def _signal(self, signum: int) -> None:
        """Every process of the node: its session (Ray's workers are process groups of
        their own in it)."""
        for pid in psutil.pids():
            with suppress(ProcessLookupError, PermissionError):
                if os.getsid(pid) == self.process.pid:
                    os.kill(pid, signum)

    @contextmanager
    def starved(self, share: float = 0.8, period_s: float = 0.05) -> Iterator[None]:
        """The node (raylet and workers) held stopped for `share` of every period, as
        cpulimit does and as a host whose CPU is taken away: its processes run only in the
        gaps."""
        stop = threading.Event()

        def duty() -> None:
            while not stop.is_set():
                self._signal(signal.SIGSTOP)
                time.sleep(share * period_s)
                self._signal(signal.SIGCONT)
                time.sleep((1 - share) * period_s)

        thread = threading.Thread(target=duty, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(5)
            self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """The whole node at once (raylet, workers), as a host that lost power."""
        self._signal(signal.SIGKILL)
        self.process.wait(10)


@dataclass
class LocalCluster:
    """`head()` first, then `add()` nodes; `stop()` kills them all."""

    folder: Path
    address: str = ""
    nodes: list[RayNode] = field(default_factory=list)

    def _start(
        self,
        args: Sequence[str],
        *,
        offset_s: float,
        python: str,
        env: dict[str, str] | None,
        wrap: Sequence[str] = (),
    ) -> RayNode:
        self.folder.mkdir(parents=True, exist_ok=True)
        log = self.folder / f"node-{len(self.nodes)}.log"
        command = [*wrap, python, "-m", "ray.scripts.scripts", "start", "--block", *args]
        if offset_s:
            command = [sys.executable, str(TIMENS), repr(offset_s), "--", *command]
        environment = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
        with log.open("wb") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=environment,
                start_new_session=True,
            )
        node = RayNode(process, log, offset_s)
        self.nodes.append(node)
        return node

    def head(self, cpus: int = 1) -> str:
        port = free_port()
        self._start(
            [
                "--head",
                f"--port={port}",
                f"--num-cpus={cpus}",
                "--include-dashboard=false",
                "--node-ip-address=127.0.0.1",
            ],
            offset_s=0.0,
            python=sys.executable,
            env=FAST_DEATH,
        )
        self.address = f"127.0.0.1:{port}"
        self._wait_for(1)
        return self.address

    def add(
        self,
        cpus: int = 1,
        *,
        offset_s: float = 0.0,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        wrap: Sequence[str] = (),
        resources: str | None = None,
    ) -> RayNode:
        """A node; `wrap` runs its `ray start` under another command (taskset, chrt), and
        `resources` (JSON) gives it custom resources a test can find it by."""
        args = [f"--address={self.address}", f"--num-cpus={cpus}", "--node-ip-address=127.0.0.1"]
        if resources:
            args.append(f"--resources={resources}")
        node = self._start(args, offset_s=offset_s, python=python, env=env, wrap=wrap)
        self._wait_for(len(self.nodes))
        return node

    def _ask(self, expression: str) -> str:
        """`expression` evaluated in a fresh driver of the cluster (this process stays out
        of Ray), printed."""
        out = subprocess.run(
            [sys.executable, "-c",
             "import ray, sys, json; ray.init(address=sys.argv[1], logging_level='ERROR', "
             f"log_to_driver=False); print(json.dumps({expression}))",
             self.address],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        lines = out.stdout.strip().splitlines()
        return lines[-1] if lines else "null"

    def warm(self) -> None:
        """A task pinned to every alive node imports what a load worker runs: a fresh
        cluster's first run otherwise spends its first seconds reading those modules from
        disk on each node, and falls behind its schedule in a short warm-up."""
        self._ask(
            "ray.get([ray.remote(lambda: bool(__import__('optlab.load.host_worker'))).options("
            "scheduling_strategy=__import__('ray.util.scheduling_strategies', fromlist=['x'])"
            ".NodeAffinitySchedulingStrategy(n['NodeID'], soft=False)).remote() "
            "for n in ray.nodes() if n['Alive']])"
        )

    def alive(self) -> int:
        try:
            return int(json.loads(self._ask("sum(n['Alive'] for n in ray.nodes())")))
        except (TypeError, ValueError):
            return 0

    def node_ids_with(self, resource: str) -> list[str]:
        """The alive nodes that have a custom resource."""
        found: list[str] = json.loads(
            self._ask(
                f"[n['NodeID'] for n in ray.nodes() if n['Alive'] and "
                f"{resource!r} in n['Resources']]"
            )
        )
        return found

    def _wait_for(self, count: int, *, exactly: bool = False) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.process.poll() is not None:
                    raise RuntimeError(
                        f"a Ray node exited while starting: {node.log.read_text()[-2000:]}"
                    )
            alive = self.alive()
            if alive == count or (alive > count and not exactly):
                return
            time.sleep(0.5)
        raise RuntimeError(f"the cluster did not reach {count} nodes within {START_TIMEOUT_S:g} s")

    def remove(self, node: RayNode) -> None:
        """Kill `node` and wait until the cluster no longer counts it alive."""
        node.kill()
        self.nodes.remove(node)
        self._wait_for(len(self.nodes), exactly=True)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.kill()
        self.nodes.clear()


def time_namespaces() -> str | None:
    """None when Linux time namespaces work here (root, kernel 5.6+); else why not."""
    done = subprocess.run(
        [sys.executable, str(TIMENS), "0.5", "--", "true"], capture_output=True, text=True
    )
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


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
