"""What the load generator offered, second by second: requests sent and requests in flight.

Windows (`optlab.metrics.log`) count what COMPLETED in each second. Against what was SENT,
they tell a target that cannot keep up (the backlog in flight grows, completions fall behind
the offered rate) from a load generator that fell behind its schedule (it sent late, with no
backlog of the target's making). The runner marks the generator's counters at every tick;
a window's figures are read from the marks around its span.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class LoadTimeline:
    """Marks of (perf_counter_ns, requests issued so far, requests in flight)."""

    window_ns: int = 1_000_000_000
    _ns: list[int] = field(default_factory=list)
    _issued: list[int] = field(default_factory=list)
    _in_flight: list[int] = field(default_factory=list)
    _phases: dict[str, int] = field(default_factory=dict)

    def set_phase(self, phase: str, start_ns: int) -> None:
        self._phases[phase] = start_ns

    def mark(self, now_ns: int, issued: int, in_flight: int) -> None:
        if self._ns and now_ns <= self._ns[-1]:
            return
        self._ns.append(now_ns)
        self._issued.append(issued)
        self._in_flight.append(in_flight)

    def _issued_at(self, ns: int) -> float | None:
        """Requests issued by `ns`, interpolated between the marks around it."""
        i = bisect.bisect_left(self._ns, ns)
        if i >= len(self._ns) or (i == 0 and self._ns[0] != ns):
            return None  # outside what was marked
        if self._ns[i] == ns or i == 0:
            return float(self._issued[i])
        t0, t1 = self._ns[i - 1], self._ns[i]
        return self._issued[i - 1] + (self._issued[i] - self._issued[i - 1]) * (ns - t0) / (t1 - t0)

    def window(self, phase: str, t_s: int, span_s: float) -> tuple[int | None, int | None]:
        """(requests offered in the window, requests in flight at its end); None unknown."""
        start = self._phases.get(phase)
        if start is None or not self._ns:
            return None, None
        begin = start + t_s * self.window_ns
        end = begin + round(span_s * 1e9)
        first, last = self._issued_at(begin), self._issued_at(end)
        offered = None if first is None or last is None else max(0, round(last - first))
        i = bisect.bisect_right(self._ns, end) - 1  # the last mark at or before the end
        in_flight = self._in_flight[i] if i >= 0 and end - self._ns[i] <= self.window_ns else None
        return offered, in_flight

    def in_flight_over(self, start_ns: int, end_ns: int) -> tuple[int | None, ...]:
        """(in flight at the start, at the end, at most) over the marks in [start, end]."""
        lo = bisect.bisect_left(self._ns, start_ns)
        hi = bisect.bisect_right(self._ns, end_ns)
        values = self._in_flight[lo:hi]
        if not values:
            return None, None, None
        return values[0], values[-1], max(values)

    def in_flight_every(self, start_ns: int, step_ns: int) -> list[int]:
        """The in-flight count at start, start + step, ... up to the last mark (each the last
        mark at or before that time)."""
        found = []
        t = start_ns
        while self._ns and t <= self._ns[-1]:
            i = bisect.bisect_right(self._ns, t) - 1
            if i >= 0:
                found.append(self._in_flight[i])
            t += step_ns
        return found

    def phase_start(self, phase: str) -> int | None:
        return self._phases.get(phase)
