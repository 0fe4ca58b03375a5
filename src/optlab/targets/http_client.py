"""The HTTP/1.1 client the load generator drives: keep-alive connections as asyncio Protocols,
responses parsed by llhttp (`httptools`), every request's bytes built once per body
(`optlab.targets.http_wire`).

Why not aiohttp: a load generator's CPU is taken from the service it measures when both share a
machine, and a dynamically batching service forms smaller batches when its clients are slow to
come back. aiohttp builds each request (headers, URL, a response object, a stream reader, a
timeout context) in Python on every call; here a request is one `transport.write` of prebuilt
bytes, the response is parsed in C, and only the headers that matter (Server-Timing, the framing)
reach Python. `benchmarks/http_load.py` measures both, and `hey` (Go) beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from optlab.metrics.stages import RequestTiming
from optlab.targets.http_wire import (
    MESSAGE_CHARS,
    Body,
    ClientConnectorError,
    ClientOSError,
    ClientResponseError,
    HttpError,
    HttpSpec,
    ServerDisconnectedError,
    request_bytes,
)
from optlab.targets.server_timing import parse_server_timing
from optlab.targets.sse import SseReader, Tokenizer

if TYPE_CHECKING:
    import ssl

    import httptools

__all__ = ["HttpClient", "StreamSpec"]

MAX_SERVER_STAGES = 32  # distinct Server-Timing names kept per client; more are ignored
# A timeout fires between timeout_s and timeout_s + this share of it (one sweep of the pool
# rather than a timer per request), and at most SWEEP_MAX_S late.
SWEEP_SHARE = 0.05
SWEEP_MAX_S = 0.1
SWEEP_MIN_S = 0.001


@dataclass(frozen=True)
class StreamSpec:
    """A streaming target's responses are Server-Sent Events, timed as they arrive
    (`optlab.targets.sse`): how tokens are counted, and each body's `max_tokens`."""

    tokenizer: Tokenizer
    max_tokens: tuple[int, ...]  # by body index
    input_tokens: tuple[int, ...]  # by body index, as built (the server's usage wins)
    exact: bool  # the requests asked for exactly max_tokens (ignore_eos, min_tokens)


