"""optlab.metrics.profile: py-spy against real Python processes, and its raw output parsed."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from optlab.errors import ConfigError
from optlab.metrics.profile import (
    Profile,
    Profiler,
    ProfilerError,
    find_py_spy,
)
from tests.support.proc import start_python

FIXTURES = Path(__file__).parents[1] / "fixtures" / "profile"

# A main thread in a pure-Python loop and a named thread asleep: two threads, one busy.
BURNER = """
import threading, time
def nap():
    while True:
        time.sleep(0.2)
def burn_the_cpu():
    x = 0
    while True:
        for i in range(10000):
            x += i
threading.Thread(target=nap, name="napper", daemon=True).start()
print("ready", flush=True)
burn_the_cpu()
"""
# The main thread blocked on a lock nobody releases.
WAITER = """
import threading
lock = threading.Lock()
lock.acquire()
print("ready", flush=True)
lock.acquire()
"""
SHORT = """
import time
print("ready", flush=True)
end = time.monotonic() + 0.5
while time.monotonic() < end:
    pass
"""


def _target(code: str) -> subprocess.Popen[str]:
    proc = start_python(code, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _profile(code: str, seconds: float) -> tuple[Profile, list[subprocess.Popen[bytes]]]:
    target = _target(code)
    try:
        profiler = Profiler(target.pid, rate_hz=100)
        with profiler:
            samplers = list(profiler._procs.values())
            assert len(samplers) == 3 and all(p.poll() is None for p in samplers)
            time.sleep(seconds)
        assert profiler.profile is not None and profiler.stop() is profiler.profile
        return profiler.profile, samplers
    finally:
        target.kill()
        target.wait()


@pytest.fixture(scope="module")
def burner() -> Iterator[tuple[Profile, list[subprocess.Popen[bytes]]]]:
    yield _profile(BURNER, 1.5)


def _busiest(profile: Profile) -> str:
    return profile.frames[0].thread


# -- py-spy against real processes -------------------------------------------------------------


def test_cpu_bound_function_is_the_top_frame_and_holds_the_gil(
    burner: tuple[Profile, list[subprocess.Popen[bytes]]],
) -> None:
    profile, samplers = burner
    assert all(p.returncode is not None for p in samplers)  # no py-spy outlives stop()
    assert profile.samples > 50
    top = profile.frames[0]
    assert top.thread.startswith("MainThread")
    assert top.frame.startswith("burn_the_cpu (")
    busy = sum(f.share_pct for f in profile.frames if f.thread == top.thread and "burn" in f.frame)
    assert busy > 50
    assert profile.gil_pct is not None and profile.gil_pct > 50


def test_two_threads_both_listed_busiest_first(
    burner: tuple[Profile, list[subprocess.Popen[bytes]]],
) -> None:
    profile, _ = burner
    threads = list(dict.fromkeys(f.thread for f in profile.frames))
    assert len(threads) == 2
    assert threads[0].startswith("MainThread") and threads[1].startswith("napper (")
    nap = [f for f in profile.frames if f.thread == threads[1]]
    assert nap[0].frame.startswith("nap (") and nap[0].share_pct > 50
    # One of the two threads sleeps throughout.
    assert profile.idle_pct is not None and 25 < profile.idle_pct < 75


def test_a_waiting_process_is_idle() -> None:
    profile, _ = _profile(WAITER, 1.0)
    assert profile.samples > 30
    assert profile.idle_pct is not None and profile.idle_pct > 80
    assert profile.gil_pct is not None and profile.gil_pct < 20
    assert profile.frames[0].frame.startswith("<module> (")


def test_a_target_that_dies_leaves_what_was_sampled() -> None:
    target = _target(SHORT)
    profiler = Profiler(target.pid, rate_hz=100)
    try:
        profiler.start()
        target.wait(timeout=10)
        time.sleep(0.3)
    finally:
        profile = profiler.stop()
    assert not profiler.running
    assert profile.samples > 10
    assert profile.frames[0].frame.startswith("<module> (")


def test_interrupted_caller_leaves_no_py_spy() -> None:
    target = _target(WAITER)
    samplers: list[subprocess.Popen[bytes]] = []
    try:
        with pytest.raises(KeyboardInterrupt), Profiler(target.pid, rate_hz=50) as profiler:
            samplers = list(profiler._procs.values())
            raise KeyboardInterrupt
    finally:
        target.kill()
        target.wait()
    assert len(samplers) == 3 and all(p.returncode is not None for p in samplers)


def test_a_process_that_is_not_python_is_refused() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        with pytest.raises(ProfilerError, match=f"could not sample process {proc.pid}"):
            Profiler(proc.pid).start()
    finally:
        proc.kill()
        proc.wait()


def test_missing_py_spy_says_how_to_install(tmp_path: Path) -> None:
    assert Path(find_py_spy()).name == "py-spy"
    with pytest.raises(ProfilerError) as caught:
        find_py_spy([str(tmp_path)])
    assert isinstance(caught.value, ConfigError)
    assert caught.value.hint is not None and "pip install py-spy" in caught.value.hint
    profiler = Profiler(1, executable=str(tmp_path / "py-spy"))
    with pytest.raises(ProfilerError, match="py-spy not found"):
        profiler.start()
    assert not profiler.running
