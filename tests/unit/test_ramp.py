"""The ramp load mode (optlab.config.modes.ramp, docs/experiment-files.md "Workload"): its
intended sends invert the ramp's cumulative intensity, its Poisson arrivals keep the intended
rate second by second, its file section is checked field by field, and a sweep keeps its shape."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from optlab.config.limits import check_load
from optlab.config.models import BaselineFile, ResolvedConfig, Workload
from optlab.config.modes import MODES, ClosedLoad, RampLoad, mode_of, step
from optlab.config.modes.ramp import ramp_offsets
from optlab.config.source import parse_yaml
from optlab.config.validation import config_error
from optlab.errors import ConfigError
from optlab.run.summarize import run_facts, summarize
from optlab.sweep.driver import level_config
from optlab.sweep.strategy import Probe
from tests.support.collected import collected

NS = 1_000_000_000


def ramp(**fields: Any) -> RampLoad:
    loaded = Workload.model_validate({"load": {"mode": "ramp", **fields}}).load
    assert isinstance(loaded, RampLoad)
    return loaded


def expected_sends(t: float, start: float, rate: float, ramp_s: float) -> float:
    """Lambda(t), written out here on its own: the integral of the intended rate."""
    if t <= ramp_s:
        return start * t + (rate - start) * t * t / (2 * ramp_s)
    return (start + rate) * ramp_s / 2 + rate * (t - ramp_s)


def intended_rate(t: float, start: float, rate: float, ramp_s: float) -> float:
    return start + (rate - start) * min(t, ramp_s) / ramp_s


def constant(start: float, rate: float, ramp_s: float, count: int) -> list[int]:
    return list(itertools.islice(ramp_offsets(start, rate, ramp_s, "constant", 0), count))


# -- constant arrivals: send k at exactly Lambda^-1(k) -------------------------------------------


@pytest.mark.parametrize(
    ("start", "rate", "ramp_s"),
    [(30.0, 300.0, 2.0), (0.0, 300.0, 2.0), (300.0, 30.0, 2.0), (120.0, 120.0, 1.5)],
    ids=["up", "from-zero", "down", "flat"],
)
def test_constant_sends_invert_the_cumulative_intensity_within_a_nanosecond(
    start: float, rate: float, ramp_s: float
) -> None:
    offsets = constant(start, rate, ramp_s, 3000)  # the ramp and ~8 s of the hold after it
    assert offsets[0] == 0
    assert offsets == sorted(offsets)
    for k, offset in enumerate(offsets):
        t = offset / NS
        # Rounding to the nanosecond moves Lambda by at most the rate times half a ns.
        slack = intended_rate(t, start, rate, ramp_s) * 0.5e-9 + 1e-9
        assert abs(expected_sends(t, start, rate, ramp_s) - k) <= slack, (k, offset)


def test_the_ramp_starts_ends_and_holds_where_lambda_says() -> None:
    # From 30/s to 300/s over 2 s: Lambda(2) = (30 + 300) * 2 / 2 = 330 sends.
    offsets = constant(30.0, 300.0, 2.0, 400)
    # The first gap: 30 t + 67.5 t^2 = 1, by the usual root of the quadratic.
    first = (-30 + math.sqrt(30**2 + 4 * 67.5)) / (2 * 67.5)
    assert offsets[1] == round(first * NS)
    assert offsets[330] == 2 * NS  # the ramp's last send is at its end, to the nanosecond
    # Then the hold at 300/s, each offset from its index: no drift.
    assert offsets[331] == 2 * NS + round(NS / 300)
    assert offsets[399] == 2 * NS + round(69 * NS / 300)


def test_a_ramp_from_zero_sends_at_the_square_roots() -> None:
    offsets = constant(0.0, 300.0, 2.0, 301)
    for k in (1, 2, 50, 300):
        assert offsets[k] == round(math.sqrt(2 * k * 2.0 / 300.0) * NS)


def test_a_ramp_down_starts_fast_and_holds_the_lower_rate() -> None:
    offsets = constant(300.0, 30.0, 2.0, 340)
    gaps = np.diff(offsets)
    assert gaps[0] == pytest.approx(NS / 300, rel=0.01)
    assert offsets[330] == 2 * NS
    assert offsets[331] - offsets[330] == round(NS / 30)


# -- Poisson arrivals: the intended rate, second by second, reproducible ---------------------------


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_poisson_counts_per_second_are_within_four_sigma_of_the_intended(seed: int) -> None:
    start, rate, ramp_s = 200.0, 2000.0, 5.0
    horizon = 10  # five seconds of ramp, five of hold
    offsets = []
    for offset in ramp_offsets(start, rate, ramp_s, "poisson", seed):
        if offset >= horizon * NS:
            break
        offsets.append(offset)
    counts = np.bincount(np.asarray(offsets) // NS, minlength=horizon)
    for second, count in enumerate(counts):
        mean = expected_sends(second + 1, start, rate, ramp_s) - expected_sends(
            second, start, rate, ramp_s
        )
        assert abs(count - mean) <= 4 * math.sqrt(mean), (second, count, mean)
    # The ramp is visible: the first second holds a fraction of the last one's sends.
    assert counts[0] < counts[-1] / 4


def test_poisson_arrivals_are_reproducible_by_seed() -> None:
    def first(seed: int) -> list[int]:
        return list(itertools.islice(ramp_offsets(30.0, 300.0, 2.0, "poisson", seed), 10_000))

    assert first(3) == first(3)
    assert first(3) != first(4)
    # 10,000 draws span more than two numpy chunks: the chunks join without a step back.
    assert np.all(np.diff(first(3)) >= 0)


def test_the_schedule_sends_the_offsets_round_robin() -> None:
    given = ramp(rate=300.0, ramp_s=2.0, arrival="constant")
    schedule = MODES["ramp"].schedule(given, 3, 0, None)
    assert schedule is not None
    sends = list(itertools.islice(schedule, 6))
    assert [index for _, index in sends] == [0, 1, 2, 0, 1, 2]
    assert [offset for offset, _ in sends] == constant(30.0, 300.0, 2.0, 6)


def test_offsets_refuse_a_ramp_that_has_no_rate() -> None:
    with pytest.raises(ValueError, match="rate must be positive"):
        next(ramp_offsets(1.0, 0.0, 2.0, "constant", 0))
    with pytest.raises(ValueError, match="ramp_s must be positive"):
        next(ramp_offsets(1.0, 10.0, 0.0, "poisson", 0))


# -- what the mode answers -----------------------------------------------------------------------


def test_the_ramp_is_an_open_loop_measured_after_its_ramp_at_its_rate() -> None:
    given = ramp(rate=400.0, start_rate=20.0, ramp_s=3.0, max_in_flight=64)
    mode = mode_of(given)
    assert mode is MODES["ramp"]
    assert mode.open_loop is True
    assert mode.offered_qps(given) == 400.0
    assert mode.min_warmup_s(given) == 3.0
    assert mode.in_flight_limit(given) == 64
    assert mode.in_flight_field(given) == "max_in_flight"
    assert mode.clients(given) is None
    assert mode.peak_rate(given) == (400.0, "rate")
    # A ramp down peaks at its start.
    assert mode.peak_rate(ramp(rate=40.0, start_rate=400.0, ramp_s=3.0)) == (400.0, "start_rate")


def test_the_run_is_judged_against_the_rate_after_the_ramp() -> None:
    facts = run_facts(collected(load=ramp(rate=250.0, ramp_s=4.0, max_in_flight=32)))
    assert facts.open_loop is True
    assert facts.intended_qps == 250.0
    assert facts.in_flight_limit == 32
    assert facts.clients is None


def test_a_ramp_longer_than_the_protocols_warmup_is_the_warmup_a_note_names() -> None:
    # The hand-built run's protocol warms up at most 30 s; a 40 s ramp is the longest warm-up.
    notes = summarize(collected(load=ramp(rate=100.0, ramp_s=40.0), stabilised=False)).summary
    assert "warmup did not stabilise within 40 s; measured anyway" in notes.notes


def test_a_left_out_start_rate_is_stored_as_a_tenth_of_the_rate() -> None:
    given = ramp(rate=300.0, ramp_s=2.0)
    assert given.model_dump() == {
        "mode": "ramp",
        "rate": 300.0,
        "start_rate": 30.0,
        "ramp_s": 2.0,
        "arrival": "poisson",
        "max_in_flight": 512,
    }
    # Read back, the stored form is itself (a stored config keeps its hash).
    assert ramp(**{k: v for k, v in given.model_dump().items() if k != "mode"}) == given
    assert ramp(rate=300.0, start_rate=0, ramp_s=2.0).start_rate == 0.0


# -- a sweep steps a ramp keeping its shape --------------------------------------------------------


def test_an_open_sweep_level_keeps_the_ramps_length_and_starting_fraction() -> None:
    given = ramp(rate=200.0, start_rate=50.0, ramp_s=3.0, arrival="constant", max_in_flight=99)
    level = step(given, "open", 800.0)
    assert isinstance(level, RampLoad)
    assert level.model_dump() == {
        "mode": "ramp",
        "rate": 800.0,
        "start_rate": 200.0,
        "ramp_s": 3.0,
        "arrival": "constant",
        "max_in_flight": 99,
    }
    closed = step(ramp(rate=200.0, ramp_s=3.0, processes=2), "closed", 6.0)
    assert isinstance(closed, ClosedLoad)
    assert closed.concurrency == 6 and closed.processes == 2
    with pytest.raises(ValidationError):
        step(given, "open", 2_000_000.0)  # a level is validated like the file's load


def test_a_sweeps_level_of_a_ramp_experiment_is_a_ramp_to_the_levels_rate() -> None:
    config = ResolvedConfig.model_validate(
        {
            "target": {"kind": "builtin", "name": "synthetic"},
            "knobs": {},
            "workload": {"load": {"mode": "ramp", "rate": 100.0, "ramp_s": 5.0}},
        }
    )
    level = level_config(config, Probe("open", 400.0, "growth"), position=3).workload.load
    assert isinstance(level, RampLoad)
    assert (level.start_rate, level.rate, level.ramp_s) == (40.0, 400.0, 5.0)
    assert mode_of(level).min_warmup_s(level) == 5.0  # each level warms up on its own ramp


# -- the file: accepted, or refused naming the field -----------------------------------------------

FILE = """\
name: ramped
description: a ramp
target: {{kind: builtin, name: synthetic}}
knobs: {{service_ms: 1.0}}
workload:
  load: {{mode: ramp, {load}}}