# -- the connection -----------------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One keep-alive connection; one request at a time (no pipelining)."""

    def __init__(self, client: HttpClient) -> None:
        import httptools

        self.client = client
        self.transport: asyncio.Transport | None = None
        self.parser: httptools.HttpResponseParser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[int] | None = None
        self.deadline = 0.0
        self.status = 0
        self.timings: list[str] | None = None  # Server-Timing values of the current response
        self.error_body: bytearray | None = None  # kept only when the status is not a success
        self.headers_done = False
        self.framed = False  # Content-Length or Transfer-Encoding: else the body ends at EOF
        self.keep_alive = True
        self.closed = False
        self.reader: SseReader | None = None  # the current response's stream, when streaming
        self.stamp = 0  # when the bytes being parsed arrived (perf_counter_ns)
        self.backlog: list[tuple[int, bytes]] = []  # a stream's bytes read, not yet parsed

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        # Stamped before anything is parsed: a streamed event's time is its bytes' arrival.
        stamp = time.perf_counter_ns()
        if self.reader is not None:
            # A stream: parsed after the loop has read (and stamped) every other socket that
            # was ready with it, so 32 streams' events of one server step are each stamped
            # as read, not after the events read before them were parsed.
            self.backlog.append((stamp, data))
            if len(self.backlog) == 1:
                self.client._call_soon(self._parse_backlog)
            return
        self._feed(stamp, data)

    def _parse_backlog(self) -> None:
        backlog, self.backlog = self.backlog, []
        for stamp, data in backlog:
            if not self._feed(stamp, data):
                return

    def _feed(self, stamp: int, data: bytes) -> bool:
        """Parse `data`, read at `stamp`; False once the response has failed."""
        self.stamp = stamp
        try:
            self.parser.feed_data(data)
        except Exception as exc:  # HttpParserError, or an upgrade we never asked for
            self._fail(ClientResponseError(f"invalid HTTP response: {exc}"))
            return False
        reader = self.reader
        if reader is not None and reader.error is not None:
            self._fail(reader.error)  # a stream that cannot be measured is not read further
            return False
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        if self.backlog:
            self._parse_backlog()  # what arrived before the close
        self.closed = True
        self.client._lost(self)
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        if exc is None and self.headers_done and not self.framed:
            self._complete()  # a body delimited by the end of the connection
        elif exc is None:
            waiter.set_exception(
                ServerDisconnectedError(
                    "the server closed the connection before a complete response"
                )  # fmt: skip
            )
        else:
            message = f"{type(exc).__name__}: {exc}".strip(": ")
            waiter.set_exception(ClientOSError(message))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        size = len(name)
        if size == 13:
            if name.lower() == b"server-timing":
                text = value.decode("latin-1")
                if self.timings is None:
                    self.timings = [text]
                else:
                    self.timings.append(text)
        elif size == 14 or size == 17:
            lowered = name.lower()
            if lowered == b"content-length" or lowered == b"transfer-encoding":
                self.framed = True

    def on_headers_complete(self) -> None:
        status = self.status = self.parser.get_status_code()
        self.headers_done = True
        if status >= 200 and not self.client._ok(status):
            self.error_body = bytearray()
        if self.client.head and status >= 200:
            self._complete()  # a HEAD response has headers only, whatever they announce

    def on_body(self, body: bytes) -> None:
        kept = self.error_body
        if kept is not None:
            if len(kept) < MESSAGE_CHARS * 4:
                kept += body
        elif self.reader is not None:
            self.reader.feed(body, self.stamp)

    def on_message_complete(self) -> None:
        if self.status < 200:  # 100 Continue and other interim responses: the real one follows
            self._reset()
            return
        if self.reader is not None:
            self.reader.body_ended(self.stamp)
        if not self.client.head:
            self._complete()

    # the request cycle
    def _reset(self) -> None:
        self.status = 0
        self.timings = None
        self.error_body = None
        self.headers_done = False
        self.framed = False

    def begin(self, waiter: asyncio.Future[int], deadline: float) -> None:
        if self.client.head:
            import httptools

            # The parser expects the body a HEAD response announces: a fresh one per request.
            self.parser = httptools.HttpResponseParser(self)
        self._reset()
        self.waiter = waiter
        self.deadline = deadline

    def _complete(self) -> None:
        waiter = self.waiter
        self.keep_alive = self.parser.should_keep_alive()
        if waiter is not None and not waiter.done():
            waiter.set_result(self.status)

    def _fail(self, exc: BaseException) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.abort()

    def abort(self) -> None:
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()


