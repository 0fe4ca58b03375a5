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
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from optlab.reference.openai_http import (
    Connection,
    GenerateRequest,
    Listener,
    OpenAIServer,
    SseStream,
    closing_events,
    delta_event,
    serve_until_signalled,
)

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
    fault: Literal[
        "none", "no-done", "truncate", "hang", "malformed", "ignore-max-tokens", "flood"
    ] = Field(
        "none",
        description="misbehave on purpose: end streams after their finish_reason without "
        "[DONE], end them after the first event, hold them open without [DONE], send a "
        "malformed event, stream twice max_tokens, or flood (1 GiB per answer)",
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
    stream: SseStream  # where its events are written
    limit: int = 0  # tokens it is given: max_tokens (twice that under ignore-max-tokens)
    generated: int = 0
    pending: int = 0  # generated, not yet sent
    events: list[list[int]] = field(default_factory=list)  # [send ns, tokens], as written


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
        payload = delta_event(MODEL, seq.chat, " " + words, reasoning)
        if self.knobs.fault == "malformed" and seq.generated == seq.pending:
            payload += b"data: {not json\n\n"  # after the first event
        seq.events.append([seq.stream.write(payload), seq.pending])
        seq.pending = 0

    def _finish(self, seq: _Sequence) -> None:
        self.running.remove(seq)
        fault = self.knobs.fault
        if fault == "truncate":  # the response ends whole after its first token: no finish
            seq.stream.close()
            self.record(seq, time.monotonic_ns())
            return
        usage = (seq.input_tokens, seq.generated) if seq.include_usage else None
        tail = closing_events(
            MODEL, seq.chat, "length", usage, done=fault not in ("no-done", "hang")
        )
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


class Streamer(OpenAIServer):
    """The server: its engine and its routes."""

    model = MODEL
    max_tokens = MAX_TOKENS

    def __init__(self, knobs: StreamerKnobs) -> None:
        self.engine = Engine(knobs)

    def route(self, conn: Connection, method: str, path: str, body: bytes) -> bool:
        engine = self.engine
        if path == "/truth" and method == "GET":
            conn.respond(200, engine.truth)
        elif path == "/engine" and method == "GET":
            started = {"started_ns": engine.started_ns, "knobs": engine.knobs.model_dump()}
            conn.respond(200, started)
        elif path == "/truth/reset" and method == "POST":
            engine.truth.clear()
            conn.respond(200, {"status": "reset"})
        else:
            return False
        return True

    def generate(self, conn: Connection, request: GenerateRequest, arrived: int) -> None:
        knobs = self.engine.knobs
        seq = _Sequence(
            arrived,
            request.user,
            len(request.prompt.split()),
            request.max_tokens,
            request.chat,
            request.include_usage,
            conn.open_stream(),
            limit=(
                1
                if knobs.fault == "truncate"
                else request.max_tokens * (2 if knobs.fault == "ignore-max-tokens" else 1)
            ),
        )
        self.engine.submit(seq)

    async def start(self, host: str, port: int) -> Listener:
        """Listen on host:port and start the engine; `stop` stops the engine."""
        loop = asyncio.get_running_loop()
        self.engine.task = loop.create_task(self.engine.run())
        return await super().start(host, port)

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

    serve_until_signalled(Streamer(knobs), args.host, args.port, "optlab streamer")


if __name__ == "__main__":
    main()
