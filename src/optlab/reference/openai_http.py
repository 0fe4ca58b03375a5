"""The OpenAI-compatible wire that the reference servers (the token streamer and the reference
LLM) share: HTTP/1.1 on asyncio's own protocols, a request body read into one
`GenerateRequest`, and the Server-Sent Events of a streamed completion or chat completion.

A request's arrival is the kernel's receive stamp of its first bytes (`SO_TIMESTAMPNS`, read
with `recvmsg`): when they reached the server's socket, not when a busy event loop got round to
reading them (under 32 streams that was 1-3 ms later here, and a framework's handler later
still: aiohttp's, by 1-15 ms). Where the kernel gives no stamp, the time they were read. Every
event is stamped as it is handed to the socket: the truth a client is compared with.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Connection",
    "GenerateRequest",
    "Listener",
    "OpenAIServer",
    "SseStream",
    "closing_events",
    "delta_event",
    "event",
    "parse_generate",
]

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
MAX_REQUEST_BYTES = 16 << 20
# Linux's SO_TIMESTAMPNS (socket(7)): each recvmsg carries the kernel's receive time
# (CLOCK_REALTIME) as a struct timespec. Python's socket module does not name it.
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("qq")
_READ = 1 << 16
_HIGH_WATER, _LOW_WATER = 1 << 20, 1 << 18  # bytes buffered: pause a writer, resume it


def _kernel_stamp(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The receive time in an ancillary list, on CLOCK_MONOTONIC (ns); None without one."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanos = (int(v) for v in _TIMESPEC.unpack_from(data))
            # Realtime to monotonic by their offset now (both read within a microsecond).
            return seconds * 1_000_000_000 + nanos - (time.time_ns() - time.monotonic_ns())
    return None


class SocketTransport:
    """One connection's socket on the event loop: read with `recvmsg` for the kernel's receive
    stamps (asyncio's transports do not give them), written through a buffer that pauses the
    protocol's writer above 1 MiB. The methods `Connection` and `SseStream` use of an asyncio
    transport."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, protocol: Connection
    ) -> None:
        self.loop, self.sock, self.protocol = loop, sock, protocol
        self.fd = sock.fileno()
        self.buffer = bytearray()
        self.closing = False
        self.closed = False
        self.paused = False
        sock.setblocking(False)
        with contextlib.suppress(OSError):  # not Linux: the read time stands in
            sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        protocol.connection_made(self)
        loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(_READ, 256)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.abort()
            return
        if not data:
            self.abort()
            return
        self.protocol.data_received(data, _kernel_stamp(ancillary))

    def write(self, data: bytes) -> None:
        if self.closing:
            return
        if not self.buffer:
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                self.abort()
                return
            if sent == len(data):
                return
            data = data[sent:]
            self.loop.add_writer(self.fd, self._writable)
        self.buffer += data
        if len(self.buffer) > _HIGH_WATER and not self.paused:
            self.paused = True
            self.protocol.pause_writing()

    def _writable(self) -> None:
        try:
            sent = self.sock.send(self.buffer)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.abort()
            return
        del self.buffer[:sent]
        if self.paused and len(self.buffer) < _LOW_WATER:
            self.paused = False
            self.protocol.resume_writing()
        if not self.buffer:
            self.loop.remove_writer(self.fd)
            if self.closing:
                self.abort()

    def is_closing(self) -> bool:
        return self.closing or self.closed

    def close(self) -> None:
        """Close once what is buffered is written."""
        self.closing = True
        if not self.buffer:
            self.abort()

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = self.closing = True
        self.loop.remove_reader(self.fd)
        self.loop.remove_writer(self.fd)
        self.sock.close()
        self.protocol.connection_lost(None)


