"""The ping-pong clock-offset estimator (optlab.load.clock) against fake clocks whose true
offset is known: the estimate lies within its stated bound for any delays either way, the
smallest round trip is kept, and a clock that jumps is flagged."""

from __future__ import annotations

import numpy as np
import pytest

from optlab.load.clock import Exchange, estimate_offset, ping_pong


class FakeHosts:
    """Two clocks: the remote reads `local + offset`; each call waits `out` then `back` ns,
    drawn from a skewed, asymmetric distribution."""

    def __init__(self, offset_ns: int, seed: int) -> None:
        self.now = 1_000_000_000
        self.offset = offset_ns
        self.rng = np.random.default_rng(seed)

    def local(self) -> int:
        self.now += int(self.rng.integers(1, 2000))
        return self.now

    def remote(self) -> int:
        out = int(self.rng.exponential(200_000)) + 50_000  # asymmetric on purpose
        back = int(self.rng.exponential(20_000)) + 5_000
        self.now += out
        read = self.now + self.offset
        self.now += back
        return read


@pytest.mark.parametrize("offset_s", [0.0, 3.7, -12.1, 86_400.25])
@pytest.mark.parametrize("seed", range(25))
def test_the_true_offset_lies_within_the_stated_bound(offset_s: float, seed: int) -> None:
    hosts = FakeHosts(round(offset_s * 1e9), seed)
    found = ping_pong(hosts.local, hosts.remote, rounds=16)
    assert abs(found.offset_ns - hosts.offset) <= found.bound_ns
    assert found.consistent and found.exchanges == 16
    assert (
        found.round_trip_ns == 2 * found.bound_ns or found.round_trip_ns == 2 * found.bound_ns - 1
    )


def test_the_exchange_with_the_smallest_round_trip_is_kept() -> None:
    exchanges = [
        Exchange(0, 5_000 + 3_000_000, 10_000),  # round trip 10 us
        Exchange(20_000, 21_000 + 3_000_000, 22_000),  # 2 us: the tightest
        Exchange(30_000, 90_000 + 3_000_000, 100_000),  # 70 us, asymmetric
    ]
    found = estimate_offset(exchanges)
    assert found.round_trip_ns == 2_000 and found.bound_ns == 1_000
    assert found.offset_ns == 3_000_000
    assert found.to_remote(10) == 3_000_010 and found.to_local(3_000_010) == 10


def test_a_clock_that_jumps_between_exchanges_is_flagged() -> None:
    steady = [Exchange(i * 10_000, i * 10_000 + 500 + 7_000, i * 10_000 + 1_000) for i in range(5)]
    jumped = Exchange(60_000, 60_500 + 7_000 + 5_000_000, 61_000)  # remote stepped by 5 ms
    assert estimate_offset(steady).consistent
    assert not estimate_offset([*steady, jumped]).consistent


def test_no_exchange_or_a_negative_round_trip_is_an_error() -> None:
    with pytest.raises(ValueError, match="no clock exchanges"):
        estimate_offset([])
    with pytest.raises(ValueError, match="negative"):
        estimate_offset([Exchange(10, 5, 0)])
