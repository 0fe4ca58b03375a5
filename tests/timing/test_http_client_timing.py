"""Real-time figures of the HTTP client (tests/integration/test_http_client.py keeps the sides
a busy machine cannot move): how soon past its timeout a request that never gets an answer is
given up, and the open loop through this client keeping its schedule, waking on a timerfd. The
bounds are loose for a busy 2-core machine; each message prints the figure."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from optlab.config.models import OpenLoad
from optlab.load.aio import AsyncLoadGenerator
from optlab.load.timerfd import TimerFd
from optlab.metrics.log import Collector
from optlab.metrics.stages import SEND_LAG, RequestTiming
from optlab.targets.http import classify
from optlab.targets.http_client import HttpClient
from optlab.targets.http_wire import Body
from tests.support.capabilities import needs_linux
from tests.support.httpspec import spec


def test_a_request_that_never_gets_an_answer_is_given_up_soon_after_its_timeout() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
        await reader.readexactly(int(length.group(1)) if length else 0)
        await asyncio.sleep(600)

    async def main() -> float:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        client = HttpClient(spec(port, timeout_s=0.2), [Body(b"", None)])
        await client.open()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(client.send(0, RequestTiming()), 60)
        elapsed = loop.time() - started
        await client.close()
        server.close()
        return elapsed

    elapsed = asyncio.run(main())
    # The 0.2 s timeout plus at most one sweep of the pool, on an idle machine ~0.3 s.
    assert 0.2 <= elapsed < 2.0, f"given up after {elapsed:.3f} s (timeout 0.2 s)"


@needs_linux  # timerfd is Linux's
def test_the_open_loop_sends_on_schedule_waking_on_a_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The open loop through this client: a constant 200/s for 1 s against a threaded server.
    On Linux the generator sleeps on a timerfd until just before each send (here the whole
    test took ~0.2 s of CPU; spinning the last 1.5 ms before each send, ~0.47 s)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    armed: list[int] = []
    arm = TimerFd.arm

    def counted(self: TimerFd, deadline_ns: int, waiter: asyncio.Future[None]) -> None:
        armed.append(deadline_ns)
        arm(self, deadline_ns, waiter)

    monkeypatch.setattr(TimerFd, "arm", counted)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        load = OpenLoad(mode="open", rate=200, arrival="constant")
        client = HttpClient(spec(server.server_address[1]), [Body(b"x", None)])
        generator = AsyncLoadGenerator(client, 1, load, classify=classify, timeout_s=5)
        collector = Collector()
        collector.set_phase("measure", time.perf_counter_ns())
        began = time.perf_counter()
        generator.start(collector)
        time.sleep(1.0)
        report = generator.stop()
        ran_s = time.perf_counter() - began  # past the 1 s when the machine is busy
        collector.finish()
    finally:
        server.shutdown()
    # 200/s for as long as it ran: the schedule, not the test's own sleep, sets the count.
    issued = report.issued
    assert 180 <= issued <= 200 * ran_s + 15, f"{issued} sent in {ran_s:.2f} s at 200/s"
    totals = collector.totals("measure")
    assert totals == (report.completed, 0), f"{totals} collected, {report.completed} completed"
    lag = collector.histograms("measure")[SEND_LAG]
    median = lag.value_at_percentile_ns(50)
    # Sent within 1 ms of its intended time.
    assert median is not None and median < 1_000_000, f"send lag P50 {median} ns"
    # Every send but the first few waited on the timer.
    assert len(armed) >= issued - 5, f"{len(armed)} timer waits for {issued} sends"
