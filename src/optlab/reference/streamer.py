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

Steps are scheduled on absolute times (the next step starts when the last one was due to end,
never later than now), so the server's timing does not drift under load. Tokens are words:
the input length is the prompt's whitespace-separated words; the output is exactly
`max_tokens` words (`ignore_eos` is implied), ` t1 t2 ...`.

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (`stream: true`; with
`stream_options.include_usage` a last chunk carries `usage`), `GET /v1/models`, `GET /health`,
`GET /truth` (every finished request's record: its `user` field as `id`, arrival, each event's
send time and tokens, the stream's end; CLOCK_MONOTONIC ns, shared by every process of the
host), `POST /truth/reset`.

Run: ``python -m optlab.reference.streamer --port 8100 --slots 8 --decode-base-ms 20``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

__all__ = ["StreamerKnobs", "make_app", "main"]

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
    queue: asyncio.Queue[tuple[bytes, int] | None]  # (payload, tokens it carries); None: ended
    limit: int = 0  # tokens it is given: max_tokens (twice that under ignore-max-tokens)
    generated: int = 0
    pending: int = 0  # generated, not yet sent
    events: list[list[int]] = field(default_factory=list)  # [send ns, tokens], as written


def _event(chunk: dict[str, Any]) -> bytes:
    """One Server-Sent Event carrying `chunk` as its JSON data."""
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


class Engine:
    """The continuous-batching loop: one asyncio task stepping the model."""

    def __init__(self, knobs: StreamerKnobs) -> None:
        self.knobs = knobs
        self.waiting: deque[_Sequence] = deque()
        self.running: list[_Sequence] = []
        self.truth: list[dict[str, Any]] = []
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self._next_stall_ns: int | None = None

    def submit(self, seq: _Sequence) -> None:
        self.waiting.append(seq)
        self.wake.set()

    async def run(self) -> None:
        knobs = self.knobs
        due = time.monotonic_ns()
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
            start = max(due, time.monotonic_ns())
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
        if self.knobs.fault == "malformed" and seq.generated == seq.pending + 1:
            payload += b"data: {not json\n\n"  # after the first event
        seq.queue.put_nowait((payload, seq.pending))
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
        if fault == "flood":
            flood = b": " + b"x" * 65_536 + b"\n"  # SSE comments: bytes, no token
            for _ in range((1 << 30) // len(flood)):
                seq.queue.put_nowait((flood, 0))
        if fault not in ("no-done", "hang"):
            tail += b"data: [DONE]\n\n"
        seq.queue.put_nowait((tail, 0))
        if fault != "hang":
            seq.queue.put_nowait(None)

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


ENGINE = web.AppKey("engine", Engine)


def _bad(message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error"}}
    return web.json_response(body, status=400)


async def _generate(request: web.Request, chat: bool) -> web.StreamResponse:
    arrived = time.monotonic_ns()
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _bad("the body is not JSON")
    if not isinstance(body, dict):
        return _bad("the body is not a JSON object")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _bad("messages: a non-empty list is required")
        prompt = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
    else:
        given = body.get("prompt")
        if not isinstance(given, str):
            return _bad("prompt: a string is required")
        prompt = given
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 16))
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool):
        return _bad("max_tokens: an integer is required")
    if not 1 <= max_tokens <= MAX_TOKENS:
        return _bad(f"max_tokens: between 1 and {MAX_TOKENS}")
    if body.get("stream") is not True:
        return _bad("stream: only streaming (true) is served")
    options = body.get("stream_options") or {}
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    queue: asyncio.Queue[tuple[bytes, int] | None] = asyncio.Queue()
    user = body.get("user")
    seq = _Sequence(
        arrived,
        user if isinstance(user, str) else None,
        len(prompt.split()),
        max_tokens,
        chat,
        include_usage,
        queue,
    )
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    engine = request.app[ENGINE]
    seq.limit = max_tokens * (2 if engine.knobs.fault == "ignore-max-tokens" else 1)
    engine.submit(seq)
    end = arrived
    while (item := await queue.get()) is not None:
        payload, tokens = item
        # The send time is taken as the bytes are handed to the socket: the truth a client's
        # arrival times are compared with.
        stamp = time.monotonic_ns()
        await response.write(payload)
        if tokens:
            seq.events.append([stamp, tokens])
        else:
            end = stamp
    await response.write_eof()
    engine.record(seq, end)
    return response


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, chat=True)


async def models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def truth(request: web.Request) -> web.Response:
    return web.json_response(request.app[ENGINE].truth)


async def reset_truth(request: web.Request) -> web.Response:
    request.app[ENGINE].truth.clear()
    return web.json_response({"status": "reset"})


def make_app(knobs: StreamerKnobs) -> web.Application:
    """The streamer's application; its engine starts with the application."""
    app = web.Application()

    async def start(app: web.Application) -> Any:
        engine = Engine(knobs)
        app[ENGINE] = engine
        engine.task = asyncio.get_running_loop().create_task(engine.run())
        yield
        engine.task.cancel()

    app.cleanup_ctx.append(start)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/truth", truth)
    app.router.add_post("/truth/reset", reset_truth)
    return app


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
    listening = f"optlab streamer: listening on http://{args.host}:{args.port}"
    web.run_app(
        make_app(knobs),
        host=args.host,
        port=args.port,
        print=lambda _: print(listening, flush=True),  # once the port is bound
    )


if __name__ == "__main__":
    main()