class Listener:
    """A listening socket accepting onto `SocketTransport`s; `close` stops it and every
    connection it accepted."""

    def __init__(self, server: OpenAIServer, host: str, port: int) -> None:
        self.loop = asyncio.get_running_loop()
        self.server = server
        self.sock = socket.create_server((host, port), reuse_port=False, backlog=1024)
        self.sock.setblocking(False)
        self.transports: set[SocketTransport] = set()
        self.loop.add_reader(self.sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(64):
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, say: the next readiness tries again
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            transport = SocketTransport(self.loop, conn, self.server.protocol())
            self.transports.add(transport)
            self.transports = {t for t in self.transports if not t.closed}

    def close(self) -> None:
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()
        for transport in list(self.transports):
            transport.abort()


def event(chunk: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying `chunk` as its JSON data."""
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def delta_event(model: str, chat: bool, text: str, reasoning: bool = False) -> bytes:
    """An event carrying `text`: content, or reasoning (`delta.reasoning_content` in chat,
    `reasoning` in completions)."""
    if chat:
        delta = {"reasoning_content": text} if reasoning else {"content": text}
        chunk: dict[str, Any] = {
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        }
    else:
        choice: dict[str, Any] = {"index": 0, "text": "" if reasoning else text}
        if reasoning:
            choice["reasoning"] = text
        choice["finish_reason"] = None
        chunk = {"object": "text_completion", "model": model, "choices": [choice]}
    return event(chunk)


def closing_events(
    model: str,
    chat: bool,
    finish_reason: str,
    usage: tuple[int, int] | None,
    done: bool = True,
    timings: dict[str, Any] | None = None,
) -> bytes:
    """The stream's end: the finish reason, then (`usage` = prompt and completion tokens) a
    usage chunk, with the server's `timings` for the request where given (as llama.cpp's
    server sends them), then `[DONE]` unless `done` is false."""
    last: dict[str, Any] = {"index": 0, "finish_reason": finish_reason}
    if chat:
        last["delta"] = {}
    else:
        last["text"] = ""
    tail = event(
        {
            "object": "chat.completion.chunk" if chat else "text_completion",
            "model": model,
            "choices": [last],
        }
    )
    if usage is not None:
        prompt, completion = usage
        counts = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        chunk: dict[str, Any] = {"choices": [], "usage": counts}
        if timings is not None:
            chunk["timings"] = timings
        tail += event(chunk)
    if done:
        tail += b"data: [DONE]\n\n"
    return tail


@dataclass(frozen=True)
class GenerateRequest:
    """What a completion or chat completion asks for."""

    chat: bool
    prompt: str  # a chat's messages' contents, joined by spaces
    max_tokens: int
    include_usage: bool
    user: str | None  # a client matches its records by it
    ignore_eos: bool
    min_tokens: int
    temperature: float
    seed: int | None


def parse_generate(raw: bytes, chat: bool, max_tokens_limit: int) -> GenerateRequest | str:
    """The request in `raw`, or what is wrong with it (a 400's message)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return "the body is not JSON"
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return "messages: a non-empty list is required"
        prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    else:
        given = body.get("prompt")
        if not isinstance(given, str):
            return "prompt: a string is required"
        prompt = given
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        return "max_tokens: an integer is required"
    if not 1 <= max_tokens <= max_tokens_limit:
        return f"max_tokens: between 1 and {max_tokens_limit}"
    if body.get("stream") is not True:
        return "stream: only streaming (true) is served"
    options = body.get("stream_options") or {}
    min_tokens = body.get("min_tokens", 0)
    if not isinstance(min_tokens, int) or isinstance(min_tokens, bool) or min_tokens < 0:
        return "min_tokens: a non-negative integer is required"
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if not isinstance(temperature, int | float) or isinstance(temperature, bool) or temperature < 0:
        return "temperature: a non-negative number is required"
    seed = body.get("seed")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        return "seed: an integer is required"
    user = body.get("user")
    return GenerateRequest(
        chat=chat,
        prompt=prompt,
        max_tokens=max_tokens,
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        user=user if isinstance(user, str) else None,
        ignore_eos=body.get("ignore_eos") is True,
        min_tokens=min(min_tokens, max_tokens),
        temperature=float(temperature),
        seed=seed,
    )


class SseStream:
    """One streamed response on a connection: chunked, each write stamped as it is made."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def write(self, payload: bytes) -> int:
        stamp = time.monotonic_ns()
        transport = self.conn.transport
        if transport is not None and not transport.is_closing():
            transport.write(b"%x\r\n%b\r\n" % (len(payload), payload))
        return stamp

    def close(self) -> None:
        transport = self.conn.transport
        if transport is not None and not transport.is_closing():
            transport.write(b"0\r\n\r\n")
        self.conn.finished()

    def flood(self, tail: bytes, done: Callable[[int], None]) -> None:
        """1 GiB of SSE comments, written as the client takes them, then `tail`."""

        async def pour() -> None:
            comment = b": " + b"x" * 65_534 + b"\n"
            for _ in range((1 << 30) // len(comment)):
                if self.conn.closed:
                    break
                self.write(comment)
                await self.conn.drained()
            done(self.write(tail))
            self.close()

        asyncio.get_running_loop().create_task(pour())


class Connection:
    """One keep-alive connection: requests in turn (no pipelining)."""

    def __init__(self, server: OpenAIServer) -> None:
        import httptools

        self.server = server
        self.transport: SocketTransport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.arrived_ns: int | None = None
        self.url = b""
        self.body = bytearray()
        self.closed = False
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: SocketTransport) -> None:
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def drained(self) -> None:
        await self._writable.wait()

    def data_received(self, data: bytes, stamp: int | None = None) -> None:
        if self.arrived_ns is None:
            # The kernel's receive stamp, else now: before any parsing.
            self.arrived_ns = stamp if stamp is not None else time.monotonic_ns()
        try:
            self.parser.feed_data(data)
        except Exception:  # not HTTP/1.1, or more than one request at a time
            self._abort()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body += body
        if len(self.body) > MAX_REQUEST_BYTES:
            self._abort()

    def on_message_complete(self) -> None:
        arrived = self.arrived_ns if self.arrived_ns is not None else time.monotonic_ns()
        method = self.parser.get_method().decode()
        path = self.url.decode("latin-1").split("?", 1)[0]
        body = bytes(self.body)
        self.url, self.body, self.arrived_ns = b"", bytearray(), None
        self.server.handle(self, method, path, body, arrived)

    def respond(self, status: int, value: Any) -> None:
        self.respond_bytes(status, json.dumps(value).encode(), "application/json")

    def respond_bytes(self, status: int, data: bytes, content_type: str) -> None:
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {content_type}\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(head.encode() + data)
        self.finished()

    def bad(self, message: str) -> None:
        self.respond(400, {"error": {"message": message, "type": "invalid_request_error"}})

    def open_stream(self) -> SseStream:
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        if self.transport is not None:
            self.transport.write(head)
        return SseStream(self)

    def finished(self) -> None:
        if not self.parser.should_keep_alive() and self.transport is not None:
            self.transport.close()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


class OpenAIServer:
    """Routes shared by the reference servers: `POST /v1/completions` and
    `/v1/chat/completions` (to `generate`), `GET /v1/models`, `GET /health`; a subclass's
    `route` answers the rest (False: 404)."""

    model = "optlab"
    max_tokens = 100_000

    def protocol(self) -> Connection:
        return Connection(self)

    def handle(self, conn: Connection, method: str, path: str, body: bytes, arrived: int) -> None:
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            request = parse_generate(body, path.endswith("chat/completions"), self.max_tokens)
            if isinstance(request, str):
                conn.bad(request)
            else:
                self.generate(conn, request, arrived)
        elif path == "/v1/models" and method == "GET":
            conn.respond(200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        elif path == "/health" and method == "GET":
            conn.respond(200, {"status": "ok"})
        elif not self.route(conn, method, path, body):
            conn.respond(404, {"error": {"message": f"no route {method} {path}"}})

    def generate(self, conn: Connection, request: GenerateRequest, arrived: int) -> None:
        raise NotImplementedError

    def route(self, conn: Connection, method: str, path: str, body: bytes) -> bool:
        return False

    async def start(self, host: str, port: int) -> Listener:
        return Listener(self, host, port)

    def stop(self) -> None:
        """Called once the listener is closed."""


def serve_until_signalled(server: OpenAIServer, host: str, port: int, name: str) -> None:
    """Listen on host:port until SIGTERM or SIGINT; the banner is printed once the port is
    bound (whoever started the server may connect from then on)."""

    async def serve() -> None:
        listener = await server.start(host, port)
        print(f"{name}: listening on http://{host}:{port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await stop.wait()
        finally:
            listener.close()
            server.stop()

    asyncio.run(serve())
