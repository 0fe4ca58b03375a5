"""The evidence section of a run's summary (docs/run-json.md "evidence"): real runs through the
library on python targets made to leak, sleep, spin and make cyclic garbage, the reference
classifier batching, a command target's service; and the pure parts against numpy and scipy."""

from __future__ import annotations

import bisect
import gc
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from click.testing import Result

from optlab.metrics.gcpause import GcPauses
from optlab.metrics.usage import snapshot_tree, usage_between
from optlab.store import RunEvidence, RunSummary
from tests.support.files import write
from tests.support.httpsvc import command_experiment, summary_of
from tests.support.inprocess import BATCHED, run_file
from tests.support.proc import free_port

Invoke = Callable[..., Result]
LEAK_BYTES = 10 * 1024  # per request: 10 MiB per 1,000 requests less malloc's rounding
EXPECTED_SLOPE = LEAK_BYTES * 1000 / 2**20  # MiB per 1,000 requests
SPIN_CPU_S = 0.5  # the busy thread's CPU between the two snapshots
TICK_S = 1 / os.sysconf("SC_CLK_TCK")  # the resolution of /proc's CPU times

# One request: keep `leak_bytes` (written, so resident), make `cycles` self-referencing lists
# (garbage only the collector frees), then spin `busy_ms` or sleep `sleep_ms`.
TARGET = """\
import time

class Target:
    def __init__(self, knobs):
        self.knobs = knobs
        self.kept = []

    def __call__(self, request):
        k = self.knobs
        if k["leak_bytes"]:
            self.kept.append(b"\\x01" * k["leak_bytes"])
        for _ in range(k["cycles"]):
            cycle = []
            cycle.append(cycle)
        if k["sleep_ms"]:
            time.sleep(k["sleep_ms"] / 1000)
        end = time.perf_counter() + k["busy_ms"] / 1000
        while time.perf_counter() < end:
            pass
        return request

    def close(self):
        self.kept.clear()

def build(knobs):
    return Target(knobs)
"""


def measured(folder: Path, name: str, knobs: str, load: str, duration_s: float) -> RunSummary:
    """One run of a python target from TARGET, measured through the library (quick protocol)."""
    folder.mkdir(exist_ok=True)
    write(folder, f"{name}_target.py", TARGET)
    path = write(
        folder,
        f"{name}.yaml",
        f"name: {name}\ntarget: {{kind: python, factory: '{name}_target:build'}}\n"
        f"knobs: {knobs}\nworkload: {{load: {load}}}\n",
    )
    return run_file(folder, path, duration_s)


def evidence_of(summary: RunSummary) -> RunEvidence:
    assert summary.evidence is not None
    return summary.evidence


def cpu_pct(evidence: RunEvidence) -> float:
    process = evidence.process
    assert process is not None
    assert process.cpu_user_pct is not None and process.cpu_system_pct is not None
    return process.cpu_user_pct + process.cpu_system_pct


