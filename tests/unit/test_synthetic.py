"""The synthetic target: its knobs, its timing, its stalls, its FCFS servers, and the
simulated ground truth."""

from __future__ import annotations

import statistics
import threading
from typing import Any

import numpy as np
import pytest

from optlab.config.models import ClosedLoad, Workload
from optlab.errors import ConfigError
from optlab.metrics.stages import CURRENT, RequestTiming
from optlab.reference.queueing import (
    mmc_mean_sojourn,
    mmc_sojourn_quantile,
    poisson_arrivals,
    service_times,
    simulate_sojourn,
)
from optlab.reference.synthetic import (
    SyntheticKnobs,
    SyntheticTarget,
    build,
    finish_time,
    inputs,
    simulate_open_loop,
)

MS = 1_000_000


class FakeClock:
    """The target's clock: `now()` reads what the test set (plus `step` after each read, so
    successive arrivals are `step` apart), and `sleep_until()` records its deadline and returns
    at once, so a test reads each call's begin and done exactly and never waits."""

    def __init__(self, step: int = 0) -> None:
        self.t = 0
        self.step = step
        self.slept: list[int] = []
        self.by_thread: dict[int, tuple[int, ...]] = {}
        self.timings: list[RequestTiming] = []
        self._lock = threading.Lock()

    def at(self, t_ns: int) -> None:
        self.t = t_ns

    def now(self) -> int:
        with self._lock:
            t = self.t
            self.t += self.step
            return t

    def sleep_until(self, deadline_ns: int) -> None:
        with self._lock:
            self.slept.append(deadline_ns)
            ident = threading.get_ident()
            self.by_thread[ident] = (*self.by_thread.get(ident, ()), deadline_ns)

    def deadlines(self) -> list[int]:
        return list(self.slept)

    def _call(self, target: SyntheticTarget, arrival_ns: int) -> list[int]:
        """Call `target` at `arrival_ns` from its t0; the deadlines it slept to, from its t0."""
        self.at(target.t0_ns + arrival_ns)
        before = len(self.slept)
        timing = RequestTiming()
        token = CURRENT.set(timing)
        try:
            target(0)
        finally:
            CURRENT.reset(token)
        self.timings.append(timing)
        return [t - target.t0_ns for t in self.slept[before:]]

    def call_ns(self, target: SyntheticTarget, arrival_ns: int) -> tuple[int, int]:
        """A queued call's (begin, done) in ns from the target's t0."""
        begin, done = self._call(target, arrival_ns)
        return begin, done

    def call(self, target: SyntheticTarget, arrival_ms: float) -> tuple[tuple[float, float], float]:
        """The same in ms: ((arrival, begin), done). A target without servers sleeps once,
        to its done: begin is then its arrival."""
        slept = [t / MS for t in self._call(target, round(arrival_ms * MS))]
        begin = arrival_ms if len(slept) == 1 else slept[0]
        return (arrival_ms, begin), slept[-1]


def fake_target(knobs: dict[str, Any], clock: FakeClock) -> SyntheticTarget:
    """The target `build(knobs)` makes, on the fake clock."""
    return SyntheticTarget(build(knobs).knobs, now=clock.now, sleep_until=clock.sleep_until)


def test_knobs_are_strict() -> None:
    assert build({}).knobs == SyntheticKnobs()
    with pytest.raises(ConfigError, match="service_msec"):
        build({"service_msec": 1})
    with pytest.raises(ConfigError, match="error_rate"):
        build({"error_rate": 2})
    with pytest.raises(ConfigError, match="stall_ms .* must be shorter"):
        build({"stall_every_s": 0.1, "stall_ms": 100})


def test_inputs() -> None:
    workload = Workload(load=ClosedLoad(mode="closed", concurrency=1))
    assert inputs(workload) == list(range(64))
    sized = Workload(load=ClosedLoad(mode="closed", concurrency=1), inputs={"count": 3})
    assert inputs(sized) == [0, 1, 2]


def test_service_time_is_slept_to_and_recorded_as_a_stage() -> None:
    clock = FakeClock()
    target = fake_target({"service_ms": 1.0}, clock)
    for request in range(3):
        clock.at(request * 5 * MS)
        timing = RequestTiming()
        token = CURRENT.set(timing)
        try:
            assert target(request) == request  # the response is the request
        finally:
            CURRENT.reset(token)
        assert timing.stages is not None and set(timing.stages) == {"service"}
    # No queue: each call sleeps to its arrival plus the 1 ms service, nothing else.
    assert clock.deadlines() == [(request * 5 + 1) * MS for request in range(3)]


def test_lognormal_median_is_the_service_time() -> None:
    target = build({"distribution": "lognormal", "service_ms": 2.0, "sigma": 0.5, "seed": 3})
    draws = [target.service_time() / MS for _ in range(4000)]
    assert statistics.median(draws) == pytest.approx(2.0, rel=0.05)
    assert np.std(np.log(draws)) == pytest.approx(0.5, rel=0.1)
    first = build({"distribution": "lognormal", "service_ms": 2.0, "seed": 9})
    again = build({"distribution": "lognormal", "service_ms": 2.0, "seed": 9})
    assert [first.service_time() for _ in range(10)] == [again.service_time() for _ in range(10)]


