"""The HTTP/1.1 client on its own, against a scripted asyncio server in the same event loop:
what goes on the wire, keep-alive, framing (length, chunked, close), Server-Timing, errors by
kind, timeouts, the pool limit and cancellation. Each test takes milliseconds."""

from __future__ import annotations

import asyncio
import random
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from optlab.errors import ConfigError
from optlab.metrics.stages import RequestTiming
from optlab.targets.http import classify
from optlab.targets.http_client import HttpClient
from optlab.targets.http_wire import (
    Body,
    ClientConnectorError,
    ClientResponseError,
    HttpError,
    HttpSpec,
    ServerDisconnectedError,
    request_bytes,
)
from optlab.targets.server_timing import parse_server_timing, split_server_timing

Reply = Callable[[bytes, bytes], Awaitable[bytes | None]]  # (head, body) -> bytes, or None: close

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


def spec(port: int, **changes: Any) -> HttpSpec:
    fields: dict[str, Any] = {
        "url": f"http://127.0.0.1:{port}/p?q=1",
        "method": "POST",
        "headers": (),
        "ok_status": None,
        "connect_timeout_s": 2.0,
        "timeout_s": 5.0,
        "connections": 4,
    }
    fields.update(changes)
    return HttpSpec(**fields)


class Scripted:
    """An HTTP/1.1 server: reads each request whole, answers what `reply` returns."""

    def __init__(self, reply: Reply, close_after: bool = False) -> None:
        self.reply = reply
        self.close_after = close_after  # close each connection after its first response
        self.connections = 0
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> Scripted:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    @property
    def port(self) -> int:
        assert self.server is not None
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
                body = await reader.readexactly(int(length.group(1))) if length else b""
                self.requests.append(head + body)
                answer = await self.reply(head, body)
                if answer is None:
                    break
                writer.write(answer)
                await writer.drain()
                if self.close_after:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)  # type: ignore[arg-type]


async def answer(data: bytes) -> Reply:
    async def reply(head: bytes, body: bytes) -> bytes:
        return data

    return reply


async def send_all(client: HttpClient, n: int) -> list[RequestTiming]:
    timings = []
    for _ in range(n):
        timing = RequestTiming()
        await client.send(0, timing)
        timings.append(timing)
    return timings


# -- the request bytes ---------------------------------------------------------------------------


def test_each_body_becomes_one_prebuilt_request() -> None:
    headers = (("Authorization", "Bearer t"), ("User-Agent", "mine"), ("Content-Type", "x/y"))
    built = request_bytes(
        spec(8080, headers=headers),
        [Body(b'{"a":1}', "application/json"), Body(b"", None)],
    )
    head, _, body = built[0].partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /p?q=1 HTTP/1.1"
    assert body == b'{"a":1}'
    assert "Host: 127.0.0.1:8080" in lines
    assert "Authorization: Bearer t" in lines
    assert "User-Agent: mine" in lines  # the target's own wins over the default
    assert "Content-Type: application/json" in lines  # the body's type wins, as before
    assert "Content-Length: 7" in lines
    assert "Accept: */*" in lines
    # A POST without a body still says so; a GET without one sends no length.
    assert b"Content-Length: 0\r\n" in built[1]
    get = request_bytes(spec(80, method="GET", url="http://h/"), [Body(b"", None)])[0]
    assert get.startswith(b"GET / HTTP/1.1\r\nHost: h\r\n") and b"Content-Length" not in get


def test_a_header_that_would_break_the_request_is_refused() -> None:
    with pytest.raises(ConfigError, match="target.headers.X"):
        request_bytes(spec(80, headers=(("X", "a\r\nInjected: 1"),)), [Body(b"", None)])
    with pytest.raises(ConfigError, match="not http or https"):
        request_bytes(spec(80, url="ftp://h/"), [Body(b"", None)])