def test_a_leaking_spinning_target_against_a_sleeping_one(tmp_path: Path) -> None:
    # Two load threads asleep 2 ms a request, keeping nothing: measured first, since the
    # leaky run's memory, freed once it ends, shrank a later run's RSS (-3 MiB per 1,000).
    sleeper = measured(
        tmp_path / "sleepy",
        "sleepy",
        "{leak_bytes: 0, cycles: 0, busy_ms: 0, sleep_ms: 2}",
        "{mode: closed, concurrency: 2}",
        4.0,
    )
    sleepy = evidence_of(sleeper)
    # One load thread spinning 0.3 ms a request (then 0.2 ms asleep: a thread that never lets
    # go of the GIL starves optlab's sampler thread of its once-a-second readings), keeping
    # 10 KiB and making cyclic garbage.
    busy = evidence_of(
        measured(
            tmp_path / "busy",
            "leaky",
            f"{{leak_bytes: {LEAK_BYTES}, cycles: 20, busy_ms: 0.3, sleep_ms: 0.2}}",
            "{mode: closed, concurrency: 1}",
            4.0,
        )
    )
    for evidence in (busy, sleepy):
        assert evidence.cores == len(psutil.Process().cpu_affinity() or [])
        assert evidence.service is None and evidence.network is None  # in process
        assert evidence.batching is None and evidence.profile is None
        assert evidence.in_flight_max is not None and evidence.in_flight_mean is not None
        assert evidence.in_flight_mean <= evidence.in_flight_max
    assert busy.in_flight_max == 1 and sleepy.in_flight_max == 2  # the closed loops' clients

    # The leak: RSS climbs with the requests served, along a straight line.
    leak = busy.memory
    assert leak is not None and leak.series == "rss_bytes" and leak.samples >= 5
    assert 0.7 * EXPECTED_SLOPE < leak.mib_per_1k_requests < 1.5 * EXPECTED_SLOPE, leak
    assert leak.r2 > 0.9, leak
    flat = sleepy.memory
    assert flat is not None and abs(flat.mib_per_1k_requests) < 0.1 * EXPECTED_SLOPE, flat

    # The spinner's thread is the busiest one and the process is busy; the sleeper's process
    # mostly waits, switching out voluntarily at every sleep.
    assert busy.process is not None and sleepy.process is not None
    assert busy.process.threads and busy.process.threads[0].name == "optlab-load-0"
    shares = [t.cpu_pct for t in busy.process.threads]
    assert shares == sorted(shares, reverse=True) and min(shares) >= 1.0
    assert cpu_pct(busy) > 2 * cpu_pct(sleepy)
    assert sleepy.process.ctx_voluntary_per_s is not None
    assert busy.process.ctx_voluntary_per_s is not None
    # Every sleep is a voluntary switch: at least one per request served. (The spinner's own
    # count depends on how often other threads ask it for the GIL: not compared.)
    assert sleeper.qps is not None and sleeper.qps > 0
    assert sleepy.process.ctx_voluntary_per_s >= 0.9 * sleeper.qps

    # Cyclic garbage: collections, each a pause.
    collected = busy.gc
    assert collected is not None and collected.collections > 0
    assert 0 < collected.pause_max_ms <= collected.pause_total_ms
    assert 0 < collected.share_pct < 100
    assert sleepy.gc is not None and sleepy.gc.collections < collected.collections
    assert not any(isinstance(getattr(cb, "__self__", None), GcPauses) for cb in gc.callbacks)


def test_a_batching_run_of_the_reference_classifier(tmp_path: Path) -> None:
    folder = tmp_path / "ic"
    folder.mkdir()
    summary = run_file(folder, write(folder, "base.yaml", BATCHED), 2.0)
    batching = evidence_of(summary).batching
    assert batching is not None and batching.max_batch == 8
    reported = summary.target_figure("batching", "mean_batch_size")
    assert batching.mean_batch is not None
    assert batching.mean_batch == pytest.approx(reported, abs=1e-3)
    assert batching.fill_ratio is not None and 0 < batching.fill_ratio <= 1
    assert batching.fill_ratio == pytest.approx(batching.mean_batch / 8, abs=1e-3)
    # The wait for a batch is the pipeline's own `queue` stage, not a second measurement.
    assert batching.wait_ms_mean == summary.stages["queue"].mean
    assert batching.wait_ms_p99 == summary.stages["queue"].p99
    assert batching.wait_ms_mean is not None and batching.wait_ms_mean > 0


def test_a_command_target_fills_service_and_network(tmp_path: Path, invoke: Invoke) -> None:
    path = command_experiment(tmp_path, "svc", free_port())
    # The evidence is what is checked, not the verdict: a busy machine may serve too few
    # queries in 2 s for a P99 (INVALID, exit 4).
    result = invoke(
        "run",
        str(path),
        "--quick",
        "--duration",
        "2",
        "--warmup",
        "0.5",
        "--json",
        "--allow-invalid",
    )
    assert result.exit_code == 0, result.output
    printed = summary_of(result)
    assert "evidence" in printed  # `run --json` prints it
    evidence = RunEvidence.model_validate(printed["evidence"])
    service = evidence.service
    assert service is not None and service.cpu_user_pct is not None
    assert service.cpu_user_pct + (service.cpu_system_pct or 0) > 1  # aiohttp answered
    assert service.ctx_voluntary_per_s is not None and service.ctx_voluntary_per_s > 0
    assert service.threads and service.threads[0].cpu_pct >= 1.0
    assert evidence.process is not None and evidence.process.threads  # the load generator
    # The toy service's Server-Timing `total` (server_total) against the client's total.
    network = evidence.network
    assert network is not None
    assert network.server_p50_ms < network.client_p50_ms
    assert network.overhead_p50_ms == pytest.approx(
        network.client_p50_ms - network.server_p50_ms, abs=1e-3
    )
    assert 0 < network.overhead_share < 1
    # Which RSS series a memory trend follows (the service's, here) is
    # tests/unit/test_evidence_logic.py's: a 2 s run has too few samples for a trend.


