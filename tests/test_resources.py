"""The background resource sampler, against the real host (and the real GPU when there is one)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import psutil
import pynvml
import pytest

from optlab.metrics.gpu import THERMAL_REASONS, decode_throttle_reasons
from optlab.metrics.resources import ResourceReading, ResourceSampler

INTERVAL = 0.1


def _run_sampler(seconds: float, **kwargs: object) -> tuple[ResourceSampler, list[ResourceReading]]:
    sampler = ResourceSampler(interval_s=INTERVAL, **kwargs)  # type: ignore[arg-type]
    sampler.start()
    try:
        time.sleep(seconds)
    finally:
        sampler.stop()
    return sampler, sampler.take()


def test_start_stop_and_plausible_readings() -> None:
    sampler, readings = _run_sampler(0.55)
    assert 4 <= len(readings) <= 8
    cores = psutil.cpu_count()
    memory = psutil.virtual_memory().total
    previous_t = 0.0
    for reading in readings:
        assert reading.phase == "setup"
        assert reading.t_s > previous_t
        previous_t = reading.t_s
        assert reading.cpu_per_core is not None and len(reading.cpu_per_core) == cores
        assert all(0.0 <= pct <= 100.0 for pct in reading.cpu_per_core)
        assert reading.cpu_system_pct is not None and 0.0 <= reading.cpu_system_pct <= 100.0
        assert reading.iowait_pct is not None and 0.0 <= reading.iowait_pct <= 100.0
        assert reading.cpu_process_pct is not None and reading.cpu_process_pct >= 0.0
        assert reading.rss_bytes is not None and reading.rss_bytes > 10 * 2**20
        assert reading.mem_total_bytes == memory
        assert reading.mem_used_bytes is not None and 0 < reading.mem_used_bytes < memory
    peak = sampler.peak_rss_bytes()
    assert peak is not None and peak == max(r.rss_bytes or 0 for r in readings)
    # The thread is gone and nothing more arrives.
    assert not any(t.name == "optlab-resources" for t in threading.enumerate())
    time.sleep(2 * INTERVAL)
    assert sampler.take() == []


def test_take_returns_each_reading_once_and_phase_is_stamped() -> None:
    sampler = ResourceSampler(interval_s=INTERVAL)
    sampler.start()
    try:
        time.sleep(0.25)
        sampler.set_phase("measure")
        first = sampler.take()
        time.sleep(0.35)
    finally:
        sampler.stop()
    second = sampler.take()
    assert first and second
    assert max(r.t_s for r in first) < min(r.t_s for r in second)
    assert {r.phase for r in first} == {"setup"}
    assert second[-1].phase == "measure"


def test_gpu_fields_are_real_or_absent() -> None:
    sampler, readings = _run_sampler(0.25)
    if not sampler.gpu_available:
        assert all(r.gpus is None for r in readings)
        assert not sampler.thermal_throttling_seen()
        return
    for reading in readings:
        assert reading.gpus is not None and len(reading.gpus) >= 1
        for gpu in reading.gpus:
            if gpu.mem_total_bytes is not None:
                assert gpu.mem_used_bytes is not None
                assert 0 <= gpu.mem_used_bytes <= gpu.mem_total_bytes
            if gpu.util_pct is not None:
                assert 0.0 <= gpu.util_pct <= 100.0
            if gpu.temperature_c is not None:
                assert 0.0 < gpu.temperature_c < 130.0
            if gpu.power_w is not None:
                assert 0.0 < gpu.power_w < 2000.0
            if gpu.sm_clock_mhz is not None:
                assert 0.0 <= gpu.sm_clock_mhz < 10_000.0
            assert gpu.throttle_reasons is None or all(
                isinstance(name, str) for name in gpu.throttle_reasons
            )


def test_busy_thread_raises_process_cpu_above_idle() -> None:
    _, idle = _run_sampler(0.45)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        _, busy = _run_sampler(0.45)
    finally:
        stop.set()
        thread.join()
    idle_pct = max(r.cpu_process_pct or 0.0 for r in idle[1:] or idle)
    busy_pct = sorted(r.cpu_process_pct or 0.0 for r in busy)[len(busy) // 2]
    # Loose bounds: other work on a shared CI host can take part of the spinning core.
    assert busy_pct > 40.0
    assert busy_pct > idle_pct + 25.0


def test_children_cpu_and_rss_are_included() -> None:
    code = "import time\nend = time.time() + 3\nwhile time.time() < end: pass\n"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        time.sleep(0.1)
        _, with_children = _run_sampler(0.45, children=True)
        _, without = _run_sampler(0.45, children=False)
    finally:
        child.kill()
        child.wait()
    with_pct = sorted(r.cpu_process_pct or 0.0 for r in with_children)[len(with_children) // 2]
    without_pct = sorted(r.cpu_process_pct or 0.0 for r in without)[len(without) // 2]
    assert with_pct > without_pct + 25.0
    assert (with_children[-1].rss_bytes or 0) > (without[-1].rss_bytes or 0)


def test_other_pid_and_vanished_process() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    try:
        sampler = ResourceSampler(interval_s=INTERVAL, pid=child.pid, children=False)
        sampler.start()
        time.sleep(0.2)
        child.wait()
        time.sleep(0.3)
        sampler.stop()
    finally:
        child.kill()
        child.wait()
    readings = sampler.take()
    assert readings[0].rss_bytes is not None and readings[0].rss_bytes > 0
    # After the process is gone its figures are missing, never invented; host figures remain.
    assert readings[-1].rss_bytes is None and readings[-1].cpu_process_pct is None
    assert readings[-1].cpu_per_core is not None
    assert os.getpid() != child.pid


def test_decode_throttle_reasons_uses_nvml_bits() -> None:
    thermal = pynvml.nvmlClocksThrottleReasonHwThermalSlowdown
    idle = pynvml.nvmlClocksThrottleReasonGpuIdle
    assert decode_throttle_reasons(0) == []
    assert decode_throttle_reasons(thermal) == ["hw_thermal_slowdown"]
    names = decode_throttle_reasons(thermal | idle | pynvml.nvmlClocksThrottleReasonSwPowerCap)
    assert set(names) == {"hw_thermal_slowdown", "gpu_idle", "sw_power_cap"}
    assert decode_throttle_reasons(1 << 62) == ["unknown_0x4000000000000000"]
    assert set(decode_throttle_reasons(pynvml.nvmlClocksThrottleReasonAll)) >= THERMAL_REASONS


def test_invalid_interval_is_rejected() -> None:
    with pytest.raises(ValueError):
        ResourceSampler(interval_s=0)