def test_error_rate() -> None:
    always = build({"service_ms": 0, "error_rate": 1.0})
    with pytest.raises(RuntimeError, match="synthetic error"):
        always(0)
    never = build({"service_ms": 0, "error_rate": 0.0})
    assert [never(i) for i in range(100)] == list(range(100))


def test_single_server_queues_and_records_the_wait() -> None:
    clock = FakeClock()
    target = fake_target({"service_ms": 30.0, "single_server": True}, clock)
    # The first arrives at 0 and is served at once; the second arrives 10 ms later, queues
    # behind it until 30 and is served from 30 to 60; a third after both have left waits not.
    assert clock.call(target, 0) == ((0, 0), 30)
    assert clock.call(target, 10) == ((10, 30), 60)
    assert clock.call(target, 100) == ((100, 100), 130)
    timing = clock.timings[1]
    assert timing.stages is not None and set(timing.stages) == {"queue", "service"}


def test_a_stall_holds_a_request_until_it_ends() -> None:
    clock = FakeClock()
    target = fake_target({"service_ms": 1.0, "stall_every_s": 0.2, "stall_ms": 100.0}, clock)
    # The k-th stall holds [k * 200, k * 200 + 100) ms after construction. Arriving 10 ms
    # into the first: held to its end (300 ms), then served 1 ms.
    assert clock.call(target, 210) == ((210, 210), 301)
    # Outside a stall, the service time alone.
    assert clock.call(target, 350) == ((350, 350), 351)
    # Work that runs into the next stall resumes after it: half a ms before the stall at 400,
    # held to 500, then the other half.
    assert clock.call(target, 399.5) == ((399.5, 399.5), 500.5)


@pytest.mark.parametrize(
    ("start", "service", "done"),
    [
        (100, 50, 150),  # before the first stall: no effect
        (950, 100, 1350),  # 50 before the stall at 1000, held 300, then 50 more
        (1100, 10, 1310),  # arrives in the stall: starts when it ends
        (1100, 0, 1300),  # even with no work to do
        (1999, 1, 2300),  # work runs out exactly as a stall begins: held through it
        (2500, 1000, 3800),  # 500 before the stall at 3000, held 300, 500 after
        (0, 2100, 2700),  # a long request spans two stalls
    ],
)
def test_finish_time_with_stalls(start: int, service: int, done: int) -> None:
    assert finish_time(start, service, 1000, 300) == done


def test_finish_time_without_stalls() -> None:
    assert finish_time(1234, 10, None, 0) == 1244
    assert finish_time(1234, 10, 1000, 0) == 1244


def test_simulate_open_loop_by_hand() -> None:
    # No stalls: a FIFO queue. Three at once wait for each other; a later one does not.
    assert simulate_open_loop([0, 0, 0, 100], 10, None, 0).tolist() == [10, 20, 30, 10]
    # With stalls every 1000 for 300: the first is held across the stall, the others queue.
    latencies = simulate_open_loop([950, 1000, 1310, 2000], 100, 1000, 300).tolist()
    assert latencies == [400, 450, 240, 400]
    assert simulate_open_loop([], 10, None, 0).dtype == np.int64


def test_server_knobs() -> None:
    assert build({}).knobs.queue_servers is None  # unlimited: nobody queues
    assert build({"single_server": True}).knobs.queue_servers == 1
    assert build({"single_server": True, "servers": 1}).knobs.queue_servers == 1
    assert build({"servers": 8}).knobs.queue_servers == 8
    with pytest.raises(ConfigError, match=r"single_server: true means servers: 1.*servers is 2"):
        build({"single_server": True, "servers": 2})
    for bad in (0, 4097):
        with pytest.raises(ConfigError, match="servers"):
            build({"servers": bad})
    with pytest.raises(ConfigError, match="distribution"):
        build({"distribution": "gamma"})


def test_exponential_mean_is_the_service_time() -> None:
    target = build({"distribution": "exponential", "service_ms": 4.0, "seed": 5})
    draws = np.array([target.service_time() / MS for _ in range(20_000)])
    # Exp(mean 4 ms): the sample mean's standard error is 4 / sqrt(20000) = 0.028 ms.
    assert draws.mean() == pytest.approx(4.0, abs=5 * 4.0 / np.sqrt(draws.size))
    assert np.median(draws) == pytest.approx(4.0 * np.log(2), rel=0.05)  # not a median of 4
    again = build({"distribution": "exponential", "service_ms": 4.0, "seed": 5})
    assert draws[:10].tolist() == [again.service_time() / MS for _ in range(10)]