# -- this process's threads ----------------------------------------------------------------------


def test_usage_between_names_the_busy_thread_of_this_process() -> None:
    stop, spun = threading.Event(), threading.Event()

    def spin() -> None:
        began = time.thread_time()
        while time.thread_time() - began < SPIN_CPU_S:
            sum(range(1000))
        spun.set()
        stop.wait()  # alive and idle: its counters stay, and stand still while they are read

    me = psutil.Process()
    start = snapshot_tree([me], me.pid)
    thread = threading.Thread(target=spin, name="evidence-spinner")
    thread.start()
    try:
        # The span ends once the spinner has had SPIN_CPU_S of CPU, however long a busy
        # machine takes to give it: a fixed sleep left it a few ticks, within the counters'
        # rounding of the process's other threads.
        assert spun.wait(300), "the spinner never got its CPU"
        end = snapshot_tree([me], me.pid)  # before it ends: a thread gone takes its counters
    finally:
        stop.set()
        thread.join()
    usage = usage_between(start, end)
    assert usage is not None and usage.threads
    assert usage.threads[0][0] == "evidence-spinner"  # Python's name, not the kernel's
    # The process's CPU includes its busiest thread's. The spinner is idle while the end
    # snapshot reads the process's times and then its threads' (a spinning thread ran on
    # between those reads, each time the reader waited for the GIL), so the two agree up to
    # the kernel's tick rounding of user and system time in each counter.
    before, after = start.processes[me.pid], end.processes[me.pid]
    read_at = after.threads[thread.native_id or 0].at_s or after.threads_at_s
    thread_s = usage.threads[0][1] / 100 * (read_at - before.threads_at_s)
    process_s = (usage.cpu_user_pct + usage.cpu_system_pct) / 100 * (end.at_s - start.at_s)
    assert thread_s >= SPIN_CPU_S - 2 * TICK_S, f"the spinner's CPU read as {thread_s:.3f} s"
    assert process_s >= thread_s - 4 * TICK_S, f"process {process_s:.3f} s, thread {thread_s:.3f} s"
    assert usage.ctx_voluntary_per_s is not None and usage.ctx_voluntary_per_s >= 0
    assert usage_between(end, start) is None  # an empty span is unknown
    gone = snapshot_tree([], me.pid)
    assert usage_between(start, gone) is None  # the root process missing


def test_a_threads_counter_is_clocked_when_it_is_read_not_before_the_others() -> None:
    # Many idle threads make a snapshot's reads long while a spinner holds the GIL (each /proc
    # read waits for it). The spinner logs its own CPU clock against perf_counter as it goes,
    # so the CPU the snapshot read can be set against what the spinner had used at the moment
    # the snapshot says it read it. A clock read once before all the threads was 150-230 ms
    # early for the spinner here, which had used 46-143 ms more CPU than at that clock.
    stop = threading.Event()
    idle = [threading.Thread(target=stop.wait, name=f"idle-{i}") for i in range(300)]
    log: list[tuple[float, float]] = []

    def spin() -> None:
        while not stop.is_set():
            sum(range(200))
            log.append((time.perf_counter(), time.thread_time()))

    spinner = threading.Thread(target=spin, name="evidence-spinner")
    for t in [*idle, spinner]:
        t.start()
    me = psutil.Process()
    try:
        time.sleep(0.5)
        snap = snapshot_tree([me], me.pid).processes[me.pid]
    finally:
        stop.set()
        for t in [*idle, spinner]:
            t.join()
    read = snap.threads[spinner.native_id or 0]
    assert read.at_s is not None, "Linux's /proc gives each thread's counters a clock of their own"
    # What the spinner had used when its counter was read: its last entry before that clock
    # (it waits for the GIL while the reader holds it, so it used next to nothing since).
    times = [at for at, _ in log]
    used = log[bisect.bisect_right(times, read.at_s) - 1][1]
    # /proc truncates user and system time to ticks, each.
    assert used - 2 * TICK_S - 0.005 <= read.cpu_s <= used + 0.005, (read.cpu_s, used)
    assert log[0][0] < read.at_s  # the spinner had run before it was read
