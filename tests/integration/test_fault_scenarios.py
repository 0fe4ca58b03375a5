"""The labelled fault targets of optlab.reference.faults: each builds and serves, records its
stages, and a short run of a few shows its fault in the stored figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from optlab.metrics.stages import CURRENT, RequestTiming
from optlab.reference.fault_scenarios import SCENARIOS, Scenario, by_name
from optlab.run.runner import RunOptions, run
from optlab.store import RunSummary, Store

# Smaller than the benchmark's, so that one call each stays quick.
SMALL: dict[str, dict[str, Any]] = {
    "cpu-preprocess": {"elements": 10_000},
    "gil": {"iterations": 1_000},
    "periodic-stall": {"stall_every_s": 0.05, "stall_ms": 10.0},
    "gc-churn": {"heap": 1_000, "cycles": 100},
    "pool-of-one": {"batch": 8},
}


class _Quiet:
    def update(self, status: Any) -> None:
        return None

    def note(self, text: str) -> None:
        return None


def _serve(scenario: Scenario) -> tuple[Any, dict[str, int]]:
    from optlab.reference import faults

    knobs = {**scenario.config(1)["knobs"], **SMALL.get(scenario.name, {})}
    target = getattr(faults, scenario.factory)(knobs)
    timing = RequestTiming()
    token = CURRENT.set(timing)
    try:
        for request in range(3):
            target(request)
    finally:
        CURRENT.reset(token)
        target.close()
    return target, timing.stages or {}


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_each_factory_serves_and_records_its_stages(scenario: Scenario) -> None:
    target, stages = _serve(scenario)
    assert stages, "no stage recorded"
    if scenario.label is not None and scenario.label[0] is not None:
        assert scenario.label[0] in stages  # the labelled stage is one the target records
    assert "total" not in stages
    assert isinstance(target.metrics(), dict)


def _measure(tmp_path: Path, name: str, seed: int = 0, duration_s: float = 2.0) -> RunSummary:
    config = by_name(name)[0].config(seed)
    path = tmp_path / f"{config['name']}.yaml"
    path.write_text(yaml.safe_dump(config))
    store = Store.open(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        outcome = run(
            path, store, RunOptions(quick=True, duration_s=duration_s, warmup_s=0.3), _Quiet()
        )
    finally:
        store.close()
    assert outcome[-1].status == "FINISHED"
    return outcome[-1].summary


def test_lock_throughput_is_one_over_the_hold_time(tmp_path: Path) -> None:
    hold_ms = by_name("lock")[0].config(0)["knobs"]["hold_ms"]
    summary = _measure(tmp_path, "lock")
    assert summary.qps is not None
    # Serialised on the lock: at most ~1000 / hold_ms per second, whatever the 8 clients
    # (timer overshoot, the harness and a busy machine only slow it: how near it comes is
    # tests/timing/test_fault_scenarios_timing.py's).
    assert summary.qps < 1.05 * 1000 / hold_ms
    # The 8 clients wait their turn: the mean holds ~8 holds (Little's law), whatever order
    # the lock hands itself out in (an unfair hand-off leaves the median near one hold).
    assert summary.total.mean is not None and summary.total.mean > 4 * hold_ms
    # A finished run with a measured phase always has its process's usage: the CPU is idle
    # meanwhile (optlab's own process; a neighbour's CPU is not counted in it).
    evidence = summary.evidence
    assert evidence is not None and evidence.process is not None
    assert (evidence.process.cpu_user_pct or 0) + (evidence.process.cpu_system_pct or 0) < 60


def test_leak_grows_the_resident_size(tmp_path: Path) -> None:
    # 4 s: enough resource readings for a memory trend (MEMORY_LEAST_SAMPLES of
    # src/optlab/run/evidence.py), which a 2 s run may fall short of.
    summary = _measure(tmp_path, "memory-leak", duration_s=4.0)
    rss = summary.resources.rss_bytes
    assert rss is not None and summary.requests
    # 50-200 KiB kept per request: the peak is at least the measured requests' worth above
    # the mean (the mean is halfway up a straight line), with room for noise.
    assert summary.resources.rss_peak_bytes is not None
    assert summary.resources.rss_peak_bytes - rss.mean > summary.requests * 50 * 1024 / 4
    evidence = summary.evidence
    assert evidence is not None and evidence.memory is not None, evidence
    assert evidence.memory.mib_per_1k_requests > 40  # ~122 MiB per 1,000 requests


def test_under_batching_waits_out_its_timeout(tmp_path: Path) -> None:
    wait_ms = by_name("under-batching")[0].config(0)["knobs"]["batching"]["max_wait_ms"]
    summary = _measure(tmp_path, "under-batching")
    batching = summary.target_figure("batching", "mean_batch_size")
    assert batching is not None and batching <= 2.5  # of 32
    queue = summary.stages["queue"]
    # Every request waits out the timeout at least (how little more: the timing lane's).
    assert queue.p50 is not None and queue.p50 > wait_ms * 0.9
