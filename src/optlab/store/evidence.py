"""The evidence a run keeps for diagnosis (docs/run-json.md "evidence"): its threads' CPU, the
garbage collector, memory's trend, the batcher's batches, the network, a profile, the
machine's other processes. Part of the run summary (`optlab.store.summary.RunSummary`).
"""

from __future__ import annotations

from typing import Literal

from optlab.store.frozen import Frozen as _Frozen

__all__ = [
    "BatchingEvidence",
    "GcEvidence",
    "MemoryTrend",
    "Neighbour",
    "NetworkEvidence",
    "ProcessEvidence",
    "ProfileEvidence",
    "ProfileFrame",
    "RunEvidence",
    "ThreadCpu",
]


class ThreadCpu(_Frozen):
    """One thread's CPU over the measured phase, in percent of one core."""

    name: str
    cpu_pct: float


class ProcessEvidence(_Frozen):
    """How a process (with its children) used the CPU over the measured phase. Percentages
    are of ONE core (like top); context switches per second: voluntary ones are waits (I/O, a
    lock, a queue), involuntary ones are preemptions (more runnable threads than cores)."""

    cpu_user_pct: float | None = None
    cpu_system_pct: float | None = None
    ctx_voluntary_per_s: float | None = None
    ctx_involuntary_per_s: float | None = None
    threads: tuple[ThreadCpu, ...] = ()  # the busiest threads, most first


class GcEvidence(_Frozen):
    """Python's garbage collector in optlab's process over the measured phase (`gc.callbacks`);
    only an in-process target's garbage is collected there."""

    collections: int
    pause_total_ms: float
    pause_max_ms: float
    pause_p99_ms: float | None = None
    share_pct: float  # pause_total over the measured wall time, in percent


class MemoryTrend(_Frozen):
    """RSS against requests served over the measured phase: a least-squares slope and its fit."""

    mib_per_1k_requests: float
    r2: float
    samples: int
    series: Literal["rss_bytes", "service_rss_bytes"] = "rss_bytes"


class BatchingEvidence(_Frozen):
    """A batching target's batches over the measured phase: fill = mean batch / max batch."""

    mean_batch: float | None = None
    max_batch: int | None = None
    fill_ratio: float | None = None
    wait_ms_mean: float | None = None  # time a request waited for its batch to close
    wait_ms_p99: float | None = None


class NetworkEvidence(_Frozen):
    """A network target: the client's total against the server's own total (Server-Timing),
    the difference being the network and HTTP cost."""

    client_p50_ms: float
    server_p50_ms: float
    overhead_p50_ms: float
    overhead_share: float  # overhead / client total, 0..1


class ProfileFrame(_Frozen):
    thread: str
    frame: str  # "function (file:line)"
    share_pct: float  # of the thread's samples


class ProfileEvidence(_Frozen):
    """`optlab run --profile`: py-spy's samples of the target's process over the measured
    phase. `gil_pct`: samples in which some thread held the GIL; `idle_pct`: samples in which
    the sampled threads were idle (waiting)."""

    tool: str = "py-spy"
    pid: int | None = None
    samples: int = 0
    gil_pct: float | None = None
    idle_pct: float | None = None
    frames: tuple[ProfileFrame, ...] = ()  # the top frames per thread, most first


class Neighbour(_Frozen):
    """A process outside the run (neither optlab's nor the target service's, nor one they
    started) that used the CPU while it was measured; one that exited in the phase too."""

    name: str
    pid: int
    cpu_pct: float  # percent of one core over the measured phase


class RunEvidence(_Frozen):
    """What `optlab diagnose` reads beyond latency and resources (docs/run-json.md
    "evidence"); a field is None when the run could not measure it, never a guess."""

    cores: int | None = None  # logical CPUs the run could use
    process: ProcessEvidence | None = None  # optlab's process (and an in-process target)
    service: ProcessEvidence | None = None  # the target's service, its whole tree
    neighbour_cpu_pct: float | None = None  # other processes, percent of one core (mean)
    neighbours: tuple[Neighbour, ...] = ()  # the busiest of them, most first
    steal_pct: float | None = None  # hypervisor steal, all cores 0..100 (mean)
    gc: GcEvidence | None = None
    memory: MemoryTrend | None = None
    in_flight_mean: float | None = None
    in_flight_max: int | None = None
    batching: BatchingEvidence | None = None
    network: NetworkEvidence | None = None
    profile: ProfileEvidence | None = None