def test_server_timing_fast_path_reads_as_the_entry_by_entry_parser() -> None:
    atoms = ["a", "db", "total", " ", ";", ",", "dur", "DUR", "=", "1", "2.5", ".5", "1e3",
             "desc", "x y", "\t", ";dur=3", "durx=1", "é"]  # fmt: skip
    rng = random.Random(7)
    for _ in range(3000):
        value = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 10)))
        slow: dict[str, int] = {}
        for name, ms in split_server_timing(value):
            name = "server_total" if name == "total" else name
            slow[name] = slow.get(name, 0) + round(float(ms) * 1e6)
        assert parse_server_timing([value]) == slow, value


# -- against a server ----------------------------------------------------------------------------


def test_keep_alive_one_connection_and_server_timing_only_when_sent() -> None:
    responses = [
        b"HTTP/1.1 200 OK\r\nServer-Timing: queue;dur=1.5, infer;dur=2\r\n"
        b"server-timing: total;dur=4\r\nContent-Length: 2\r\n\r\nok",
        OK,
    ]

    async def main() -> tuple[list[RequestTiming], Scripted]:
        async def reply(head: bytes, body: bytes) -> bytes:
            return responses[len(server.requests) % 2 - 1]

        async with Scripted(reply) as server:
            client = HttpClient(spec(server.port), [Body(b"abc", "text/plain")])
            await client.open()
            timings = await send_all(client, 4)
            await client.close()
        return timings, server

    timings, server = run(main())
    assert server.connections == 1  # every request on the one kept-alive connection
    assert server.requests[0].endswith(b"\r\n\r\nabc")
    expected = {"queue": 1_500_000, "infer": 2_000_000, "server_total": 4_000_000}
    assert [t.stages for t in timings] == [expected, None, expected, None]


def test_chunked_and_close_delimited_bodies_and_connection_close() -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
    )
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    until_eof = b"HTTP/1.1 200 OK\r\n\r\nthe body ends when the connection does"

    async def main(data: bytes, close_after: bool) -> int:
        async with Scripted(await answer(data), close_after) as server:
            client = HttpClient(spec(server.port), [Body(b"", None)])
            await client.open()
            for _ in range(3):
                await client.send(0, RequestTiming())
            await client.close()
        return server.connections

    assert run(main(chunked, False)) == 1
    assert run(main(closing, True)) == 3  # Connection: close: never reused
    assert run(main(until_eof, True)) == 3  # the server's close ends the body


def test_errors_are_counted_by_kind() -> None:
    async def main() -> dict[str, str]:
        kinds: dict[str, str] = {}

        async def fail(head: bytes, body: bytes) -> bytes:
            return b"HTTP/1.1 503 Busy\r\nContent-Length: 9\r\n\r\ntoo busy\n"

        async def hang_up(head: bytes, body: bytes) -> None:
            return None

        async def garbage(head: bytes, body: bytes) -> bytes:
            return b"NOT HTTP AT ALL\r\n\r\n"

        for name, reply in (("503", fail), ("closed", hang_up), ("garbage", garbage)):
            async with Scripted(reply) as server:
                client = HttpClient(spec(server.port), [Body(b"", None)])
                await client.open()
                try:
                    await client.send(0, RequestTiming())
                except Exception as exc:
                    kind, message = classify(exc)
                    kinds[name] = f"{kind}: {message}"
                await client.close()
        # Nothing listening: the connection is refused.
        async with Scripted(fail) as server:
            port = server.port
        client = HttpClient(spec(port), [Body(b"", None)])
        await client.open()
        with pytest.raises(ClientConnectorError) as info:
            await client.send(0, RequestTiming())
        kinds["refused"] = classify(info.value)[0]
        await client.close()
        return kinds

    kinds = run(main())
    assert kinds["503"] == "HTTP 503: 503: too busy"
    assert kinds["closed"].startswith("ServerDisconnectedError: ")
    assert kinds["garbage"].startswith("ClientResponseError: invalid HTTP response")
    assert kinds["refused"] == "ClientConnectorError"


def test_ok_status_decides_success() -> None:
    async def main() -> None:
        async with Scripted(await answer(b"HTTP/1.1 404 Nope\r\nContent-Length: 0\r\n\r\n")) as s:
            client = HttpClient(spec(s.port, ok_status=(404,)), [Body(b"", None)])
            await client.open()
            await client.send(0, RequestTiming())  # no error: 404 is what this target expects
            client2 = HttpClient(spec(s.port), [Body(b"", None)])
            await client2.open()
            with pytest.raises(HttpError):
                await client2.send(0, RequestTiming())
            await client.close()
            await client2.close()

    run(main())