def test_one_server_serves_in_arrival_order_whatever_order_its_threads_run_in() -> None:
    # Twenty threads call a 10 ms single server; the clock says the k-th call to take the
    # target's lock arrived at 3k ms. The threads start, reach the lock and sleep in whatever
    # order the machine gives them: the schedule is made at arrival, so the k-th arrival
    # begins when the (k-1)-th is done, 10 ms later each (the FCFS queue of these arrivals).
    clock = FakeClock(step=3 * MS)
    target = fake_target({"service_ms": 10.0, "servers": 1}, clock)
    gate = threading.Barrier(20)

    def call() -> None:
        gate.wait()
        target(0)

    threads = [threading.Thread(target=call) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
        assert not thread.is_alive(), "a call never returned"
    # Each thread slept twice: to its begin, then to its done.
    schedule = sorted(clock.by_thread.values())
    arrivals = [(k + 1) * 3 * MS for k in range(20)]  # the construction read 0, then 3 ms
    expected_done = simulate_sojourn(np.array(arrivals) / 1e9, np.full(20, 0.010), 1) * 1e9
    assert [done for _, done in schedule] == [
        a + round(d) for a, d in zip(arrivals, expected_done, strict=True)
    ]
    assert [begin for begin, _ in schedule] == [3 * MS] + [done for _, done in schedule[:-1]]


def test_two_servers_are_an_mm2_queue() -> None:
    """Poisson arrivals at 120/s into 2 servers of exponential 10 ms mean (ρ = 0.6), 8 s of
    them on a fake clock: the sojourns are those of the same arrivals and the same seeded
    draws simulated, and their P99 and mean lie in the M/M/2 law's band for runs this long."""
    servers, lam, mean_s = 2, 120.0, 0.010
    knobs = {"distribution": "exponential", "service_ms": mean_s * 1e3, "servers": servers}
    clock = FakeClock()
    target = fake_target({**knobs, "seed": 4}, clock)
    arrivals_s = poisson_arrivals(lam, 8.0, np.random.default_rng(4))
    arrivals_ns = [round(a * 1e9) for a in arrivals_s]
    sojourn_ns = []
    for arrival in arrivals_ns:
        _, done = clock.call_ns(target, arrival)
        sojourn_ns.append(done - arrival)
    sojourn_s = np.array(sojourn_ns) / 1e9

    # 1. Exactly the queue: the same arrivals with the same seeded service draws, simulated.
    twin = build({**knobs, "seed": 4})
    draws_ns = np.array([twin.service_time() for _ in arrivals_ns])
    simulated = simulate_sojourn(np.array(arrivals_ns) / 1e9, draws_ns / 1e9, servers)
    assert np.abs(sojourn_s - simulated).max() < 1e-9

    # 2. The M/M/2 law, within this run's sampling error, computed rather than guessed: the
    # same statistics over 500 simulated runs of the same length give the band that holds
    # nearly all of them. Eight seconds is ~960 requests, so the P99 band is wide (busy
    # periods make the tail noisy); the twin check above is the tight one.
    exact_p99 = mmc_sojourn_quantile(0.99, servers, lam, 1 / mean_s)  # 65.7 ms
    exact_mean = mmc_mean_sojourn(servers, lam, 1 / mean_s)  # 15.6 ms
    rng = np.random.default_rng(99)
    p99s, means = [], []
    for _ in range(500):
        sim_arrivals = poisson_arrivals(lam, 8.0, rng)
        sim_services = service_times("exponential", mean_s, 0.0, sim_arrivals.size, rng)
        sim = simulate_sojourn(sim_arrivals, sim_services, servers)
        p99s.append(np.quantile(sim, 0.99))
        means.append(sim.mean())
    for measured, runs, exact in (
        (float(np.quantile(sojourn_s, 0.99)), p99s, exact_p99),
        (float(sojourn_s.mean()), means, exact_mean),
    ):
        low, high = np.quantile(runs, [0.001, 0.999])
        assert low < exact < high  # the band is around the truth
        assert low <= measured <= high, (measured, exact, low, high)


def test_the_workload_seed_gives_the_service_its_own_draws() -> None:
    from optlab.config.models import ResolvedConfig
    from optlab.targets.kinds.synthetic import _seeded

    def config(workload_seed: int) -> ResolvedConfig:
        return ResolvedConfig.model_validate(
            {
                "target": {"kind": "builtin", "name": "synthetic"},
                "knobs": {"distribution": "exponential", "servers": 2, "seed": 3},
                "workload": {"load": {"mode": "open", "rate": 10}, "seed": workload_seed},
                "protocol": {"name": "quick"},
            }
        )

    def draws(workload_seed: int) -> list[int]:
        target = build(_seeded(config(workload_seed)))
        return [target.service_time() for _ in range(5)]

    assert _seeded(config(0))["seed"] == 3  # the default workload seed leaves the knob's draws
    assert draws(7) == draws(7)
    assert draws(7) != draws(8) != draws(0)
