"""The sweep's strategy against simulated queues whose truth is known (Erlang C).

Each level is an FCFS c-server queue simulated for the time the driver would measure it
(1 s warmup, then max(5 s x duration_factor, 730 / rate)); benchmarks/sweep_accuracy.py does
the same over many seeds and six queues.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np
import pytest

from optlab.config.slo import parse_slo
from optlab.errors import OptlabError
from optlab.store.sweep_result import SweepResult
from optlab.sweep.strategy import Level, Probe, Settings, conclude, judge, next_probe

MM2_CAPACITY = 151.6  # M/M/2, 10 ms mean service, P99 <= 100 ms (Erlang C)
SERVICE_S = 0.010
WARMUP_S = 1.0


def _sojourn(arrivals: np.ndarray, services: np.ndarray, servers: int) -> np.ndarray:
    free = [-math.inf] * servers
    done = np.empty(arrivals.size)
    for i, (arrival, service) in enumerate(zip(arrivals.tolist(), services.tolist(), strict=True)):
        finish = max(arrival, free[0]) + service
        heapq.heapreplace(free, finish)
        done[i] = finish
    return done - arrivals


def _measure_s(rate: float, probe: Probe) -> float:
    return max(5.0 * probe.duration_factor, 730 / rate)


def _open_level(probe: Probe, servers: int, rng: np.random.Generator) -> Level:
    measured = _measure_s(probe.load, probe)
    end = WARMUP_S + measured
    arrivals = np.sort(rng.uniform(0, end, rng.poisson(probe.load * end)))
    so = _sojourn(arrivals, rng.exponential(SERVICE_S, arrivals.size), servers)
    done = arrivals + so
    lat = so[arrivals >= WARMUP_S] * 1000
    completed = np.sum((done >= WARMUP_S) & (done < end))
    p99 = float(np.percentile(lat, 99))
    return Level(
        "open", probe.load, completed / measured, float(np.percentile(lat, 50)), p99, None,
        0.0, True, measured_s=end, duration_s=measured, p99_ms=p99,
        purpose=probe.purpose,
    )  # fmt: skip


def _closed_level(probe: Probe, servers: int, rng: np.random.Generator) -> Level:
    clients = int(probe.load)
    measured = _measure_s(min(clients, servers) / SERVICE_S, probe)
    end = WARMUP_S + measured
    issue = [(0.0, i) for i in range(clients)]
    free = [0.0] * servers
    lat, done = [], []
    while issue:
        t, who = heapq.heappop(issue)
        if t >= end:
            continue
        finish = max(t, free[0]) + rng.exponential(SERVICE_S)
        heapq.heapreplace(free, finish)
        if t >= WARMUP_S:
            lat.append((finish - t) * 1000)
        done.append(finish)
        heapq.heappush(issue, (finish, who))
    finished = np.asarray(done)
    completed = np.sum((finished >= WARMUP_S) & (finished < end))
    p99 = float(np.percentile(lat, 99))
    return Level(
        "closed", clients, completed / measured, float(np.percentile(lat, 50)), p99, None,
        0.0, True, measured_s=end, duration_s=measured, p99_ms=p99,
        purpose=probe.purpose,
    )  # fmt: skip


def sweep(
    settings: Settings,
    servers: int = 2,
    seed: int = 0,
    alter: Callable[[Level], Level] = lambda level: level,
) -> tuple[SweepResult, list[Level]]:
    """Drive next_probe / conclude as the driver does, each level simulated then `alter`ed."""
    rng = np.random.default_rng(seed)
    levels: list[Level] = []
    while (probe := next_probe(levels, settings)) is not None:
        measure = _open_level if probe.mode == "open" else _closed_level
        levels.append(alter(measure(probe, servers, rng)))
        assert len(levels) < 40
    return conclude(levels, settings), levels


def _open(slo: str = "p99=100ms", **kw: float) -> Settings:
    return Settings("open", parse_slo(slo), **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mm2_capacity_near_erlang_c(seed: int) -> None:
    result, levels = sweep(_open(), seed=seed)
    assert result.capacity_qps is not None
    # Measured over 20 seeds (benchmarks/sweep_accuracy.py) the error stays within -14%/+6%.
    assert abs(result.capacity_qps / MM2_CAPACITY - 1) <= 0.15
    assert result.limited_by in ("slo", "saturation")
    assert result.capacity_interval is not None
    assert result.capacity_interval[0] <= result.capacity_qps <= result.capacity_interval[1]
    assert sum(lv.measured_s for lv in levels) < 200


def test_no_rate_meets_an_slo_below_the_service_time() -> None:
    # One exponential 10 ms service alone has a P99 of 46 ms.
    result, levels = sweep(_open("p99=20ms"))
    assert result.capacity_qps is None
    assert result.capacity_interval is None
    assert result.message.startswith("no rate meets P99 ≤ 20 ms: at 1 client P99 was ")
    assert len(levels) == 1


def test_max_rate_reached_is_a_lower_bound() -> None:
    result, levels = sweep(_open(max_rate=80.0))
    assert result.capacity_qps == pytest.approx(80.0)
    assert result.limited_by is None
    assert "--max-rate" in result.message
    assert max(lv.load for lv in levels if lv.mode == "open") == pytest.approx(80.0)


def test_a_generator_bound_rate_is_measured_again_then_caps_the_search() -> None:
    def generator_bound(level: Level) -> Level:
        if level.mode == "open" and level.load >= 90:
            return Level(**{**level.__dict__, "generator": "send-lag P99 12 ms"})
        return level

    result, levels = sweep(_open(), alter=generator_bound)
    assert result.limited_by == "generator"
    assert result.capacity_qps is not None and result.capacity_qps < 90
    assert any("load generator" in note for note in result.notes)
    first = next(lv.load for lv in levels if lv.generator is not None)
    assert all(lv.load <= first for lv in levels)  # nothing above it was probed
    bound = min(lv.load for lv in levels if lv.generator is not None)
    assert 90 <= bound <= result.capacity_interval[1] if result.capacity_interval else False
    for rate in {lv.load for lv in levels if lv.generator is not None}:
        # Each rate the generator decided was measured twice before it was believed.
        assert [lv.purpose for lv in levels if lv.load == rate][1:] == ["again"]


def test_one_generator_bound_level_does_not_end_the_sweep() -> None:
    # Send lag moves between identical runs: the first level at each rate the generator
    # "decided" is noise, and the same rate measured again (its own seed) is fine.
    seen: set[float] = set()

    def first_time_generator_bound(level: Level) -> Level:
        if level.mode == "open" and level.load not in seen:
            seen.add(level.load)
            return Level(**{**level.__dict__, "generator": "send-lag P99 3.6 ms", "valid": False})
        return level

    result, levels = sweep(_open(), seed=1, alter=first_time_generator_bound)
    assert result.capacity_qps is not None
    assert result.limited_by in ("slo", "saturation")
    assert abs(result.capacity_qps / MM2_CAPACITY - 1) <= 0.15
    assert sum(lv.purpose == "again" for lv in levels) >= 2


def test_an_unstable_level_that_met_the_slo_is_measured_again() -> None:
    flagged: list[float] = []

    def unstable_once(level: Level) -> Level:
        if level.mode == "open" and not flagged:
            flagged.append(level.load)
            return Level(**{**level.__dict__, "valid": False, "reasons": ("unstable: QPS ...",)})
        return level

    result, levels = sweep(_open(), seed=2, alter=unstable_once)
    again = [lv for lv in levels if lv.purpose == "again"]
    assert [lv.load for lv in again] == flagged
    assert result.capacity_qps is not None and result.capacity_qps > flagged[0]
    assert abs(result.capacity_qps / MM2_CAPACITY - 1) <= 0.15


def test_errors_above_the_limit() -> None:
    def failing(level: Level) -> Level:
        if level.mode == "open" and level.load >= 90:
            return Level(**{**level.__dict__, "error_rate": 0.05})
        return level

    result, _ = sweep(_open(), alter=failing)
    assert result.limited_by == "errors"
    assert result.capacity_qps is not None and result.capacity_qps < 90


def test_closed_mode_on_a_four_server_queue() -> None:
    settings = Settings("closed", parse_slo("p99=100ms"))
    result, levels = sweep(settings, servers=4)
    # Four servers at 10 ms serve 400/s at most; past 4 clients throughput stops growing.
    assert result.capacity_qps is not None
    assert 340 <= result.capacity_qps <= 440  # a 5 s level counts ~2,000 completions: +-5%
    assert result.knee_clients in (2, 4)
    assert result.limited_by in ("saturation", "slo")
    assert [int(lv.load) for lv in levels][:4] == [1, 2, 4, 8]


@pytest.mark.parametrize(
    ("text", "percentile", "ms"),
    [("p99=60ms", "p99", 60.0), ("p99.9=1s", "p99.9", 1000.0), ("p95=200", "p95", 200.0)],
)
def test_parse_slo_accepts(text: str, percentile: str, ms: float) -> None:
    slo = parse_slo(text)
    assert (slo.percentile, slo.ms) == (percentile, ms)


@pytest.mark.parametrize("text", ["p98=5", "p99=fast", "latency=5ms"])
def test_parse_slo_refuses_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(OptlabError) as raised:
        parse_slo(text)
    assert "p99=60ms" in str(raised.value.hint)


def test_a_wide_interval_says_how_to_narrow_it() -> None:
    """One server's gentle latency curve leaves quick sweeps with wide intervals; the result
    says so and names the lever (longer levels), and a narrow interval gets no such note."""
    noted = 0
    for seed in range(6):
        result, _ = sweep(_open(), servers=1, seed=seed)
        assert result.capacity_qps is not None and result.capacity_interval is not None
        spread = (
            (result.capacity_interval[1] - result.capacity_interval[0]) / 2 / result.capacity_qps
        )
        has_note = any("--level-duration" in note for note in result.notes)
        assert has_note == (spread > 0.15), (seed, result.capacity_interval, result.notes)
        noted += has_note
    assert noted >= 1  # M/M/1 at quick levels: +-20-50% intervals are common


@pytest.mark.parametrize(
    ("rate", "achieved", "seconds", "limit"),
    [
        (10.0, 9.0, 600.0, "saturation"),  # 10% short over 6,000 arrivals: far past the noise
        (10.0, 9.0, 3.0, "slo"),  # 3 of 30 missing: inside 3 sigma of Poisson arrivals
        (200.0, 191.0, 600.0, "slo"),  # within 5%
    ],
)
def test_a_level_without_a_verdict_is_saturated_by_the_one_rule(
    rate: float, achieved: float, seconds: float, limit: str
) -> None:
    # A simulated level carries no verdict (`saturated` None): run/pace.saturated_by on its
    # figures alone decides, the rule the run's verdict uses. Its P99 (500 ms) misses the SLO,
    # so a level that is not saturated is the SLO's.
    level = Level(
        "open", rate, achieved, 100.0, 500.0, None, 0.0, True, duration_s=seconds,
        measured_s=seconds + 1,
    )  # fmt: skip
    assert level.saturated is None
    assert judge(level, _open()) == limit
    assert judge(Level(**{**level.__dict__, "saturated": False}), _open()) == "slo"
