"""A token streamer with exact truth: an OpenAI-compatible streaming server (completions and chat
completions, Server-Sent Events) whose timing is a model set by knobs, and which logs the time it
sent every event, so that a client's TTFT, ITL and TPOT can be checked against the server's own
(`optlab.metrics.llm` computes each convention from either side's times).

The timing model, one engine step at a time (continuous batching):

- at most `slots` sequences run; the others wait in arrival order;
- a step admits waiting sequences into free slots, then takes
  ``decode_base_ms + decode_per_seq_ms x running + prefill_ms_per_token x (input tokens of the
  sequences admitted in it)``; every running sequence gains one token at its end (an admitted
  sequence its first);
- a sequence's tokens leave in events of `tokens_per_event` (its last event may hold fewer);
- every `stall_every_s` of wall time one step takes `stall_ms` longer (a garbage collection, a
  preemption);
- the first `reasoning_tokens` of each answer are sent as reasoning (`delta.reasoning_content`
  in chat, `reasoning` in completions): they count toward the first token and the length.

Steps are scheduled on absolute times (the next step starts when the last one was due to end;
an idle engine's first when a request arrives), so the server's timing does not drift under
load, and `optlab.reference.llm_queueing` simulates it exactly. Tokens are words:
the input length is the prompt's whitespace-separated words; the output is exactly
`max_tokens` words (`ignore_eos` is implied), ` t1 t2 ...`.

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (`stream: true`; with
`stream_options.include_usage` a last chunk carries `usage`), `GET /v1/models`, `GET /health`,
`GET /truth` (every finished request's record: its `user` field as `id`, arrival, each event's
send time and tokens, the stream's end; CLOCK_MONOTONIC ns, shared by every process of the
host), `POST /truth/reset`, `GET /engine` (its knobs, and when it started: the stalls' origin,
for a simulation of the same run).

Run: ``python -m optlab.reference.streamer --port 8100 --slots 8 --decode-base-ms 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["Engine", "Streamer", "StreamerKnobs", "main"]

MODEL = "optlab-streamer"
MAX_TOKENS = 100_000


class StreamerKnobs(BaseModel):
    """The timing model's knobs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    slots: int = Field(8, ge=1, le=4096, description="sequences running at once")
    decode_base_ms: float = Field(20.0, ge=0, le=60_000, description="a step's fixed time")
    decode_per_seq_ms: float = Field(
        0.0, ge=0, le=60_000, description="a step's time per running sequence"
    )
    prefill_ms_per_token: float = Field(
        0.0, ge=0, le=1_000, description="per input token, in the admitting step"
    )
    tokens_per_event: int = Field(1, ge=1, le=1_000, description="tokens an SSE event carries")
    stall_every_s: float | None = Field(None, gt=0, description="a stall this often (wall time)")
    stall_ms: float = Field(0.0, ge=0, le=60_000, description="how long a stall adds to its step")
    reasoning_tokens: int = Field(0, ge=0, le=MAX_TOKENS, description="reasoning tokens first")
    fault: Literal["none", "no-done", "hang", "malformed", "ignore-max-tokens", "flood"] = Field(
        "none",
        description="misbehave on purpose: end streams without [DONE], hold them open without "
        "it, send a malformed event, stream twice max_tokens, or flood (1 GiB per answer)",
    )


@dataclass
class _Sequence:
    """One request inside the engine."""

    arrived_ns: int
    id: str | None  # the request's `user` field: a client matches its records by it
    input_tokens: int
    max_tokens: int
    chat: bool
    include_usage: bool
    stream: _Stream  # where its events are written
    limit: int = 0  # tokens it is given: max_tokens (twice that under ignore-max-tokens)
    generated: int = 0
    pending: int = 0  # generated, not yet sent
    events: list[list[int]] = field(default_factory=list)  # [send ns, tokens], as written


