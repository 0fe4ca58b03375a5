"""The background resource sampler, against the real host (and the real GPU when there is one)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable

import psutil
import pytest

from optlab.metrics.resources import ResourceReading, ResourceSampler
from tests.support.proc import run_python, start_python
from tests.support.waits import wait_until

INTERVAL = 0.1


def _run_sampler(seconds: float, **kwargs: object) -> tuple[ResourceSampler, list[ResourceReading]]:
    sampler = ResourceSampler(interval_s=INTERVAL, **kwargs)  # type: ignore[arg-type]
    sampler.start()
    try:
        time.sleep(seconds)
    finally:
        sampler.stop()
    return sampler, sampler.take()


def _take_until(
    sampler: ResourceSampler,
    into: list[ResourceReading],
    done: Callable[[list[ResourceReading]], bool],
    what: str,
) -> None:
    """Take readings into `into` until `done(into)`: waits on the readings themselves."""

    def taken() -> bool:
        into.extend(sampler.take())
        return done(into)

    wait_until(taken, what)


def test_start_stop_and_plausible_readings() -> None:
    began = time.perf_counter()
    sampler = ResourceSampler(interval_s=INTERVAL)
    sampler.start()
    readings: list[ResourceReading] = []
    try:
        _take_until(sampler, readings, lambda rs: len(rs) >= 4, "four readings")
    finally:
        sampler.stop()
    readings += sampler.take()
    elapsed = time.perf_counter() - began
    # One reading an interval (never a burst to catch up) plus the last one at stop(): bounded
    # by the time the sampler really ran, however long a busy machine made that.
    assert 4 <= len(readings) <= elapsed / INTERVAL + 2
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
    first: list[ResourceReading] = []
    second: list[ResourceReading] = []
    try:
        _take_until(sampler, first, bool, "a first reading")
        sampler.set_phase("measure")
        _take_until(
            sampler, second, lambda rs: any(r.phase == "measure" for r in rs), "a measure reading"
        )
    finally:
        sampler.stop()
    second += sampler.take()
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


def _mean_cpu(readings: list[ResourceReading]) -> float:
    values = [r.cpu_process_pct for r in readings if r.cpu_process_pct is not None]
    assert values
    return sum(values) / len(values)


def _sampled_and_used(
    seconds: float, used: Callable[[], float], **kwargs: object
) -> tuple[list[ResourceReading], float]:
    """The sampler's readings over `seconds`, and the CPU `used()` says was spent meanwhile,
    in percent of one core: on a busy machine a spinning thread gets what the scheduler
    gives it, so the readings are judged against what was really used, not a fixed share."""
    wall, cpu = time.perf_counter(), used()
    _, readings = _run_sampler(seconds, **kwargs)
    return readings, 100.0 * (used() - cpu) / (time.perf_counter() - wall)


def test_busy_thread_raises_process_cpu_above_idle() -> None:
    idle, idle_used = _sampled_and_used(0.45, time.process_time, children=False)
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    try:
        busy, busy_used = _sampled_and_used(0.45, time.process_time, children=False)
    finally:
        stop.set()
        thread.join()
    assert busy_used > idle_used + 10.0  # the thread did spin, whatever share it got
    # What the sampler reports is what the process used (the kernel counts CPU in 10 ms
    # ticks: 0.1 s readings are coarse, their mean is not).
    assert _mean_cpu(busy) == pytest.approx(busy_used, abs=15.0)
    assert _mean_cpu(idle) == pytest.approx(idle_used, abs=15.0)
    assert _mean_cpu(busy) > _mean_cpu(idle) + 5.0


def test_children_cpu_and_rss_are_included() -> None:
    code = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"
    child = start_python(code)
    spinner = psutil.Process(child.pid)

    def child_cpu() -> float:
        times = spinner.cpu_times()
        return float(times.user + times.system)

    try:
        with_children, child_used = _sampled_and_used(0.45, child_cpu, children=True)
        without, _ = _sampled_and_used(0.45, child_cpu, children=False)
    finally:
        child.kill()
        child.wait()
    assert child_used > 10.0  # the child did spin while the sampler watched
    # With children, the readings count the child's CPU on top of this process's own.
    assert _mean_cpu(with_children) - _mean_cpu(without) == pytest.approx(child_used, abs=20.0)
    assert (with_children[-1].rss_bytes or 0) > (without[-1].rss_bytes or 0)


def test_other_pid_and_vanished_process() -> None:
    # The child lives until the test closes its stdin: alive for the first reading, gone
    # for the last, however the machine schedules either.
    code = "import sys; sys.stdin.read()"
    child = start_python(code, stdin=subprocess.PIPE)
    readings: list[ResourceReading] = []
    try:
        sampler = ResourceSampler(interval_s=INTERVAL, pid=child.pid, children=False)
        sampler.start()
        _take_until(sampler, readings, bool, "a reading of the child")
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)
        _take_until(
            sampler, readings, lambda rs: rs[-1].rss_bytes is None, "a reading after the exit"
        )
        sampler.stop()
    finally:
        child.kill()
        child.wait()
    readings += sampler.take()
    assert readings[0].rss_bytes is not None and readings[0].rss_bytes > 0
    # After the process is gone its figures are missing, never invented; host figures remain.
    assert readings[-1].rss_bytes is None and readings[-1].cpu_process_pct is None
    assert readings[-1].cpu_per_core is not None
    assert os.getpid() != child.pid


def test_phase_snapshots_give_the_measured_span_usage_and_rss_marks() -> None:
    # A 60 s interval: no regular sample comes in the test, so the snapshots are the wake-ups
    # set_phase asks for, not a side effect of sampling.
    sampler = ResourceSampler(interval_s=60.0)
    sampler.start()
    stop = threading.Event()

    def spin() -> None:
        while not stop.is_set():
            sum(range(1000))

    thread = threading.Thread(target=spin, name="resources-spinner", daemon=True)
    try:
        sampler.set_phase("measure")
        wait_until(lambda: sampler.tree_rss(), "the measure snapshot, taken at once")
        thread.start()
        # Long enough that the GIL hand-overs inside a snapshot's reads (5 ms each while the
        # spinner holds it) are a small part of the span.
        time.sleep(1.5)
        sampler.set_phase("drain")  # read on this thread, while the spinner still runs
    finally:
        stop.set()
        thread.join()
        sampler.stop()
    usage = sampler.usage("process")
    assert usage is not None
    assert usage.threads and usage.threads[0][0] == "resources-spinner"
    assert usage.threads[0][1] > 10.0  # it spun for most of the span, whatever share it got
    assert usage.cpu_user_pct + usage.cpu_system_pct >= usage.threads[0][1] * 0.9
    assert sampler.usage("service") is None  # no service tracked: unknown, not zero
    marks = sampler.tree_rss()
    assert len(marks) == 2 and marks[0][0] < marks[1][0]
    assert all(own is not None and own > 0 and service is None for _, own, service in marks)


# In a fresh interpreter, whose only child is the watch: a child another test left behind in
# this process would move this tree's memory too.
WATCHED = """\
import json, time
import psutil
from optlab.metrics import resources
from optlab.metrics.resources import ResourceSampler

