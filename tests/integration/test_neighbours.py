"""Who is a neighbour of a run: the target's own service (an http server on this host, found by
its port, with its children) never is; a process that competed for the CPU is, even when it
started and exited inside the measured phase. Real processes throughout, judged by identity
(which pids are named), never by exact CPU figures, so a busy machine cannot flip them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import psutil
import pytest

from optlab.metrics.resources import MIDDLE, ResourceSampler
from optlab.metrics.usage import snapshot_tree
from optlab.store import RunEvidence, Store
from optlab.targets.listener import local_listener
from tests.support.files import write
from tests.support.httpsvc import http_experiment
from tests.support.inprocess import run_file
from tests.support.proc import free_port, run_python, service, start_optlab, start_python
from tests.support.waits import wait_until

SPIN_MS = 1.0  # CPU the test server spends on each request (its own thread's CPU time)

# A server that spends SPIN_MS of CPU on every request, and starts one worker process that
# spins a third of the time for as long as the server lives: both are the target.
SERVER = """\
import os, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORKER = (
    "import os, time\\n"
    "parent = os.getppid()\\n"
    "while os.getppid() == parent:\\n"
    "    end = time.perf_counter() + 0.003\\n"
    "    while time.perf_counter() < end: pass\\n"
    "    time.sleep(0.006)\\n"
)

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        end = time.thread_time() + SPIN_S
        while time.thread_time() < end:
            pass
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

SPIN_S = float(sys.argv[2]) / 1000
worker = subprocess.Popen([sys.executable, "-c", WORKER])
with open(sys.argv[3], "w") as handle:
    handle.write(str(worker.pid))
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""

# A server whose master binds the port and forks workers that inherit the socket; with
# "close", the master closes its own copy, so only the workers (siblings) hold it.
FORKING = """\
import os, socket, sys, time
sock = socket.socket()
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.listen()
master = os.getpid()
for _ in range(2):
    if os.fork() == 0:
        while os.getppid() == master:  # until the master is gone
            time.sleep(0.05)
        os._exit(0)
if sys.argv[2] == "close":
    sock.close()
print("ready", flush=True)
time.sleep(120)
"""


@contextmanager
def server(tmp_path: Path) -> Iterator[tuple[int, int, int]]:
    """(port, the server's pid, its worker's pid): a server process apart from optlab's."""
    port = free_port()
    script = write(tmp_path, "spin_server.py", SERVER)
    worker_file = tmp_path / "worker.pid"
    argv = [sys.executable, script, str(port), str(SPIN_MS), str(worker_file)]
    with service(argv, port) as proc:  # its worker is in its process group, killed with it
        wait_until(lambda: worker_file.is_file() and worker_file.read_text(), "the worker's pid")
        yield port, proc.pid, int(worker_file.read_text())


def test_a_same_host_http_server_is_the_service_never_a_neighbour(
    tmp_path: Path, sqlite_url: str
) -> None:
    with server(tmp_path) as (port, pid, worker):
        path = http_experiment(
            tmp_path, "spin", f"http://127.0.0.1:{port}/", "{mode: closed, concurrency: 2}"
        )
        db = Path(sqlite_url.removeprefix("sqlite:///"))
        # optlab in its own process, as a user runs it: the server is its sibling, not its child.
        run = start_optlab(
            "run",
            str(path),
            "--quick",
            "--duration",
            "3",
            "--warmup",
            "0.5",
            "--json",
            "--allow-invalid",
            db=db,
            new_session=True,
        )
        stdout, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stdout + stderr
    printed = json.loads(stdout.strip().splitlines()[-1])
    assert printed["status"] == "FINISHED"
    # The process found at the URL's port is recorded as the target's service.
    assert printed["service"]["pid"] == pid
    assert printed["service"]["found_by"] == f"listening on 127.0.0.1:{port}"
    evidence = RunEvidence.model_validate(printed["evidence"])
    named = {n.pid for n in evidence.neighbours}
    assert pid not in named and worker not in named
    # Its CPU is the service's: every measured request cost the server SPIN_MS of CPU at
    # least (its thread's own CPU time), so the service's tree used at least half of that.
    service = evidence.service
    assert service is not None
    assert service.cpu_user_pct is not None and service.cpu_system_pct is not None
    requests, measured_s = int(printed["requests"]), float(printed["duration_s"])
    floor = 0.5 * 100 * requests * SPIN_MS / 1000 / measured_s
    assert requests > 0 and service.cpu_user_pct + service.cpu_system_pct >= floor
    # The worker process is in the service's tree: its thread is listed with its pid.
    assert any(f"(pid {worker})" in t.name for t in service.threads), service.threads
    # Nowhere in what the run says is the server called another process.
    stored = Store.open(sqlite_url).get_run(int(printed["run_id"]))
    assert stored.summary is not None
    said = " ".join([*printed["reasons"], *stored.summary.notes])
    assert f"pid {pid}" not in said and f"pid {worker}" not in said


