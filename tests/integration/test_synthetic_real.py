"""The synthetic queue served over HTTP (`python -m optlab.reference.synthetic`): one FCFS
server, each answer carrying its own queue and service time."""

from __future__ import annotations

import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from tests.support.proc import free_port, service


def test_the_queue_served_over_http_is_one_fcfs_server() -> None:
    port = free_port()
    args = ["--port", str(port), "--servers", "1", "--distribution", "fixed", "--service-ms", "20"]

    def post(_: int) -> str:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/", data=b"x")
        with urllib.request.urlopen(request, timeout=60) as response:
            timing: str = response.headers["Server-Timing"]
            return timing

    with service([sys.executable, "-m", "optlab.reference.synthetic", *args], port):
        began = time.perf_counter()
        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(post, range(4)))
        elapsed = time.perf_counter() - began
    # One server, 20 ms each: four requests take at least 80 ms however they arrive (a lower
    # bound the queue imposes), and each reports its own 20 ms of service after whatever it
    # queued.
    assert elapsed >= 0.079
    for timing in answers:
        queue, served = (float(part.split("dur=")[1]) for part in timing.split(", "))
        assert served == 20.0 and queue >= 0.0