"""


def loaded(load: str) -> BaselineFile:
    source = parse_yaml(FILE.format(load=load), Path("ramped.yaml"))
    try:
        return BaselineFile.model_validate(source.data)
    except ValidationError as exc:
        raise config_error(exc, BaselineFile, source) from exc


def test_a_ramp_file_is_accepted() -> None:
    spec = loaded("rate: 300, start_rate: 0, ramp_s: 2, arrival: constant")
    assert isinstance(spec.workload.load, RampLoad)
    assert spec.workload.load.start_rate == 0.0


@pytest.mark.parametrize(
    ("load", "said"),
    [
        (
            "rate: 300, start_rate: -1, ramp_s: 2",
            "workload.load.start_rate: Input should be greater than or equal to 0",
        ),
        ("rate: 300, ramp_s: 0", "workload.load.ramp_s: Input should be greater than 0"),
        (
            "rate: 300, ramp_s: 4000",
            "workload.load.ramp_s: Input should be less than or equal to 3600",
        ),
        ("rate: 300", "workload.load.ramp_s: required field is missing"),
        ("ramp_s: 2", "workload.load.rate: required field is missing"),
        ("rate: 0, ramp_s: 2", "workload.load.rate: Input should be greater than 0"),
        ("rate: 300, ramp_s: 2, arrival: bursty", "workload.load.arrival: 'bursty' is not allowed"),
        ("rate: 300, ramp_s: 2, ramp: 3", "workload.load.ramp: unknown key 'ramp'"),
    ],
)
def test_a_bad_ramp_is_refused_naming_the_field(load: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        loaded(load)
    assert said in caught.value.message


@pytest.mark.parametrize(
    ("load", "field", "said"),
    [
        ("rate: 200000, ramp_s: 2", "rate", "200,000 requests/s"),
        ("rate: 100, start_rate: 150000, ramp_s: 2", "start_rate", "150,000 requests/s"),
    ],
)
def test_a_ramp_beyond_one_generators_rate_is_refused_naming_the_field(
    load: str, field: str, said: str
) -> None:
    source = parse_yaml(FILE.format(load=load), Path("ramped.yaml"))
    spec = BaselineFile.model_validate(source.data)
    with pytest.raises(ConfigError) as caught:
        check_load(spec.workload, source, threaded=True, kind="builtin")
    assert f"ramped.yaml:6: workload.load.{field}: {said}" in caught.value.message
    # Within the cap, the same ramp is accepted.
    fine = BaselineFile.model_validate(
        parse_yaml(FILE.format(load="rate: 5000, ramp_s: 2"), Path("ramped.yaml")).data
    )
    check_load(fine.workload, source, threaded=True, kind="builtin")
