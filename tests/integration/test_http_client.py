"""The HTTP/1.1 client on its own, against a scripted asyncio server in the same event loop:
what goes on the wire, keep-alive, framing (length, chunked, close), Server-Timing, errors by
kind, timeouts, the pool limit and cancellation. Each test takes milliseconds."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from optlab.metrics.stages import RequestTiming
from optlab.targets.http import classify
from optlab.targets.http_client import HttpClient
from optlab.targets.http_wire import (
    Body,
    ClientConnectorError,
    HttpError,
)
from tests.support.capabilities import not_windows
from tests.support.httpspec import OK, spec

Reply = Callable[[bytes, bytes], Awaitable[bytes | None]]  # (head, body) -> bytes, or None: close


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
                await asyncio.sleep(600)  # a client that waited for it would take 10 minutes
            return OK

        async with Scripted(slow_first) as server:
            client = HttpClient(spec(server.port, timeout_s=0.2), [Body(b"", None)])
            await client.open()
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(TimeoutError):  # the 0.2 s timeout's, not wait_for's 60 s
                await asyncio.wait_for(client.send(0, RequestTiming()), 60)
            elapsed = loop.time() - started
            await client.send(0, RequestTiming())  # a fresh connection answers
            await client.close()
        return elapsed, server.connections

    elapsed, connections = run(main())
    # The timeout, never less (how little more: tests/timing/test_http_client_timing.py).
    assert 0.2 <= elapsed < 60, f"timed out after {elapsed:.2f} s"
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


@not_windows  # uvloop is a dependency off Windows only
def test_uvloop_drives_it_too() -> None:
    import uvloop  # a dependency here: a broken install fails, never skips

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
