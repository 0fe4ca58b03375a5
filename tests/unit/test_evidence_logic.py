"""The evidence section's pure parts (docs/run-json.md "evidence"): least squares against numpy
and scipy, requests served by a given time, GC pause figures, the pause recorder's callback, and
which RSS series a memory trend follows, on constructed readings (no run, no process)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from scipy import stats

from optlab.metrics.gcpause import P99_LEAST_PAUSES, GcPauses, pause_figures
from optlab.metrics.resources import ResourceReading
from optlab.metrics.trend import least_squares, served_by
from optlab.metrics.windows import Window
from optlab.run.evidence import MEMORY_LEAST_SAMPLES, Observed, memory_trend


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_least_squares_agrees_with_numpy_and_scipy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    xs = np.sort(rng.uniform(0, 50, 12))
    ys = 3.0 + 0.8 * xs + rng.normal(0, 2.0, 12)
    fit = least_squares(list(xs), list(ys))
    assert fit is not None
    slope, intercept = np.polyfit(xs, ys, 1)
    reference = stats.linregress(xs, ys)
    assert fit.slope == pytest.approx(slope, rel=1e-9)
    assert fit.intercept == pytest.approx(intercept, rel=1e-9)
    assert fit.r2 == pytest.approx(reference.rvalue**2, rel=1e-9)


def test_least_squares_edges() -> None:
    assert least_squares([1.0], [2.0]) is None  # one point
    assert least_squares([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) is None  # no spread in x
    flat = least_squares([1.0, 2.0, 3.0], [5.0, 5.0, 5.0])
    # scipy's r is NaN here (0/0); a flat series has no trend to explain: R² 0, never NaN.
    assert flat is not None and flat.slope == 0 and flat.r2 == 0
    with pytest.raises(ValueError):
        least_squares([1.0, 2.0], [1.0])


def test_served_by_spreads_each_window_evenly() -> None:
    windows = [(0.0, 1.0, 100), (1.0, 1.0, 300), (2.0, 0.5, 50)]
    assert served_by([0.0, 0.5, 1.0, 1.5, 2.25, 9.0], windows) == [0, 50, 100, 250, 425, 450]


def test_pause_figures_against_numpy() -> None:
    pauses = [int(x) for x in np.random.default_rng(3).integers(10_000, 900_000, 250)]
    figures = pause_figures(pauses, wall_s=2.0)
    assert figures is not None and figures.collections == 250
    ms = np.asarray(pauses) / 1e6
    assert figures.total_ms == pytest.approx(ms.sum())
    assert figures.max_ms == pytest.approx(ms.max())
    assert figures.p99_ms == pytest.approx(np.percentile(ms, 99))
    assert figures.share_pct == pytest.approx(100 * ms.sum() / 1000 / 2.0)
    few = pause_figures(pauses[: P99_LEAST_PAUSES - 1], wall_s=2.0)
    assert few is not None and few.p99_ms is None  # too few pauses for a P99
    none = pause_figures([], wall_s=1.0)
    assert none is not None and none.collections == 0 and none.total_ms == 0
    assert pause_figures(pauses, wall_s=0) is None  # no span: unknown, not 0


def test_gc_pauses_are_timed_only_inside_and_the_callback_always_goes() -> None:
    pauses = GcPauses()
    gc.collect(0)
    with pytest.raises(KeyboardInterrupt), pauses.recording():
        before = len(gc.callbacks)
        gc.collect(0)  # the youngest generation: a pause all the same, without the
        gc.collect(0)  # seconds a full collection of the session's heap can take
        assert len(gc.callbacks) == before
        raise KeyboardInterrupt
    assert all(cb != pauses._callback for cb in gc.callbacks)
    gc.collect(0)  # outside: not timed
    timed = pauses.pauses_ns()
    assert len(timed) == 2 and all(ns > 0 for ns in timed)


def _reading(t_s: float, own: int, service: int | None) -> ResourceReading:
    return ResourceReading(
        t_s=t_s,
        phase="measure",
        cpu_process_pct=None,
        cpu_system_pct=None,
        cpu_per_core=None,
        rss_bytes=own,
        mem_used_bytes=None,
        mem_total_bytes=None,
        iowait_pct=None,
        gpus=None,
        service_rss_bytes=service,
    )


def _observed(started_service: bool, seconds: int) -> Observed:
    windows = [Window("measure", t, 100, 0, 100.0, 1.0, 2.0, None) for t in range(seconds)]
    return Observed(started_service=started_service, windows=windows, measure_start_s=10.0)


@pytest.mark.parametrize(
    ("started_service", "series", "slope"),
    [(True, "service_rss_bytes", 10.0), (False, "rss_bytes", 0.0)],
)
def test_a_memory_trend_follows_the_services_rss_when_it_has_one(
    started_service: bool, series: str, slope: float
) -> None:
    # optlab's own RSS flat, the service's climbing 1 MiB a second (100 requests a second):
    # 10 MiB per 1,000 requests when the service's series is followed, 0 for optlab's.
    mib = 2**20
    readings = [_reading(10.0 + t, 50 * mib, (60 + t) * mib) for t in range(6)]
    trend = memory_trend(_observed(started_service, 6), readings)
    assert trend is not None and trend.samples == 6
    assert trend.series == series and trend.mib_per_1k_requests == slope


def test_too_few_samples_give_no_memory_trend() -> None:
    mib = 2**20
    readings = [_reading(10.0 + t, 50 * mib, 60 * mib) for t in range(MEMORY_LEAST_SAMPLES - 1)]
    assert memory_trend(_observed(True, 6), readings) is None