def test_a_response_that_never_comes_times_out_and_the_connection_is_dropped() -> None:
    async def main() -> tuple[float, int]:
        replies = 0

        async def slow_first(head: bytes, body: bytes) -> bytes:
            nonlocal replies
            replies += 1
            if replies == 1:
                await asyncio.sleep(30)
            return OK

        async with Scripted(slow_first) as server:
            client = HttpClient(spec(server.port, timeout_s=0.2), [Body(b"", None)])
            await client.open()
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(TimeoutError):
                await client.send(0, RequestTiming())
            elapsed = loop.time() - started
            await client.send(0, RequestTiming())  # a fresh connection answers
            await client.close()
        return elapsed, server.connections

    elapsed, connections = run(main())
    assert 0.2 <= elapsed < 0.5  # the timeout, plus at most one sweep of the pool
    assert connections == 2


def test_the_pool_keeps_its_limit_and_a_cancelled_request_frees_its_slot() -> None:
    async def main() -> int:
        async def slow(head: bytes, body: bytes) -> bytes:
            await asyncio.sleep(0.02)
            return OK

        async with Scripted(slow) as server:
            client = HttpClient(spec(server.port, connections=2), [Body(b"", None)])
            await client.open()
            await asyncio.gather(*(client.send(0, RequestTiming()) for _ in range(10)))
            task = asyncio.ensure_future(client.send(0, RequestTiming()))
            await asyncio.sleep(0.005)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.gather(*(client.send(0, RequestTiming()) for _ in range(4)))
            await client.close()
        return server.connections

    assert run(main()) <= 3  # 2, plus one to replace the connection the cancel dropped


def test_head_responses_end_at_their_headers() -> None:
    async def main() -> int:
        head_reply = b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n"
        async with Scripted(await answer(head_reply)) as server:
            client = HttpClient(spec(server.port, method="HEAD"), [Body(b"", None)])
            await client.open()
            await send_all(client, 3)
            await client.close()
        return server.connections

    assert run(main()) == 1


def test_uvloop_drives_it_too() -> None:
    uvloop = pytest.importorskip("uvloop")

    async def main() -> int:
        async with Scripted(await answer(OK)) as server:
            client = HttpClient(spec(server.port), [Body(b"x" * 100_000, None)])
            await client.open()
            await send_all(client, 5)
            await client.close()
        return len(server.requests)

    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(main()) == 5
    finally:
        loop.close()


def test_errors_keep_their_former_names() -> None:
    # Runs stored before this client used aiohttp's names; the error table reads alike.
    assert classify(ServerDisconnectedError("x"))[0] == "ServerDisconnectedError"
    assert classify(ClientResponseError("x"))[0] == "ClientResponseError"
    assert classify(TimeoutError())[0] == "timeout"


@pytest.mark.slow
def test_the_open_loop_sends_on_schedule_waking_on_a_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The open loop through this client: a constant 200/s for 1 s against a threaded server.
    On Linux the generator sleeps on a timerfd until just before each send (here the whole
    test took ~0.2 s of CPU; spinning the last 1.5 ms before each send, ~0.47 s)."""
    import sys
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from optlab.config.models import OpenLoad
    from optlab.load.aio import AsyncLoadGenerator
    from optlab.load.timerfd import TimerFd
    from optlab.metrics.log import Collector
    from optlab.metrics.stages import SEND_LAG

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
    assert 180 <= report.issued <= 200 * ran_s + 15
    assert collector.totals("measure") == (report.completed, 0)
    lag = collector.histograms("measure")[SEND_LAG]
    median = lag.value_at_percentile_ns(50)
    assert median is not None and median < 1_000_000  # sent within 1 ms of its intended time
    if sys.platform.startswith("linux"):
        assert len(armed) >= report.issued - 5  # every send but the first few waited on it
