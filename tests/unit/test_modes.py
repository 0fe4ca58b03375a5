"""The load modes (optlab.config.modes): the registry, what each mode answers, and the arrivals
pinned to what they were before the modes had a package of their own."""

from __future__ import annotations

import hashlib
import itertools
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

import optlab.config.models as models
from optlab.config.models import ResolvedConfig, SloLimits, Workload
from optlab.config.modes import (
    MODES,
    ClosedLoad,
    Load,
    LoadCommon,
    OpenLoad,
    mode_named,
    mode_of,
    step,
)
from optlab.config.modes.open import poisson_offsets


def digest(values: list[int]) -> str:
    return hashlib.sha256(np.asarray(values, dtype=np.int64).tobytes()).hexdigest()


def load(data: dict[str, Any]) -> LoadCommon:
    loaded: LoadCommon = Workload.model_validate({"load": data}).load
    return loaded


# -- arrivals: identical to load/schedules.py before the move (83f25d7) ----------------------

# Captured from that commit's poisson_offsets(300.0, seed=7) and constant_offsets(300.0).
POISSON_300_SEED_7 = "aae36f7a791bb8b923f25328699eb93b7eaae604f65791cf3e65e59f48d9f662"
POISSON_300_SEED_7_FIRST = [2358431, 5775775, 7670938]
POISSON_300_SEED_7_LAST = 33428888564
CONSTANT_300 = "f4e78a3fced01a27878e654c7d1b32e63b76d9ed06247c570a09ba909000c563"
# Request indices 0..4 round robin, 10,000 of them (from that commit's make_schedule).
SCHEDULE_INDICES_5 = "eabcfc6c7691344d5f541689212875451fc8d53ab1a13024df98cfa746ae3e43"


def test_the_first_10000_poisson_offsets_of_a_seed_are_what_they_were() -> None:
    offsets = list(itertools.islice(poisson_offsets(300.0, 7), 10_000))
    assert offsets[:3] == POISSON_300_SEED_7_FIRST
    assert offsets[-1] == POISSON_300_SEED_7_LAST
    assert digest(offsets) == POISSON_300_SEED_7


@pytest.mark.parametrize(
    ("arrival", "expected"), [("poisson", POISSON_300_SEED_7), ("constant", CONSTANT_300)]
)
def test_the_open_modes_schedule_sends_those_offsets_round_robin(
    arrival: str, expected: str
) -> None:
    mode_load = load({"mode": "open", "rate": 300.0, "arrival": arrival})
    schedule = mode_of(mode_load).schedule(mode_load, 5, 7, None)
    assert schedule is not None
    pairs = list(itertools.islice(schedule, 10_000))
    assert digest([offset for offset, _ in pairs]) == expected
    assert digest([index for _, index in pairs]) == SCHEDULE_INDICES_5
    assert [index for _, index in pairs[:7]] == [0, 1, 2, 3, 4, 0, 1]


def test_a_replay_schedule_loops_its_trace_and_fills_missing_ids_round_robin() -> None:
    replay = load({"mode": "replay", "trace": "t.jsonl"})
    trace = [(0, None), (5, 2), (10, None)]
    schedule = mode_of(replay).schedule(replay, 3, 0, trace)
    assert schedule is not None
    # Period: last offset plus the mean gap (10 + 5); an id picks its request, None the next.
    assert list(itertools.islice(schedule, 7)) == [
        (0, 0), (5, 2), (10, 1), (15, 2), (20, 2), (25, 0), (30, 1)
    ]  # fmt: skip
    with pytest.raises(ValueError, match="needs its trace"):
        mode_of(replay).schedule(replay, 3, 0, None)


