"""What every load mode is: its part of the experiment file (`workload.load`,
docs/experiment-files.md) and one class that answers what the rest of optlab asks of a load.

A mode's class is stateless and holds no machine: its answers are pure functions of the load
model (numbers, the schedule of intended sends, the trace file it names), so they are tested
without threads or clocks. The generators, the run's summary, the machine limits
(`config.limits`) and the sweep ask the mode (`optlab.config.modes.mode_of`) instead of
switching on the model's class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from optlab.config.knobs import StrictModel

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_PROCESSES",
    "MAX_RATE",
    "NS_PER_S",
    "IndexedTrace",
    "Hosts",
    "LoadCommon",
    "LoadMode",
    "Schedule",
    "address_parts",
]

MAX_CONCURRENCY = 4096  # closed-loop clients
MAX_RATE = 1_000_000.0  # open-loop requests/s
MAX_PROCESSES = 64  # load-generator processes
NS_PER_S = 1_000_000_000

# (intended offset in ns from the load's time zero, request index), endless.
Schedule = Iterator[tuple[int, int]]
# A trace's (offset ns, request index or None: the next one round robin) pairs.
IndexedTrace = Sequence[tuple[int, int | None]]


MAX_NODES = 256  # Ray nodes a load spreads over


class Hosts(StrictModel):
    """`workload.load.hosts`: the load generated from several machines of a Ray cluster
    (docs/hosts.md). Each of `nodes` nodes runs `workers_per_node` worker processes, each a
    load-generator process on its share of the ONE schedule."""

    ray: str = Field(
        min_length=1,
        description="the Ray cluster's address: HOST:PORT of its head (GCS port, 6379 by "
        "default), `ray://HOST:10001` through Ray Client, or `auto` (the cluster this machine "
        "belongs to)",
    )
    nodes: int = Field(ge=1, le=MAX_NODES, description="Ray nodes that send load")
    workers_per_node: int = Field(
        1, ge=1, le=MAX_PROCESSES, description="load-generator processes on each node"
    )
    cpus_per_worker: float = Field(
        1.0,
        gt=0,
        le=64,
        description="CPUs each worker reserves through Ray's scheduler (its `num_cpus`)",
    )

    @field_validator("ray")
    @classmethod
    def _an_address(cls, value: str) -> str:
        address_parts(value)
        return value


def address_parts(address: str) -> tuple[str, int] | None:
    """(host, port) of a Ray address, HOST:PORT or ray://HOST:PORT; None for `auto`.
    ValueError, saying what to write, for anything else."""
    if address == "auto":
        return None
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if not sep or not host.strip("[]") or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"{address!r} is not a Ray address: write HOST:PORT of the head node's GCS (6379 "
            "unless `ray start --head --port` said otherwise), ray://HOST:10001 for Ray "
            "Client, or auto"
        )
    return host.strip("[]"), int(port)


class LoadCommon(StrictModel):
    processes: int = Field(
        1,
        ge=1,
        le=MAX_PROCESSES,
        description="load-generator processes sharing the schedule (HTTP and command targets): "
        "for when one Python process cannot keep it; their histograms merge losslessly",
    )

    hosts: Hosts | None = Field(
        None,
        description="send the load from several machines of a Ray cluster (HTTP and command "
        "targets; docs/hosts.md)",
    )

    @model_validator(mode="after")
    def _hosts_or_processes(self) -> LoadCommon:
        if self.hosts is not None and self.processes != 1:
            raise ValueError(
                "`processes` and `hosts` both spread the load: with hosts, set "
                "hosts.workers_per_node instead of processes"
            )
        return self

    @property
    def generators(self) -> int:
        """Load-generator processes sharing the schedule: local processes, or every worker
        on every node."""
        if self.hosts is not None:
            return self.hosts.nodes * self.hosts.workers_per_node
        return self.processes

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Stored configs from before `processes` and `hosts` existed must keep their hash:
        # one process and no hosts, the defaults, are left out of the dump.
        data = handler(self)
        if isinstance(data, dict):
            if data.get("processes") == 1:
                del data["processes"]
            if data.get("hosts", 0) is None:
                del data["hosts"]
        return data


M = TypeVar("M", bound=LoadCommon)


class LoadMode(ABC, Generic[M]):
    """One `workload.load.mode`: its model and everything optlab asks of a load of it.

    Adding a mode is one module in this package (its model and its `LoadMode`) and its entry in
    the registry, `optlab.config.modes` (README, "Layout").
    """

    name: ClassVar[str]  # the `mode:` value in the file
    model: ClassVar[type[LoadCommon]]
    # Sends on a schedule of intended times whatever the target does, so latency is measured
    # from the intended send (no coordinated omission) and send lag is judged; False: the
    # next send waits for a reply.
    open_loop: ClassVar[bool]

    @abstractmethod
    def in_flight_limit(self, load: M) -> int:
        """The most requests in flight at once: the clients, or one process's sending pool."""

    def in_flight_per_process(self, load: M) -> int:
        """The requests one load-generator process holds in flight at most."""
        return self.in_flight_limit(load)

    @abstractmethod
    def in_flight_field(self, load: M) -> str:
        """The field of `workload.load` that sets the in-flight limit (a refusal names it)."""

    def peak_rate(self, load: M) -> tuple[float, str] | None:
        """The highest rate (requests/s) the schedule asks for and the field that sets it;
        None when the load sets no rate (`config.limits` caps it per process)."""
        return None

    def indexed_trace(self, load: M, trace_dir: Path | None, n: int) -> IndexedTrace | None:
        """The trace the schedule replays, read once per generator (ids turned into indices
        modulo `n`); None for a mode without one."""
        return None

    def schedule(self, load: M, n: int, seed: int, trace: IndexedTrace | None) -> Schedule | None:
        """The intended sends, cycling through `n` requests: every generator process of a run
        builds the same one and takes its share by stride. None: a closed loop, which sends
        when a reply arrives."""
        return None

    def clients(self, load: M) -> int | None:
        """The closed loop's clients; None for a load that sends on a schedule."""
        return None

    def offered_qps(self, load: M) -> float | None:
        """The rate the measured phase is meant to receive; None where the target sets it (a
        closed loop) or the trace does (a replay)."""
        return None

    def min_warmup_s(self, load: M) -> float:
        """Seconds the warm-up lasts at least, for a load that reaches its rate only then."""
        return 0.0

    def at_level(self, level: float, like: LoadCommon) -> LoadCommon:
        """A load of this mode at a sweep's `level` (clients, or requests/s), keeping what
        carries over from the experiment's own load `like`. Only a sweep's axes have one."""
        raise ValueError(f"a sweep does not step along {self.name} loads")

    def step(self, load: M, axis: LoadMode[Any], level: float) -> LoadCommon:
        """The experiment's `load` at a sweep level on `axis` (the closed or open mode)."""
        return axis.at_level(level, like=load)
