"""Per-request stage timing that user target code can call without knowing about the harness.

The load generator sets :data:`CURRENT` around each call into a target; ``with stage("tokenize"):``
then accumulates the block's duration into that request. Work done on another thread (a batching
thread running one forward pass for many requests) is attributed by passing the captured
requests explicitly with ``requests=``.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = [
    "CURRENT",
    "HARNESS_SERIES",
    "LAG_SERIES",
    "RESERVED_STAGE",
    "SEND_LAG",
    "START_LAG",
    "TOTAL",
    "RequestTiming",
    "current_request",
    "is_target_stage",
    "stage",
]

# The series the harness measures itself, as opposed to the target's own stages. The runner
# measures "total"; letting user code write it would corrupt the headline number.
TOTAL = "total"
RESERVED_STAGE = TOTAL
SEND_LAG = "send_lag"  # how late each request left against its intended time
START_LAG = "start_lag"  # how long a started request waited for a free client
LAG_SERIES = (SEND_LAG, START_LAG)  # the generator's own lateness, never part of a latency
HARNESS_SERIES = (TOTAL, *LAG_SERIES)
# A streaming target's token series (`optlab.metrics.llm`): stored beside the stages, not stages.
LLM_PREFIX = "llm."


def is_target_stage(name: str) -> bool:
    """Whether a stored series is one of the target's own stages (not the total, the
    harness's lags, or a streaming target's token series)."""
    return name not in HARNESS_SERIES and not name.startswith(LLM_PREFIX)


class RequestTiming:
    """Stage durations of one request, in nanoseconds; a streamed response's event times."""

    __slots__ = ("stages", "stream")

    def __init__(self) -> None:
        # None until the first stage: most targets never call stage(), and the generator creates
        # one of these per request, so the common path must not allocate a dict.
        self.stages: dict[str, int] | None = None
        # A streaming target's response (`optlab.metrics.llm.StreamTiming`): its events' arrival
        # times, its end, its tokens; its origin is the request's (the collector's fold).
        self.stream: Any = None

    def add(self, stage: str, ns: int) -> None:
        stages = self.stages
        if stages is None:
            self.stages = {stage: ns}
        else:
            stages[stage] = stages.get(stage, 0) + ns

    def __repr__(self) -> str:
        return f"RequestTiming({self.stages!r})"


CURRENT: contextvars.ContextVar[RequestTiming | None] = contextvars.ContextVar(
    "optlab_current_request", default=None
)


def current_request() -> RequestTiming | None:
    """The request being served on this thread/task, or None outside the harness.

    Batching code captures this on the submitting side and hands it to the batch thread.
    """
    return CURRENT.get()


@contextmanager
def stage(name: str, requests: Sequence[RequestTiming] | None = None) -> Iterator[None]:
    """Time the block and add it to the current request, or to each of ``requests``.

    Outside any request this is a no-op, so targets can be run on their own without the harness.
    Nested stages both accumulate: they measure overlapping intervals by design.
    """
    if name == RESERVED_STAGE:
        raise ValueError(f"stage name {RESERVED_STAGE!r} is reserved for the runner")
    if requests is None:
        current = CURRENT.get()
        targets: Sequence[RequestTiming] = () if current is None else (current,)
    else:
        targets = requests
    if not targets:
        yield
        return
    start = time.perf_counter_ns()
    try:
        yield
    finally:
        elapsed = time.perf_counter_ns() - start
        for timing in targets:
            timing.add(name, elapsed)