def test_a_replay_reads_its_trace_relative_to_the_experiment(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text('{"t": 0.5, "id": 7}\n{"t": 0.25}\n', encoding="utf-8")
    replay = load({"mode": "replay", "trace": "t.jsonl", "time_scale": 2.0})
    with pytest.warns(UserWarning, match="not in order"):
        trace = mode_of(replay).indexed_trace(replay, tmp_path, 4)
    assert trace == [(500_000_000, None), (1_000_000_000, 3)]
    for other in ({"mode": "closed", "concurrency": 2}, {"mode": "open", "rate": 5.0}):
        assert mode_of(load(other)).indexed_trace(load(other), tmp_path, 4) is None


def test_a_closed_loop_has_no_schedule() -> None:
    closed = load({"mode": "closed", "concurrency": 3})
    assert mode_of(closed).schedule(closed, 5, 7, None) is None


# -- the registry ------------------------------------------------------------------------------


def test_the_registry_and_the_files_load_union_name_the_same_modes() -> None:
    union = typing.get_args(typing.get_args(Load)[0])
    assert {model.model_fields["mode"].annotation for model in union} == {
        typing.Literal[name] for name in MODES
    }
    for name, mode in MODES.items():
        assert mode.name == name
        assert mode.model in union
        assert mode_named(name) is mode


def test_an_unknown_mode_or_model_is_refused() -> None:
    with pytest.raises(ValueError, match="no load mode 'nonesuch'"):
        mode_named("nonesuch")
    with pytest.raises(TypeError, match="LoadCommon"):
        mode_of(LoadCommon())
    with pytest.raises(ValidationError):
        load({"mode": "nonesuch", "rate": 5.0})


# -- what each mode answers --------------------------------------------------------------------

CLOSED = {"mode": "closed", "concurrency": 10, "processes": 4}
OPEN = {"mode": "open", "rate": 250.0, "arrival": "constant", "max_in_flight": 64}
REPLAY = {"mode": "replay", "trace": "t.csv"}


@pytest.mark.parametrize(
    ("data", "open_loop", "limit", "per_process", "field", "clients", "offered", "peak"),
    [
        (CLOSED, False, 10, 3, "concurrency", 10, None, None),
        (OPEN, True, 64, 64, "max_in_flight", None, 250.0, (250.0, "rate")),
        (REPLAY, True, 512, 512, "mode", None, None, None),
    ],
)
def test_each_mode_answers_for_its_loads(
    data: dict[str, Any],
    open_loop: bool,
    limit: int,
    per_process: int,
    field: str,
    clients: int | None,
    offered: float | None,
    peak: tuple[float, str] | None,
) -> None:
    given = load(data)
    mode = mode_of(given)
    assert mode.name == data["mode"]
    assert mode.open_loop is open_loop
    assert mode.in_flight_limit(given) == limit
    assert mode.in_flight_per_process(given) == per_process
    assert mode.in_flight_field(given) == field
    assert mode.clients(given) == clients
    assert mode.offered_qps(given) == offered
    assert mode.peak_rate(given) == peak
    assert mode.min_warmup_s(given) == 0.0


# -- how a sweep steps a load ------------------------------------------------------------------


def test_a_sweep_level_keeps_the_open_loops_arrivals_and_pool() -> None:
    stepped = step(load(OPEN), "open", 900.0)
    assert isinstance(stepped, OpenLoad)
    assert stepped.model_dump() == {**OPEN, "rate": 900.0}
    closed = step(load(OPEN), "closed", 12.0)
    assert isinstance(closed, ClosedLoad)
    assert closed.model_dump() == {"mode": "closed", "concurrency": 12}


@pytest.mark.parametrize("data", [CLOSED, REPLAY])
def test_a_sweep_level_of_another_mode_keeps_only_its_processes(data: dict[str, Any]) -> None:
    processes = load(data).processes
    stepped = step(load(data), "open", 40.0)
    assert isinstance(stepped, OpenLoad)
    expected = OpenLoad(mode="open", rate=40.0, processes=processes)  # the defaults otherwise
    assert stepped.model_dump() == expected.model_dump()
    closed = step(load(data), "closed", 7.9)  # a level of clients is a whole number
    assert isinstance(closed, ClosedLoad)
    assert closed.concurrency == 7 and closed.processes == processes


def test_only_the_sweeps_axes_make_a_level() -> None:
    with pytest.raises(ValueError, match="does not step along replay"):
        MODES["replay"].at_level(5.0, load(OPEN))
    with pytest.raises(ValidationError):
        step(load(OPEN), "open", 0.0)  # a level is validated like the file's load


# -- the stored form never moves ---------------------------------------------------------------


def test_a_loads_stored_form_is_what_it_was() -> None:
    # One process, the default, is left out of the dump (hashes of stored configs).
    assert load(CLOSED).model_dump() == CLOSED
    assert load({"mode": "closed", "concurrency": 2}).model_dump() == {
        "mode": "closed",
        "concurrency": 2,
    }
    assert load(OPEN).model_dump() == OPEN
    assert load(REPLAY).model_dump() == {**REPLAY, "time_scale": 1.0}


def test_the_files_slo_section_is_one_type_named_for_what_it_holds() -> None:
    assert not hasattr(models, "Slo")  # the sweep's bound is the one `Slo`
    config = ResolvedConfig.model_validate(
        {
            "target": {"kind": "builtin", "name": "synthetic"},
            "knobs": {},
            "workload": {"load": {"mode": "closed", "concurrency": 1}},
            "slo": {"p99_ms": 20},
        }
    )
    assert isinstance(config.slo, SloLimits)
    assert config.model_dump()["slo"] == {
        "p50_ms": None,
        "p95_ms": None,
        "p99_ms": 20.0,
        "p999_ms": None,
        "min_qps": None,
        "max_accuracy_drop_pts": 1.0,
    }