resources.CHILDREN_REFRESH_S = 0.0  # children looked for at every sample, not every 5 s
sampler = ResourceSampler(interval_s=0.1)
sampler.start()
sampler.set_phase("measure")
deadline = time.monotonic() + 60
while not (sampler.tree_rss() and psutil.Process().children()) and time.monotonic() < deadline:
    time.sleep(0.02)
watch = psutil.Process().children()[0]
taken = []
while len(taken) < 3 and time.monotonic() < deadline:
    taken += sampler.take()
    time.sleep(0.05)
found = {
    "watch": watch.name(),
    "watch_rss": watch.memory_info().rss,
    "own_rss": psutil.Process().memory_info().rss,
    "sampled": taken[-1].rss_bytes,
}
sampler.set_phase("drain")
sampler.stop()
found["marks"] = [own for _, own, _ in sampler.tree_rss()]
print(json.dumps(found))
"""


def test_the_process_watch_is_no_part_of_the_runs_memory() -> None:
    # The watch (a child started with the measured phase to name short-lived neighbours) is a
    # measuring tool: its ~15-20 MiB must not read as memory the run grew by, or every short
    # healthy run looked like a leak once the children were next looked for (docs/diagnose.md,
    # memory-leak).
    done = run_python(WATCHED)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    watch_rss = found["watch_rss"]
    assert found["watch"] == "optlab-watch" and watch_rss > 5 * 2**20, found  # it would show
    first, last = found["marks"]
    assert last - first < watch_rss / 2, found
    assert abs(found["sampled"] - found["own_rss"]) < watch_rss / 2, found


def test_usage_is_unknown_without_the_measured_phase() -> None:
    sampler = ResourceSampler(interval_s=INTERVAL)
    sampler.start()
    sampler.set_phase("warmup")
    sampler.stop()
    assert sampler.usage("process") is None and sampler.tree_rss() == []


def test_a_tracked_service_has_its_own_usage() -> None:
    code = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"
    child = start_python(code)
    sampler = ResourceSampler(interval_s=60.0)
    try:
        sampler.track_service(child.pid)
        sampler.start()
        sampler.set_phase("measure")
        wait_until(lambda: sampler.tree_rss(), "the measure snapshot")
        spent = psutil.Process(child.pid).cpu_times
        began = sum(spent()[:2])
        # The child's CPU inside the span, however long a busy machine takes to give it.
        wait_until(lambda: sum(spent()[:2]) - began >= 0.3, "0.3 s of the child's CPU", 120)
        sampler.set_phase("drain")
        sampler.stop()
    finally:
        child.kill()
        child.wait()
    service, own = sampler.usage("service"), sampler.usage("process")
    assert service is not None and own is not None
    assert service.cpu_user_pct + service.cpu_system_pct > 0  # the child spun
    assert service.threads and service.threads[0][1] > 0
    # optlab's own figures leave the service out: this process mostly slept.
    assert own.cpu_user_pct + own.cpu_system_pct < service.cpu_user_pct + service.cpu_system_pct
    assert all(svc is not None and svc > 0 for _, _, svc in sampler.tree_rss())
