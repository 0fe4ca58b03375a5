"""Another host's monotonic clock against this one's, measured by ping-pong (Cristian's
algorithm, NTP's round-trip filter), for load sent from several hosts (docs/hosts.md).

One exchange: this host reads its clock (`sent`), asks the other host for its clock
(`remote`), reads its clock again (`received`). Whenever the other host read its clock, it
was between `sent` and `received` here, so its offset (remote clock minus this clock) lies
within

    remote - received  <=  offset  <=  remote - sent

whatever the delays each way. The estimate is the middle, `remote - (sent + received) / 2`,
and its error bound half the round trip: exact bounds, not an assumption of symmetric delay.
Of many exchanges the one with the smallest round trip is kept (the tightest bound); the
bounds of every exchange must overlap, and when they do not (a clock stepped, a sample
corrupted) the estimate says so rather than averaging.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["ClockOffset", "Exchange", "estimate_offset", "ping_pong"]


@dataclass(frozen=True)
class Exchange:
    """One ping-pong, in ns: this clock before and after, the other clock in between."""

    sent_ns: int
    remote_ns: int
    received_ns: int

    @property
    def round_trip_ns(self) -> int:
        return self.received_ns - self.sent_ns

    @property
    def interval(self) -> tuple[int, int]:
        """Where the offset must lie, from this exchange alone."""
        return self.remote_ns - self.received_ns, self.remote_ns - self.sent_ns


@dataclass(frozen=True)
class ClockOffset:
    """The other clock minus this one (ns), within +-`bound_ns`; `round_trip_ns` of the
    exchange it came from; `consistent` is False when some exchanges' intervals do not
    overlap (the other clock jumped while it was measured)."""

    offset_ns: int
    bound_ns: int
    round_trip_ns: int
    exchanges: int
    consistent: bool = True

    def to_remote(self, local_ns: int) -> int:
        """An instant of this clock on the other one."""
        return local_ns + self.offset_ns

    def to_local(self, remote_ns: int) -> int:
        """An instant of the other clock on this one."""
        return remote_ns - self.offset_ns


def estimate_offset(exchanges: Sequence[Exchange]) -> ClockOffset:
    """The offset from the exchange with the smallest round trip, and whether every
    exchange's interval agrees with it."""
    if not exchanges:
        raise ValueError("no clock exchanges to estimate an offset from")
    for e in exchanges:
        if e.round_trip_ns < 0:
            raise ValueError(f"a round trip cannot be negative: {e}")
    best = min(exchanges, key=lambda e: e.round_trip_ns)
    low = max(e.interval[0] for e in exchanges)
    high = min(e.interval[1] for e in exchanges)
    half, odd = divmod(best.round_trip_ns, 2)
    return ClockOffset(
        offset_ns=best.remote_ns - best.sent_ns - half,
        bound_ns=half + odd,
        round_trip_ns=best.round_trip_ns,
        exchanges=len(exchanges),
        consistent=low <= high,
    )


def ping_pong(
    local_clock: Callable[[], int], remote_clock: Callable[[], int], rounds: int = 16
) -> ClockOffset:
    """`rounds` exchanges with `remote_clock` (a call that returns the other host's clock,
    e.g. an actor method awaited), timed on `local_clock`."""
    exchanges = []
    for _ in range(max(1, rounds)):
        sent = local_clock()
        remote = remote_clock()
        received = local_clock()
        exchanges.append(Exchange(sent, int(remote), received))
    return estimate_offset(exchanges)