def _event(chunk: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying `chunk` as its JSON data."""
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class Engine:
    """The continuous-batching loop: one asyncio task stepping the model. Each step's events
    are written to their connections as the step ends, each stamped as it is handed to the
    socket: the truth a client's arrival times are compared with."""

    def __init__(self, knobs: StreamerKnobs) -> None:
        self.knobs = knobs
        self.waiting: deque[_Sequence] = deque()
        self.running: list[_Sequence] = []
        self.truth: list[dict[str, Any]] = []
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.started_ns = 0  # the stalls' origin (CLOCK_MONOTONIC)
        self._next_stall_ns: int | None = None

    def submit(self, seq: _Sequence) -> None:
        self.waiting.append(seq)
        self.wake.set()

    async def run(self) -> None:
        knobs = self.knobs
        due = self.started_ns = time.monotonic_ns()
        if knobs.stall_every_s is not None:
            self._next_stall_ns = due + int(knobs.stall_every_s * 1e9)
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                due = time.monotonic_ns()
            admitted = 0
            while self.waiting and len(self.running) < knobs.slots:
                seq = self.waiting.popleft()
                admitted += seq.input_tokens
                self.running.append(seq)
            step_ms = (
                knobs.decode_base_ms
                + knobs.decode_per_seq_ms * len(self.running)
                + knobs.prefill_ms_per_token * admitted
            )
            # On the model's clock: a step that woke late does not push the next one back
            # (its events leave late, stamped as they leave; the schedule stays the model's).
            start = due
            if self._next_stall_ns is not None and start >= self._next_stall_ns:
                step_ms += knobs.stall_ms
                assert knobs.stall_every_s is not None
                while self._next_stall_ns <= start:
                    self._next_stall_ns += int(knobs.stall_every_s * 1e9)
            due = start + int(step_ms * 1e6)
            wait_s = (due - time.monotonic_ns()) / 1e9
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            for seq in list(self.running):
                seq.generated += 1
                seq.pending += 1
                done = seq.generated >= seq.limit
                if seq.pending >= knobs.tokens_per_event or done:
                    self._send(seq)
                if done:
                    self._finish(seq)

    def _send(self, seq: _Sequence) -> None:
        first = seq.generated - seq.pending + 1
        words = " ".join(f"t{k}" for k in range(first, seq.generated + 1))
        reasoning = seq.generated <= self.knobs.reasoning_tokens
        text = " " + words
        if seq.chat:
            delta = {"reasoning_content": text} if reasoning else {"content": text}
            chunk: dict[str, Any] = {
                "object": "chat.completion.chunk",
                "model": MODEL,
                "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
            }
        else:
            choice: dict[str, Any] = {"index": 0, "text": "" if reasoning else text}
            if reasoning:
                choice["reasoning"] = text
            choice["finish_reason"] = None
            chunk = {"object": "text_completion", "model": MODEL, "choices": [choice]}
        payload = _event(chunk)
        if self.knobs.fault == "malformed" and seq.generated == seq.pending:
            payload += b"data: {not json\n\n"  # after the first event
        seq.events.append([seq.stream.write(payload), seq.pending])
        seq.pending = 0

    def _finish(self, seq: _Sequence) -> None:
        self.running.remove(seq)
        last: dict[str, Any] = {"index": 0, "finish_reason": "length"}
        if seq.chat:
            last["delta"] = {}
        else:
            last["text"] = ""
        end = {
            "object": "chat.completion.chunk" if seq.chat else "text_completion",
            "model": MODEL,
            "choices": [last],
        }
        tail = _event(end)
        if seq.include_usage:
            usage = {
                "prompt_tokens": seq.input_tokens,
                "completion_tokens": seq.generated,
                "total_tokens": seq.input_tokens + seq.generated,
            }
            tail += _event({"choices": [], "usage": usage})
        fault = self.knobs.fault
        if fault not in ("no-done", "hang"):
            tail += b"data: [DONE]\n\n"
        if fault == "flood":
            seq.stream.flood(tail, lambda end_ns: self.record(seq, end_ns))
            return
        end_ns = seq.stream.write(tail)
        if fault != "hang":
            seq.stream.close()
        self.record(seq, end_ns)

    def record(self, seq: _Sequence, end_ns: int) -> None:
        """The finished request's truth: its events as written, and the stream's end."""
        self.truth.append(
            {
                "id": seq.id,
                "arrived_ns": seq.arrived_ns,
                "input_tokens": seq.input_tokens,
                "output_tokens": seq.generated,
                "events": seq.events,
                "end_ns": end_ns,
            }
        )


# -- HTTP/1.1 on asyncio's own protocols ---------------------------------------------------------
# A request's arrival is stamped when its first bytes are read off the socket, before anything is
# parsed (a framework's handler starts later: aiohttp's, by 1-15 ms under 32 streams here).

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
MAX_REQUEST_BYTES = 16 << 20


class _Stream:
    """One streamed response on a connection: chunked, each write stamped as it is made."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn

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

    def flood(self, tail: bytes, done: Any) -> None:
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


class _Connection(asyncio.Protocol):
    """One keep-alive connection: requests in turn (no pipelining)."""

    def __init__(self, server: Streamer) -> None:
        import httptools

        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.arrived_ns: int | None = None
        self.url = b""
        self.body = bytearray()
        self.closed = False
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def drained(self) -> None:
        await self._writable.wait()

    def data_received(self, data: bytes) -> None:
        if self.arrived_ns is None:
            self.arrived_ns = time.monotonic_ns()  # before any parsing
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
        data = json.dumps(value).encode()
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        )
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(head.encode() + data)
        self.finished()

    def open_stream(self) -> _Stream:
        head = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        if self.transport is not None:
            self.transport.write(head)
        return _Stream(self)

    def finished(self) -> None:
        if not self.parser.should_keep_alive() and self.transport is not None:
            self.transport.close()

    def _abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()


def _bad(conn: _Connection, message: str) -> None:
    conn.respond(400, {"error": {"message": message, "type": "invalid_request_error"}})


class Streamer:
    """The server: its engine and its routes."""

    def __init__(self, knobs: StreamerKnobs) -> None:
        self.engine = Engine(knobs)

    def protocol(self) -> _Connection:
        return _Connection(self)

    def handle(self, conn: _Connection, method: str, path: str, body: bytes, arrived: int) -> None:
        engine = self.engine
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            self._generate(conn, body, arrived, chat=path.endswith("chat/completions"))
        elif path == "/v1/models" and method == "GET":
            conn.respond(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        elif path == "/health" and method == "GET":
            conn.respond(200, {"status": "ok"})
        elif path == "/truth" and method == "GET":
            conn.respond(200, engine.truth)
        elif path == "/engine" and method == "GET":
            started = {"started_ns": engine.started_ns, "knobs": engine.knobs.model_dump()}
            conn.respond(200, started)
        elif path == "/truth/reset" and method == "POST":
            engine.truth.clear()
            conn.respond(200, {"status": "reset"})
        else:
            conn.respond(404, {"error": {"message": f"no route {method} {path}"}})

    def _generate(self, conn: _Connection, raw: bytes, arrived: int, chat: bool) -> None:
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _bad(conn, "the body is not JSON")
        if not isinstance(body, dict):
            return _bad(conn, "the body is not a JSON object")
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                return _bad(conn, "messages: a non-empty list is required")
            prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        else:
            given = body.get("prompt")
            if not isinstance(given, str):
                return _bad(conn, "prompt: a string is required")
            prompt = given
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
            return _bad(conn, "max_tokens: an integer is required")
        if not 1 <= max_tokens <= MAX_TOKENS:
            return _bad(conn, f"max_tokens: between 1 and {MAX_TOKENS}")
        if body.get("stream") is not True:
            return _bad(conn, "stream: only streaming (true) is served")
        options = body.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        user = body.get("user")
        knobs = self.engine.knobs
        seq = _Sequence(
            arrived,
            user if isinstance(user, str) else None,
            len(prompt.split()),
            max_tokens,
            chat,
            include_usage,
            conn.open_stream(),
            limit=max_tokens * (2 if knobs.fault == "ignore-max-tokens" else 1),
        )
        self.engine.submit(seq)
        return None

    async def start(self, host: str, port: int) -> asyncio.Server:
        """Listen on host:port and start the engine; the server stops the engine on close."""
        loop = asyncio.get_running_loop()
        self.engine.task = loop.create_task(self.engine.run())
        return await loop.create_server(self.protocol, host, port, reuse_address=True)

    def stop(self) -> None:
        if self.engine.task is not None:
            self.engine.task.cancel()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    for name, info in StreamerKnobs.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kind: Any = int if info.annotation is int else float
        if name == "fault":
            kind = str
        parser.add_argument(flag, type=kind, default=info.default, help=info.description)
    args = parser.parse_args(argv)
    knobs = StreamerKnobs(**{name: getattr(args, name) for name in StreamerKnobs.model_fields})

    async def serve() -> None:
        streamer = Streamer(knobs)
        server = await streamer.start(args.host, args.port)
        # Once the port is bound: whoever started the streamer may connect from now on.
        print(f"optlab streamer: listening on http://{args.host}:{args.port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await stop.wait()
        finally:
            server.close()
            streamer.stop()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
