"""The load generator driven as the runner drives it, for the tests of tests/integration/
test_load.py and their real-time figures in tests/timing/test_load_timing.py: loads by name,
a measurement of N seconds, its summaries, and the open loop's two ways of waking."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from optlab.config.models import ClosedLoad, OpenLoad, ReplayLoad
from optlab.load.base import StopReport
from optlab.load.generator import ThreadLoadGenerator
from optlab.load.timerfd import Alarm
from optlab.metrics.log import Collector
from tests.support.capabilities import lacks

Load = ClosedLoad | OpenLoad | ReplayLoad


def closed(concurrency: int) -> ClosedLoad:
    return ClosedLoad(mode="closed", concurrency=concurrency)


def open_(rate: float, arrival: str = "constant", **extra: Any) -> OpenLoad:
    return OpenLoad.model_validate({"mode": "open", "rate": rate, "arrival": arrival, **extra})


def measure(
    call: Callable[[Any], Any],
    load: Load,
    seconds: float,
    *,
    timeout_s: float = 10.0,
    requests: Sequence[Any] = tuple(range(64)),
    trace_dir: Path | None = None,
    drain_s: float = 5.0,
) -> tuple[StopReport, Collector, ThreadLoadGenerator]:
    collector = Collector()
    generator = ThreadLoadGenerator(call, requests, load, timeout_s=timeout_s, trace_dir=trace_dir)
    collector.set_phase("measure", time.perf_counter_ns())
    generator.start(collector)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.1)
        collector.drain()  # as the runner does, so buffers stay small
    report = generator.stop(drain_timeout_s=drain_s)
    collector.finish()
    return report, collector, generator


def load_threads() -> set[threading.Thread]:
    """The load generators' threads alive now (a test waits for its own to finish)."""
    return {t for t in threading.enumerate() if t.name.startswith("optlab-load-")}


def summary(collector: Collector, series: str = "total") -> dict[str, Any]:
    return collector.histograms("measure")[series].summary_ms()


@pytest.fixture(params=["alarm", "polling"])
def deputy_wake(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The open loop's deputy sleeps on a timerfd alarm on Linux and polls elsewhere: both."""
    if request.param == "polling":
        monkeypatch.setattr(Alarm, "open", classmethod(lambda cls: None))
    else:
        alarm = Alarm.open()
        if alarm is None:
            lacks("no timerfd here")
        alarm.close()
    return str(request.param)