class HttpClient:
    """Keep-alive connections, at most `spec.connections` of them (the load's in-flight limit);
    `send` is called from the generator's event loop only."""

    def __init__(
        self, spec: HttpSpec, bodies: Sequence[Body], stream: StreamSpec | None = None
    ) -> None:
        self.spec = spec
        self.bodies = list(bodies)
        self.stream = stream
        self.head = spec.method == "HEAD"
        self._ok_status = frozenset(spec.ok_status) if spec.ok_status is not None else None
        self._requests: list[bytes] = []
        self._stage_names: set[str] = set()
        self._idle: list[_Connection] = []
        self._all: set[_Connection] = set()
        self._opening = 0
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._closing = False
        parts = urlsplit(spec.url)
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._tls = parts.scheme == "https"
        self._ssl: ssl.SSLContext | None = None

    def _call_soon(self, callback: Callable[[], None]) -> None:
        loop = self._loop
        assert loop is not None
        loop.call_soon(callback)

    def _ok(self, status: int) -> bool:
        ok = self._ok_status
        return 200 <= status < 300 if ok is None else status in ok

    async def open(self) -> None:
        self._requests = request_bytes(self.spec, self.bodies)
        self._loop = asyncio.get_running_loop()
        if self._tls:
            import ssl

            self._ssl = ssl.create_default_context()
        self._sweep_s = min(SWEEP_MAX_S, max(SWEEP_MIN_S, self.spec.timeout_s * SWEEP_SHARE))
        self._sweeper = self._loop.call_later(self._sweep_s, self._sweep)

    async def close(self) -> None:
        self._closing = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self._all):
            conn._fail(ServerDisconnectedError("the client closed"))
            if conn.transport is not None:
                conn.transport.close()
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.cancel()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports deliver connection_lost

    async def send(self, index: int, timing: RequestTiming) -> None:
        """Send body `index`; raise on a transport error or a status that is not a success."""
        loop = self._loop
        assert loop is not None, "open() first"
        deadline = loop.time() + self.spec.timeout_s
        idle = self._idle
        conn = idle.pop() if idle else await self._acquire(deadline)
        waiter: asyncio.Future[int] = loop.create_future()
        conn.begin(waiter, deadline)
        stream = self.stream
        if stream is not None:
            written = time.perf_counter_ns()
            conn.reader = SseReader(
                written,
                tokenizer=stream.tokenizer,
                max_tokens=stream.max_tokens[index],
                exact=stream.exact,
                input_tokens=stream.input_tokens[index],
            )
        try:
            conn.transport.write(self._requests[index])  # type: ignore[union-attr]
            status = await waiter
        except BaseException:
            conn.waiter = None
            conn.reader = None
            conn.abort()  # a failed or cancelled request leaves the connection in no known state
            self._release(conn)
            raise
        conn.waiter = None
        timings, error_body, reader = conn.timings, conn.error_body, conn.reader
        conn.reader = None
        self._release(conn)
        if timings is not None:
            self._record_stages(timings, timing)
        if error_body is not None:
            text = bytes(error_body[:MESSAGE_CHARS]).decode("utf-8", "replace").strip()
            raise HttpError(status, f"{status}: {text}".strip(": "))
        if reader is not None:
            timing.stream = reader.result().timing  # raises a StreamError

    # -- the pool -------------------------------------------------------------------------------
    async def _acquire(self, deadline: float) -> _Connection:
        """A connection for a request: a new one while under the limit, else the next freed."""
        loop = self._loop
        assert loop is not None
        while True:
            if self._idle:
                return self._idle.pop()
            if len(self._all) + self._opening < self.spec.connections:
                return await self._connect(deadline)
            waiter: asyncio.Future[_Connection | None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                handed = await asyncio.wait_for(waiter, max(0.0, deadline - loop.time()))
            except BaseException:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    given = waiter.result()
                    if given is not None:
                        self._release(given)
                raise
            if handed is not None:
                return handed

    async def _connect(self, deadline: float) -> _Connection:
        loop = self._loop
        assert loop is not None
        self._opening += 1
        timeout = min(self.spec.connect_timeout_s, max(0.0, deadline - loop.time()))
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _Connection(self),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._tls else None,
                ),
                timeout,
            )
        except TimeoutError:
            raise  # an OSError too, but counted as a timeout
        except OSError as exc:
            reason = exc.strerror or str(exc) or type(exc).__name__
            raise ClientConnectorError(
                f"cannot connect to {self._host}:{self._port}: {reason}"
            ) from None
        finally:
            self._opening -= 1
            if self._waiters and len(self._all) + self._opening < self.spec.connections:
                self._wake(None)
        self._all.add(conn)
        return conn

    def _release(self, conn: _Connection) -> None:
        if conn.closed or not conn.keep_alive or self._closing:
            if not conn.closed:
                conn.abort()
            self._all.discard(conn)
            if self._waiters:
                self._wake(None)  # room for a new connection
            return
        if self._waiters:
            self._wake(conn)
        else:
            self._idle.append(conn)

    def _wake(self, conn: _Connection | None) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is not None:
            self._idle.append(conn)

    def _lost(self, conn: _Connection) -> None:
        """A connection closed (by either side): never handed out again."""
        self._all.discard(conn)
        if conn.waiter is None:
            with contextlib.suppress(ValueError):
                self._idle.remove(conn)
            if self._waiters:
                self._wake(None)

    def _sweep(self) -> None:
        loop = self._loop
        assert loop is not None
        now = loop.time()
        for conn in list(self._all):
            waiter = conn.waiter
            if waiter is not None and not waiter.done() and conn.deadline <= now:
                conn._fail(TimeoutError())
        if not self._closing:
            self._sweeper = loop.call_later(self._sweep_s, self._sweep)

    def _record_stages(self, values: Sequence[str], timing: RequestTiming) -> None:
        known = self._stage_names
        stages = parse_server_timing(values)
        if timing.stages is None and stages.keys() <= known:
            timing.stages = stages  # the usual case: names seen before, nothing else recorded
            return
        for name, ns in stages.items():
            if name not in known:
                if len(known) >= MAX_SERVER_STAGES:
                    continue  # a server inventing names per request must not grow the run
                known.add(name)
            timing.add(name, ns)
