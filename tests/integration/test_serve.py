"""`optlab serve`: the real command in a subprocess, real HTTP, the real reference pipeline."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import pytest

from optlab.reference.classifier.data import Sample, requests
from tests.support.proc import free_port, optlab_argv

READY_DEADLINE_S = 60.0
EXIT_DEADLINE_S = 10.0
HTTP_TIMEOUT_S = 30.0
BATCHING = '{"mode":"dynamic","max_batch_size":4,"max_wait_ms":5}'


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OPTLAB_DEBUG", None)
    return env


class Server:
    """`python -m optlab serve ...` in a subprocess, ready once it printed its listening line."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.stderr_path = tmp_path / f"serve-{self.port}.err"
        self._stderr = self.stderr_path.open("wb")
        self.proc = subprocess.Popen(
            optlab_argv("serve", "--port", str(self.port), *args),
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=_env(),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self.lines.put(raw.decode(errors="replace"))

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_DEADLINE_S
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if "listening on" in line:
                assert line.strip() == f"optlab serve: listening on {self.url}"
                return
        raise AssertionError(f"optlab serve never got ready; stderr:\n{self.stderr()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=EXIT_DEADLINE_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._stderr.close()


@pytest.fixture(scope="module")
def samples() -> list[Sample]:
    return requests(split="holdout", count=8, size=64, seed=0)


def post(url: str, body: bytes) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def get(url: str) -> tuple[int, Any]:
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
        return response.status, json.loads(response.read())


def parse_server_timing(header: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for entry in header.split(","):
        name, _, params = entry.strip().partition(";")
        assert params.startswith("dur="), header
        found[name] = float(params.removeprefix("dur="))
    return found


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    started = Server(tmp_path, "--preprocess", "numpy")
    try:
        started.wait_ready()
        yield started
    finally:
        started.stop()


def test_serve_predicts_with_server_timing_and_stops_on_sigterm(
    server: Server, samples: list[Sample]
) -> None:
    correct = 0
    for sample in samples:
        status, body, headers = post(f"{server.url}/predict", sample.jpeg)
        assert status == 200, body
        assert headers["Content-Type"].startswith("application/json")
        answer = json.loads(body)
        correct += answer["label"] == sample.label
        timing = parse_server_timing(headers["Server-Timing"])
        assert {"preprocess", "infer", "postprocess", "app"} <= set(timing), timing
        assert all(dur > 0 for dur in timing.values()), timing
        assert list(timing)[-1] == "app"
    assert correct >= len(samples) // 2 + 1

    assert get(f"{server.url}/health") == (200, {"status": "ok"})
    status, metrics = get(f"{server.url}/metrics")
    assert status == 200 and metrics["infer"]["requests"] == len(samples)
    assert post(f"{server.url}/metrics/reset", b"")[0] == 204
    assert get(f"{server.url}/metrics")[1]["infer"]["requests"] == 0

    for garbage in (b"", b"not a jpeg", b"\xff\xd8\xff truncated"):
        status, body, _ = post(f"{server.url}/predict", garbage)
        assert status == 400, body
        assert "error" in json.loads(body) and b"\n" not in body

    # A second service on the same port is refused at once, before building anything.
    second = subprocess.run(
        optlab_argv("serve", "--port", str(server.port)),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=READY_DEADLINE_S,
    )
    assert second.returncode == 2, second.stderr
    assert f"port {server.port} on 127.0.0.1 is already in use" in second.stderr
    assert "--port" in second.stderr

    assert server.stop() == 0, server.stderr()
    assert "building engine=torch" in server.stderr()
    assert "Traceback" not in server.stderr()


def test_serve_forms_dynamic_batches(tmp_path: Path, samples: list[Sample]) -> None:
    server = Server(tmp_path, "--preprocess", "numpy", "--batching", BATCHING)
    try:
        server.wait_ready()
        timings: list[dict[str, float]] = []
        rounds: list[float] = []  # the mean batch size after each round, all reported
        # Rounds of 8 at once until a batch forms (a round on a loaded 2-core VM may trickle in
        # one by one): a wait on the condition, at most 5 rounds, every round in the message.
        with ThreadPoolExecutor(len(samples)) as pool:
            for _ in range(5):
                for status, body, headers in pool.map(
                    lambda s: post(f"{server.url}/predict", s.jpeg), samples
                ):
                    assert status == 200, body
                    timings.append(parse_server_timing(headers["Server-Timing"]))
                batching = get(f"{server.url}/metrics")[1]["batching"]
                rounds.append(batching["mean_batch_size"])
                if batching["mean_batch_size"] > 1:
                    break
        assert all("queue" in timing for timing in timings), timings
        assert batching["mean_batch_size"] > 1, f"mean batch size after each round: {rounds}"
        assert batching["requests"] == len(timings)
    finally:
        code = server.stop()
    assert code == 0, server.stderr()


def test_a_port_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = subprocess.run(
            optlab_argv("serve", "--port", str(port)),
            capture_output=True,
            text=True,
            env=_env(),
            timeout=READY_DEADLINE_S,
        )
    assert result.returncode == 2
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "choose another --port" in result.stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--precision", "fp64"], ["--precision", "fp64"]),
        (["--batching", '{"mode":"dynamic","max_batch_sise":4}'], ["--batching", "max_batch_sise"]),
        (["--batching", '{"mode":"dynamic","max_batch_size":0}'], ["--batching", "max_batch_size"]),
        (["--batching", "sometimes"], ["--batching", "off, dynamic"]),
        (["--cache", "{not json"], ["--cache", "not valid JSON"]),
        (["--cache", "[1]"], ["--cache", "not a JSON object"]),
        (["--threads", "0"], ["--threads"]),
    ],
)
def test_a_bad_knob_names_the_option_and_the_field(args: list[str], expected: list[str]) -> None:
    result = subprocess.run(
        optlab_argv("serve", "--port", "0", *args),
        capture_output=True,
        text=True,
        env=_env(),
        timeout=READY_DEADLINE_S,
    )
    assert result.returncode == 2, result.stderr
    for text in expected:
        assert text in result.stderr
    assert "Traceback" not in result.stderr
