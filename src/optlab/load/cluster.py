"""The Ray cluster a load from several hosts runs on (`workload.load.hosts`, docs/hosts.md):
joining it, picking its nodes and checking each before any run row exists (reachable, the
CPUs its workers reserve, optlab importable there at this version), and the node set's part
of the run's environment. Ray is imported only here and in the modules that drive the load,
only when a load asks for hosts: `pip install 'optlab[ray]'`.
"""

from __future__ import annotations

import importlib
import json
import logging
import socket
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from optlab.config.modes.base import Hosts, address_parts
from optlab.errors import ConfigError

if TYPE_CHECKING:
    pass

__all__ = ["CALL_TIMEOUT_S", "RAY_HINT", "Cluster", "Node", "affinity", "connect", "ray_module"]

RAY_HINT = (
    "install Ray beside optlab, here and on every node (the same Ray, Python and optlab "
    "versions everywhere): pip install 'optlab[ray]'"
)
CONNECT_TIMEOUT_S = 3.0  # a TCP connect to the head's port, before Ray's own long retries
CALL_TIMEOUT_S = 60.0  # a probe or a worker's start


def ray_module() -> ModuleType:
    try:
        return importlib.import_module("ray")
    except ImportError:
        raise ConfigError(
            "workload.load.hosts: load from several hosts runs on Ray, which is not installed here",
            hint=RAY_HINT,
        ) from None