def orphan_burner() -> int:
    """A process spinning `while True`, started through a parent that exits at once: not a
    child of this process (which the sampler counts as optlab's own tree)."""
    # The burner must not hold the pipe its pid is read from: it would never close.
    code = (
        "import subprocess, sys\n"
        "quiet = {'stdout': subprocess.DEVNULL, 'stderr': subprocess.DEVNULL}\n"
        "p = subprocess.Popen([sys.executable, '-c', 'while True: pass'], **quiet)\n"
        "print(p.pid, flush=True)\n"
    )
    out = run_python(code, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def cpu_of(pid: int) -> float:
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def test_a_burner_started_and_stopped_within_the_phase_is_named() -> None:
    # A 60 s interval: no regular sample; the phase's snapshots and the watcher are the test.
    sampler = ResourceSampler(interval_s=60.0)
    sampler.start()
    burner = None
    watchers: set[int] = set()
    try:
        sampler.set_phase("measure")
        wait_until(lambda: sampler.tree_rss(), "the measure snapshot")
        burner = orphan_burner()
        assert psutil.Process(burner).ppid() != os.getpid()
        # However busy the machine, the burner gets its CPU second; the watcher reads every
        # process twice a second meanwhile.
        wait_until(lambda: cpu_of(burner) >= 1.0, "the burner's first CPU second", 120)
        time.sleep(1.0)
        watchers = {c.pid for c in psutil.Process().children() if c.name() == "optlab-watch"}
        assert watchers  # the sampler's child, reading every process meanwhile
        os.kill(burner, signal.SIGKILL)
        wait_until(lambda: not psutil.pid_exists(burner), "the burner's exit")
        sampler.set_phase("drain")
    finally:
        if burner is not None and psutil.pid_exists(burner):
            os.kill(burner, signal.SIGKILL)
        sampler.stop()
    named = sampler.neighbours(least_pct=0.5, most=10_000)
    pids = {n["pid"] for n in named}
    assert burner in pids  # gone before the phase ended, and named with its pid
    entry = next(n for n in named if n["pid"] == burner)
    assert entry["name"].startswith("python") and entry["cpu_pct"] > 0
    # optlab's own process and its children (its watcher among them) are never neighbours.
    mine = {os.getpid(), *(c.pid for c in psutil.Process().children(recursive=True))}
    assert not pids & (mine | watchers)
    # The watcher ended with the phase: nothing of it is left behind.
    assert not any(psutil.pid_exists(pid) for pid in watchers)


def test_a_burner_that_came_halfway_is_the_halves_changed_neighbour() -> None:
    # The drift line's neighbour: CPU in each half of the phase, around the middle's snapshot.
    sampler = ResourceSampler(interval_s=60.0)
    sampler.start()
    burner = None
    try:
        sampler.set_phase("measure")
        wait_until(lambda: sampler.noted("measure"), "the measure snapshot")
        assert sampler.neighbour_halves() == []  # no middle, no end yet: unknown, not "none"
        sampler.mark_middle()
        wait_until(lambda: sampler.noted(MIDDLE), "the middle's snapshot")
        burner = orphan_burner()
        wait_until(lambda: cpu_of(burner) >= 1.0, "the burner's first CPU second", 120)
        sampler.set_phase("drain")
        wait_until(lambda: sampler.noted("drain"), "the drain snapshot")
    finally:
        if burner is not None and psutil.pid_exists(burner):
            os.kill(burner, signal.SIGKILL)
        sampler.stop()
    changed = sampler.neighbour_halves(least_pct=0.5, most=10_000)
    entry = next((n for n in changed if n["pid"] == burner), None)
    assert entry is not None, changed
    # Started after the middle's snapshot: nothing in the first half, its burn after.
    assert entry["first_pct"] == 0.0 and entry["second_pct"] > 0.0
    assert entry["name"].startswith("python")
    assert not {n["pid"] for n in changed} & {os.getpid()}


# A python target that, when its measured phase starts (`reset_metrics`), starts a burner
# outside optlab's process tree and kills it a few seconds later, inside the phase.
BURNING_TARGET = """\
import json, os, signal, subprocess, sys, threading, time

import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
SPAWN = (
    "import subprocess, sys\\n"
    "quiet = {'stdout': subprocess.DEVNULL, 'stderr': subprocess.DEVNULL}\\n"
    "p = subprocess.Popen([sys.executable, '-c', 'while True: pass'], **quiet)\\n"
    "print(p.pid, flush=True)\\n"
)


def burn():
    began = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", SPAWN], capture_output=True, text=True)
    pid = int(out.stdout)
    up = time.perf_counter()
    cpu = 0.0
    while time.perf_counter() - up < 4.0 and cpu < 1.0:
        times = psutil.Process(pid).cpu_times()
        cpu = times.user + times.system
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    while psutil.pid_exists(pid):
        time.sleep(0.02)
    record = {"pid": pid, "cpu_s": cpu, "gone_after_s": time.perf_counter() - began}
    with open(os.path.join(HERE, "burner.json"), "w") as handle:
        json.dump(record, handle)


class Target:
    def __call__(self, request):
        time.sleep(0.002)
        return request

    def reset_metrics(self):
        threading.Thread(target=burn, daemon=True).start()


def build(knobs):
    return Target()
"""


def test_a_run_names_a_burner_that_ran_and_exited_inside_its_measured_phase(
    tmp_path: Path,
) -> None:
    write(tmp_path, "burning_target.py", BURNING_TARGET)
    path = write(
        tmp_path,
        "burning.yaml",
        "name: burning\ntarget: {kind: python, factory: 'burning_target:build'}\n"
        "knobs: {}\nworkload: {load: {mode: closed, concurrency: 2}}\n",
    )
    summary = run_file(tmp_path, path, duration_s=10.0)
    burner = json.loads((tmp_path / "burner.json").read_text())
    # It was gone before the phase ended (the phase began as the burner was started).
    assert summary.duration_s is not None and burner["gone_after_s"] < summary.duration_s
    assert not psutil.pid_exists(burner["pid"])
    evidence = summary.evidence
    assert evidence is not None
    named = {n.pid: n for n in evidence.neighbours}
    listed = named.get(burner["pid"])
    others = [n for pid, n in named.items() if pid != burner["pid"]]
    share = 100 * burner["cpu_s"] / summary.duration_s
    # Named, or left out only of a list already full (3) of processes that used more of the
    # CPU (on a shared machine other work may well have: both outcomes are checked whole).
    full_of_heavier = len(others) == 3 and all(n.cpu_pct >= 0.5 * share for n in others)
    assert (listed is not None) or full_of_heavier, (burner, named)
    assert listed is None or listed.name.startswith("python"), listed  # named as what it was
    assert os.getpid() not in named  # optlab's own process never is


def test_a_child_of_the_service_started_mid_phase_is_the_service_s() -> None:
    # The service starts a child that spins after the trees were last searched: it descends
    # from the service, so it is the service's, never a neighbour.
    code = (
        "import subprocess, sys, time\n"
        "sys.stdin.readline()\n"
        "p = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(120)\n"
    )
    service = start_python(code, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    sampler = ResourceSampler(interval_s=60.0)
    child = None
    try:
        sampler.track_service(service.pid)
        sampler.start()
        sampler.set_phase("measure")
        wait_until(lambda: sampler.tree_rss(), "the measure snapshot")
        assert service.stdin is not None and service.stdout is not None
        service.stdin.write("go\n")
        service.stdin.flush()
        child = int(service.stdout.readline())
        wait_until(lambda: cpu_of(child) >= 0.3, "the service's child spinning", 120)
        sampler.set_phase("drain")
    finally:
        sampler.stop()
        if child is not None and psutil.pid_exists(child):
            os.kill(child, signal.SIGKILL)
        service.kill()
        service.wait(10)
    pids = {n["pid"] for n in sampler.neighbours(least_pct=0.0, most=10_000)}
    assert child not in pids and service.pid not in pids


# -- finding the service by its port -------------------------------------------------------------


@pytest.mark.parametrize("master_keeps_socket", [True, False])
def test_the_listener_of_a_forking_server_is_its_master(
    tmp_path: Path, master_keeps_socket: bool
) -> None:
    port = free_port()
    script = write(tmp_path, "forking.py", FORKING)
    mode = "keep" if master_keeps_socket else "close"
    master = subprocess.Popen(
        [sys.executable, str(script), str(port), mode], stdout=subprocess.PIPE, text=True
    )
    try:
        assert master.stdout is not None and master.stdout.readline().strip() == "ready"
        found = local_listener(f"http://127.0.0.1:{port}/predict")
        assert found is not None and found.pid == master.pid
        assert found.found_by == f"listening on 127.0.0.1:{port}"
        # localhost names the same host; the wildcard-free bind is still found through it.
        by_name = local_listener(f"http://localhost:{port}/")
        assert by_name is None or by_name.pid == master.pid
    finally:
        master.kill()
        master.wait(10)


def test_no_service_for_another_host_nothing_listening_or_optlab_itself() -> None:
    assert local_listener("http://192.0.2.10:8080/") is None  # TEST-NET: another machine
    assert local_listener(f"http://127.0.0.1:{free_port()}/") is None  # nothing listens
    with socket.socket() as sock:  # a server inside optlab's own process is optlab's
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert local_listener(f"http://127.0.0.1:{port}/") is None


# -- native threads ------------------------------------------------------------------------------


def test_native_threads_of_this_process_are_named_for_their_pool() -> None:
    stop = threading.Event()
    matrix = np.random.default_rng(0).random((300, 300))

    def multiply() -> None:
        while not stop.is_set():
            matrix @ matrix

    thread = threading.Thread(target=multiply, name="numpy-caller")
    thread.start()
    try:
        me = psutil.Process()
        snap = snapshot_tree([me], me.pid).processes[me.pid]
        python = {t.native_id for t in threading.enumerate() if t.native_id is not None}
    finally:
        stop.set()
        thread.join()
    names = {tid: t.name for tid, t in snap.threads.items()}
    assert names[thread.native_id or -1] == "numpy-caller"
    native = {tid: name for tid, name in names.items() if tid not in python}
    for tid, name in native.items():
        # Never passed off as the interpreter's own thread (the kernel names it "python").
        assert name.startswith(f"native thread {tid} ("), name


# A fresh process whose BLAS pool has 2 threads (OPENBLAS_NUM_THREADS makes sure the pool
# exists, whatever the machine's cores): it names its own threads and prints them.
BLAS_POOL = """\
import json, os, threading
import numpy as np
import psutil
from optlab.metrics.usage import snapshot_tree
matrix = np.random.default_rng(0).random((300, 300))
matrix @ matrix
me = psutil.Process()
snap = snapshot_tree([me], me.pid).processes[me.pid]
python = [t.native_id for t in threading.enumerate()]
print(json.dumps({"python": python, "names": {t: s.name for t, s in snap.threads.items()}}))
"""


def test_native_threads_of_a_blas_pool_are_named_for_it() -> None:
    out = run_python(BLAS_POOL, env={"OPENBLAS_NUM_THREADS": "2"})
    assert out.returncode == 0, out.stderr
    printed = json.loads(out.stdout)
    names = {int(tid): name for tid, name in printed["names"].items()}
    native = {tid: name for tid, name in names.items() if tid not in printed["python"]}
    assert native, names  # the pool's thread beside the interpreter's
    for tid, name in native.items():
        assert name.startswith(f"native thread {tid} ("), name
    # numpy's BLAS is loaded in that process: its pool's threads say so.
    assert any("OpenBLAS" in n or "OpenMP" in n or "MKL" in n for n in native.values()), native
