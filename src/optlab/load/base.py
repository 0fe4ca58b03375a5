"""What every load generator shares: the interface a run drives, the stop report, the start
lead and the lateness rule. What a load asks for (its schedule, its in-flight limit) is its
mode's (`optlab.config.modes`).

Three generators implement `LoadGenerator`: threads calling an in-process target
(`optlab.load.generator`), one event loop driving a network client (`optlab.load.aio`), and
worker processes each running an event loop on a share of one schedule
(`optlab.load.processes`). They record into the same `Collector` with the same latency
definitions, so a run measures the same thing whichever drives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from optlab.metrics.log import Collector, WorkerLog

__all__ = [
    "LATE_NS",
    "PROCESS_START_LEAD_NS",
    "START_LEAD_NS",
    "LoadGenerator",
    "LogSource",
    "StopReport",
]

LATE_NS = 1_000_000  # a request that left more than this after its intended time was late
LATE_FRACTION = 0.01  # more late requests than this and the generator fell behind
# Time zero is set a little after the generator is released, so the first intended sends are
# not already due while its workers are still waking: threads or an event loop in this process
# wake within a scheduler tick; worker processes are each told "go" over a pipe, then woken by
# the scheduler, one after another on a busy machine.
START_LEAD_NS = 2_000_000  # threads (load/generator.py) and one event loop (load/aio.py)
PROCESS_START_LEAD_NS = 100_000_000  # worker processes (load/processes.py)


@dataclass(frozen=True)
class StopReport:
    """What the generator did. ``abandoned`` requests were still inside the target when the
    drain timed out; their threads are daemons and are left to finish (or not) on their own."""

    issued: int
    completed: int
    abandoned: int
    fell_behind: bool
    late: int = 0  # open loop: requests sent more than LATE_NS after their intended time
    failure: BaseException | None = None  # a BaseException raised inside a worker, if any

    @classmethod
    def of(
        cls,
        issued: int,
        completed: int,
        late: int,
        *,
        open_loop: bool,
        failure: BaseException | None,
    ) -> StopReport:
        """The report of any generator: the same fell-behind rule for threads, event loops
        and processes."""
        return cls(
            issued=issued,
            completed=completed,
            abandoned=issued - completed,
            fell_behind=open_loop and issued > 0 and late > LATE_FRACTION * issued,
            late=late,
            failure=failure,
        )


class LogSource(Protocol):
    """Where a generator gets the logs its workers record into (a `Collector`)."""

    def new_log(self) -> WorkerLog: ...


class LoadGenerator(Protocol):
    """What a run needs of a load generator: start it, watch it tick by tick, stop it."""

    @property
    def issued(self) -> int:
        """Requests sent so far."""
        ...

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet returned (may be a request behind)."""
        ...

    @property
    def failure(self) -> BaseException | None:
        """What stopped the generator from inside (never a target's error); polled while the
        load runs."""
        ...

    @property
    def open_loop(self) -> bool: ...

    @property
    def t0_ns(self) -> int:
        """``perf_counter_ns`` of the schedule's time zero; 0 before start()."""
        ...

    def start(self, collector: Collector, /) -> None:
        """Start sending and return once the load is under way."""
        ...

    def stop(self, drain_timeout_s: float = 5.0) -> StopReport:
        """Stop issuing, wait up to ``drain_timeout_s`` for requests in flight; never raises
        for what happened inside a worker (it is in the report). Called again, the same
        report; called before start() (a Ctrl-C while the run was setting up), a report of
        nothing sent."""
        ...