def affinity(node_id: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


@dataclass(frozen=True)
class Node:
    """One node that sends load: `name` is optlab's (node-a, node-b, ... in the cluster's
    order), the rest Ray's and the node's own."""

    name: str
    node_id: str
    host: str
    ip: str
    cpus: float
    environment: dict[str, Any]


@dataclass(frozen=True)
class Cluster:
    """The nodes a load runs on, checked: reachable, enough CPUs, optlab and the same version
    on each."""

    address: str
    hosts: Hosts
    nodes: tuple[Node, ...]
    ray_version: str

    def fingerprint(self) -> dict[str, Any]:
        """The node set and each node's environment: part of the run's environment, so a step
        measured from other nodes is refused as a hidden variable."""
        # In a stable order of what they are (Ray's order of nodes changes as they restart).
        nodes = sorted(
            ({**n.environment, "ip": n.ip} for n in self.nodes),
            key=lambda n: json.dumps(n, sort_keys=True, default=str),
        )
        return {
            "ray": self.ray_version,
            "workers_per_node": self.hosts.workers_per_node,
            "nodes": nodes,
        }


_CLUSTERS: dict[tuple[Any, ...], Cluster] = {}


def _reachable(address: str) -> None:
    parts = address_parts(address)
    if parts is None:
        return
    try:
        with socket.create_connection(parts, timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        raise ConfigError(
            f"workload.load.hosts.ray: the Ray cluster at {address} cannot be reached "
            f"({exc.strerror or exc})",
            hint="start it (`ray start --head --port=6379` on the head node), or correct the "
            "address: HOST:PORT of the head node, reachable from this machine (docs/hosts.md)",
        ) from None


def _init(ray: ModuleType, address: str) -> None:
    if ray.is_initialized():
        context = ray.get_runtime_context()
        current = getattr(context, "gcs_address", None)
        if address in ("auto", current):
            return
        ray.shutdown()
    try:
        ray.init(
            address=address,
            namespace="optlab",
            log_to_driver=False,
            logging_level=logging.ERROR,
            configure_logging=False,
        )
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(
            f"workload.load.hosts.ray: cannot join the Ray cluster at {address}: {exc}",
            hint="check that `ray status --address " + address + "` works from this machine "
            "and that its Ray and Python versions match the cluster's (docs/hosts.md)",
        ) from None


def connect(hosts: Hosts) -> Cluster:
    """Join the cluster and pick the nodes, each checked before any run row exists: alive,
    with the CPUs its workers reserve, able to import optlab, at this optlab's version."""
    key = (hosts.ray, hosts.nodes, hosts.workers_per_node, hosts.cpus_per_worker)
    ray = ray_module()
    known = _CLUSTERS.get(key)
    if known is not None and ray.is_initialized():
        up = {n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        if all(node.node_id in up for node in known.nodes):
            return known
    _reachable(hosts.ray)
    _init(ray, hosts.ray)
    need = hosts.workers_per_node * hosts.cpus_per_worker
    alive = sorted(
        (n for n in ray.nodes() if n.get("Alive")),
        key=lambda n: (n.get("NodeManagerAddress", ""), n["NodeID"]),
    )
    fit = [n for n in alive if float(n.get("Resources", {}).get("CPU", 0)) >= need]
    if len(fit) < hosts.nodes:
        listed = ", ".join(
            f"{n.get('NodeManagerAddress', '?')} ({n.get('Resources', {}).get('CPU', 0):g} CPUs)"
            for n in alive
        )
        raise ConfigError(
            f"workload.load.hosts: {hosts.nodes} nodes with {need:g} CPUs each are asked for "
            f"({hosts.workers_per_node} workers x {hosts.cpus_per_worker:g} CPUs), but the "
            f"cluster at {hosts.ray} has {len(fit)} such node{'s' if len(fit) != 1 else ''} "
            f"of {len(alive)} alive: {listed or 'none'}",
            hint="lower hosts.nodes or hosts.workers_per_node (or cpus_per_worker), or add "
            "nodes to the cluster (`ray start --address=HEAD:PORT --num-cpus=N` on each)",
        )
    chosen = fit[: hosts.nodes]
    facts = _probe_all(ray, chosen)
    nodes = tuple(
        Node(
            name=f"node-{_letter(i)}",
            node_id=n["NodeID"],
            host=fact["host"],
            ip=n.get("NodeManagerAddress", ""),
            cpus=float(n.get("Resources", {}).get("CPU", 0)),
            environment=fact["environment"],
        )
        for i, (n, fact) in enumerate(zip(chosen, facts, strict=True))
    )
    cluster = Cluster(hosts.ray, hosts, nodes, str(ray.__version__))
    _CLUSTERS[key] = cluster
    return cluster


def _letter(i: int) -> str:
    letters = ""
    i += 1
    while i:
        i, r = divmod(i - 1, 26)
        letters = chr(ord("a") + r) + letters
    return letters


def node_facts() -> dict[str, Any]:  # pragma: no cover - runs on a Ray node
    """What a node says of itself (the probe): its host, optlab version, environment."""
    from optlab import __version__
    from optlab.env.collect import host_fingerprint

    return {"host": socket.gethostname(), "optlab": __version__, "environment": host_fingerprint()}


def _probe_all(ray: ModuleType, chosen: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from optlab import __version__

    probe = ray.remote(node_facts)
    refs = [
        probe.options(scheduling_strategy=affinity(n["NodeID"]), num_cpus=0).remote()
        for n in chosen
    ]
    facts: list[dict[str, Any]] = []
    for n, ref in zip(chosen, refs, strict=True):
        where = f"node {n.get('NodeManagerAddress', '?')} ({n['NodeID'][:12]})"
        try:
            facts.append(ray.get(ref, timeout=CALL_TIMEOUT_S))
        except Exception as exc:
            text = str(exc)
            if "No module named 'optlab" in text or "ModuleNotFoundError" in text:
                raise ConfigError(
                    f"workload.load.hosts: {where} cannot import optlab (ModuleNotFoundError): "
                    "every node runs optlab's own load generator",
                    hint=f"install optlab {__version__} on that node, in the Python environment "
                    "its `ray start` runs from (docs/hosts.md)",
                ) from None
            raise ConfigError(
                f"workload.load.hosts: {where} did not answer optlab's probe: "
                f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}",
                hint="check the node with `ray status`; its Ray and Python versions must match "
                "this machine's",
            ) from None
    wrong = [
        f"{n.get('NodeManagerAddress', '?')} ({n['NodeID'][:12]}) has optlab {f['optlab']}"
        for n, f in zip(chosen, facts, strict=True)
        if f["optlab"] != __version__
    ]
    if wrong:
        raise ConfigError(
            f"workload.load.hosts: this machine runs optlab {__version__}, but "
            + "; ".join(wrong)
            + ": every node must run the same optlab (its generator is part of what is measured)",
            hint=f"install optlab {__version__} on those nodes and restart their `ray start`",
        )
    return facts
