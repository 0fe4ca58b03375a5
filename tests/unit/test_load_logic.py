"""Load schedules and traces (optlab.config.modes): constant and Poisson offsets, trace files
read and looped, and what the generator refuses before it starts a thread (nothing is sent)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from optlab.config.models import ClosedLoad, ReplayLoad
from optlab.config.modes.open import constant_offsets, poisson_offsets
from optlab.config.modes.replay import read_trace, replay_offsets
from optlab.errors import ConfigError
from optlab.load.aio import AsyncLoadGenerator
from optlab.load.generator import ThreadLoadGenerator
from optlab.metrics.log import Collector


def test_constant_offsets_are_exactly_spaced() -> None:
    offsets = list(itertools.islice(constant_offsets(200.0), 1000))
    assert offsets[:3] == [0, 5_000_000, 10_000_000]
    assert set(np.diff(offsets).tolist()) == {5_000_000}
    # Computed from the index, not accumulated: an awkward rate does not drift.
    third = list(itertools.islice(constant_offsets(3.0), 3001))
    assert third[-1] == 1_000_000_000_000


def test_poisson_offsets_have_the_rate_and_are_reproducible() -> None:
    offsets = list(itertools.islice(poisson_offsets(1000.0, seed=7), 20_000))
    rate = len(offsets) / (offsets[-1] / 1e9)
    assert rate == pytest.approx(1000.0, rel=0.05)
    gaps = np.diff(offsets)
    assert (gaps >= 0).all()
    # Exponential gaps: the standard deviation equals the mean.
    assert gaps.std() == pytest.approx(gaps.mean(), rel=0.1)
    again = list(itertools.islice(poisson_offsets(1000.0, seed=7), 20_000))
    other = list(itertools.islice(poisson_offsets(1000.0, seed=8), 20_000))
    assert offsets == again
    assert offsets != other


@pytest.mark.parametrize("make", [constant_offsets, lambda rate: poisson_offsets(rate, 0)])
def test_schedules_refuse_a_rate_that_is_not_positive(make: Callable[[float], Any]) -> None:
    with pytest.raises(ValueError):
        next(make(0.0))


def test_read_trace_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(
        '{"t": 0, "id": "3"}\n\n{"offset_s": 0.5, "request_id": 7}\n{"t": 1.25}\n',
        encoding="utf-8",
    )
    assert read_trace(path) == [(0, "3"), (500_000_000, "7"), (1_250_000_000, None)]
    assert read_trace(path, time_scale=2.0)[-1] == (2_500_000_000, None)


def test_read_trace_csv(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("t,id\n0.0,1\n0.002,\n0.004,x\n", encoding="utf-8")
    assert read_trace(path) == [(0, "1"), (2_000_000, None), (4_000_000, "x")]
    bare = tmp_path / "bare.csv"
    bare.write_text("offset_s\n0.1\n0.2\n", encoding="utf-8")
    assert read_trace(bare, time_scale=0.5) == [(50_000_000, None), (100_000_000, None)]


def test_read_trace_sorts_out_of_order_offsets_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text('{"t": 0.2, "id": 1}\n{"t": 0.1, "id": 2}\n{"t": 0.3, "id": 3}\n')
    with pytest.warns(UserWarning, match=r"trace.jsonl:2: offsets are not in order"):
        entries = read_trace(path)
    assert entries == [(100_000_000, "2"), (200_000_000, "1"), (300_000_000, "3")]


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("bad.jsonl", '{"t": 0}\n{"t": 0.1\n', "bad.jsonl:2: not JSON"),
        ("neg.jsonl", '{"t": 0}\n\n{"t": -1}\n', "neg.jsonl:3: offset -1"),
        ("nokey.jsonl", '{"t": 0}\n{"id": 4}\n', "nokey.jsonl:2: no 't' or 'offset_s'"),
        ("text.jsonl", '{"t": "soon"}\n', "text.jsonl:1: offset 'soon' is not a number"),
        ("list.jsonl", "[0, 1]\n", "list.jsonl:1: expected a JSON object"),
        ("nan.jsonl", '{"t": NaN}\n', "nan.jsonl:1: offset nan"),
        ("bad.csv", "t,id\n0,1\nsoon,2\n", "bad.csv:3: offset 'soon' is not a number"),
        ("short.csv", "t,id\n0,1\n0.1\n", "short.csv:3: 1 fields where the header has 2"),
        ("nocol.csv", "time,id\n0,1\n", "nocol.csv:1: the CSV header"),
        ("empty.csv", "", "empty.csv is empty"),
        ("header.csv", "t\n", "header.csv has no requests"),
    ],
)
def test_read_trace_errors_name_the_file_and_line(
    tmp_path: Path, name: str, text: str, where: str
) -> None:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        read_trace(path)
    assert where in info.value.message
    assert info.value.hint


def test_read_trace_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="trace file .*missing.jsonl not found"):
        read_trace(tmp_path / "missing.jsonl")


def test_replay_offsets_loop_with_the_trace_period() -> None:
    entries = [(0, "a"), (10, "b"), (20, None)]
    looped = list(itertools.islice(replay_offsets(entries), 7))
    # Period = last offset + mean gap = 30: the next pass starts one gap after the last entry.
    assert looped == [(0, "a"), (10, "b"), (20, None), (30, "a"), (40, "b"), (50, None), (60, "a")]
    single = list(itertools.islice(replay_offsets([(5, None)]), 2))
    assert single == [(5, None), (1_000_000_005, None)]


def test_replay_refuses_ids_that_are_not_integers(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text("t,id\n0,cat\n", encoding="utf-8")
    load = ReplayLoad(mode="replay", trace="trace.csv", time_scale=1.0)
    with pytest.raises(ConfigError, match="'cat' is not an integer"):
        ThreadLoadGenerator(print, [1], load, timeout_s=1.0, trace_dir=tmp_path)
    missing = ReplayLoad(mode="replay", trace="nope.csv", time_scale=1.0)
    with pytest.raises(ConfigError, match="not found"):
        ThreadLoadGenerator(print, [1], missing, timeout_s=1.0, trace_dir=tmp_path)


def test_the_generator_refuses_no_requests() -> None:
    with pytest.raises(ConfigError, match="no requests"):
        ThreadLoadGenerator(print, [], ClosedLoad(mode="closed", concurrency=1), timeout_s=1.0)


def _async_generator() -> AsyncLoadGenerator:
    async def client(index: int) -> None:  # never called: the generator is never started
        raise AssertionError(index)

    return AsyncLoadGenerator(
        client,  # type: ignore[arg-type]
        4,
        ClosedLoad(mode="closed", concurrency=1),
        classify=lambda exc: ("error", repr(exc)),
        timeout_s=1.0,
    )


@pytest.mark.parametrize("kind", ["threads", "event loop"])
def test_a_generator_stopped_before_it_started_reports_nothing_sent(kind: str) -> None:
    # A Ctrl-C after the run built its generator and before it started it: the run's cleanup
    # stops the generator, and that stop must report an empty load, not raise over the
    # interrupt (a tune stopped there exited 1 with "stop() before start()", not 130).
    generator: ThreadLoadGenerator | AsyncLoadGenerator
    if kind == "threads":
        generator = ThreadLoadGenerator(
            print, [1], ClosedLoad(mode="closed", concurrency=2), timeout_s=1.0
        )
    else:
        generator = _async_generator()
    report = generator.stop(drain_timeout_s=0.1)
    assert (report.issued, report.completed, report.abandoned) == (0, 0, 0)
    assert report.failure is None and not report.fell_behind
    assert generator.stop() is report
    # Stopped, it stays stopped: a late start() would send load nobody measures.
    with pytest.raises(RuntimeError, match="before its stop"):
        generator.start(Collector())
