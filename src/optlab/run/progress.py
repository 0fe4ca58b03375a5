"""What a run shows while it is measured: the live status line and notes, and a guard that keeps
output that fails (a closed pipe, a terminal gone) from failing the measurement."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

__all__ = ["GuardedProgress", "LiveStatus", "Progress"]

_T = TypeVar("_T")


@dataclass(frozen=True)
class LiveStatus:
    experiment: str
    phase: str
    elapsed_s: float
    planned_s: float
    qps: float | None
    p50_ms: float | None
    p99_ms: float | None
    cpu_pct: float | None
    gpu_pct: float | None
    # The phase's failed requests so far, and how many of them timed out: while every
    # request times out, QPS 0 and no P50 would otherwise be all the live line shows.
    errors: int = 0
    timeouts: int = 0


class Progress(Protocol):
    def update(self, status: LiveStatus) -> None: ...

    def note(self, text: str) -> None: ...


class GuardedProgress:
    """A Progress whose output failing never fails the measurement.

    `optlab run X | head -2`, a CI log pipe that closed, or a terminal that went away
    (EIO after SIGHUP) make every later write raise; the measurement goes on silently.
    """

    def __init__(self, inner: Progress) -> None:
        self.inner = inner
        self.broken: OSError | None = None

    def update(self, status: LiveStatus) -> None:
        self._write(self.inner.update, status)

    def note(self, text: str) -> None:
        self._write(self.inner.note, text)

    def _write(self, write: Callable[[_T], None], value: _T) -> None:
        if self.broken is None:
            try:
                write(value)
            except OSError as exc:
                self.broken = exc
