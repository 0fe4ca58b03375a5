"""One streamed completion from an OpenAI-compatible endpoint, timed event by event: the client
side of `optlab.metrics.llm` (its definitions are there).

`SseReader` is fed the response body as it arrives, each piece with the time its bytes were
read off the socket (before any parsing); each `data:` line is one event, stamped with the
arrival of the bytes that completed it. The tokens an event carries come from the server's
own count where it streams `usage` with every chunk (vLLM's `continuous_usage_stats`), else
from its text under the target's tokenizer (`words`: the choices' `text`, `delta.content` and
the reasoning fields `delta.reasoning_content`, `delta.reasoning`, `reasoning`, as
whitespace-separated words; `events`: one per event with text), and each request's total is
the final `usage` chunk's `completion_tokens` where the server sent one (docs/run-json.md
"llm" says which the run used). Reasoning counts toward the first token and the length.

What cannot be measured is a `StreamError` with its type, counted by type and kept out of
every latency statistic: `truncated` (the stream ended without `[DONE]`, and without a
`finish_reason` in a response that ended whole: one that had finished is complete at its
last bytes, and counted in the run's `llm.streams_without_done`), `malformed-event`,
`stream-error` (an event with an `error` object), `oversized-event` (one event past
MAX_EVENT_BYTES), `oversized-stream` (a response past MAX_STREAM_BYTES), `exceeded-max-tokens`
(more tokens than `max_tokens` asked for: a server that ignores it), `short-output` (fewer
tokens than asked where `ignore_eos`/`min_tokens` asked for exact lengths) and
`length-shortfall` (`finish_reason: length` with fewer tokens than asked, by the server's own
count).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Literal

from optlab.metrics.llm import StreamTiming

__all__ = [
    "MAX_EVENT_BYTES",
    "MAX_STREAM_BYTES",
    "TOKEN_SOURCES",
    "SseReader",
    "StreamError",
    "StreamResult",
    "count_tokens",
    "read_stream",
    "usage_of",
]

MAX_EVENT_BYTES = 1 << 20  # one event's data: beyond it the stream is refused, not buffered
MAX_STREAM_BYTES = 64 << 20  # one response: a runaway stream is cut off, not read to its end

_TEXT_KEYS = ("text", "content", "reasoning_content", "reasoning")
# `words`, `events`, or a function counting a text's tokens (a tokenizer file's).
Tokenizer = Literal["words", "events"] | Callable[[str], int]
# Where each event's token count came from, by code (`StreamResult.source`).
TOKEN_SOURCES = ("usage", "words", "events", "tokenizer")


class StreamError(ValueError):
    """A stream that cannot be measured; `kind` is its error type (counted by type)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass(frozen=True)
class StreamResult:
    timing: StreamTiming
    usage_tokens: int | None  # the server's own count, when it streamed `usage`
    finish_reason: str | None
    source: str = "words"  # one of TOKEN_SOURCES: where the per-event counts came from


def count_tokens(chunk: dict[str, Any], count: Callable[[str], int] | None = None) -> int:
    """Tokens in one chunk: its choices' text and reasoning, as whitespace-separated words
    (or by `count`, a tokenizer's)."""
    found = 0
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        for source in (choice, choice.get("delta")):
            if not isinstance(source, dict):
                continue
            for key in _TEXT_KEYS:
                value = source.get(key)
                if isinstance(value, str):
                    found += len(value.split()) if count is None else count(value)
    return found


def _has_text(chunk: dict[str, Any]) -> bool:
    for choice in chunk.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        for source in (choice, choice.get("delta")):
            if isinstance(source, dict) and any(
                isinstance(source.get(k), str) and source.get(k) for k in _TEXT_KEYS
            ):
                return True
    return False


def usage_of(chunk: dict[str, Any]) -> int | None:
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        tokens = usage.get("completion_tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
            return tokens
    return None


class SseReader:
    """One response body, fed as it arrives. `feed` never raises: the first failure is kept
    in `error` (the caller stops reading and aborts the connection); `done_ns` is set when
    `[DONE]` arrived; `result` gives the stream's timing or raises its StreamError."""

    __slots__ = (
        "_buffer",
        "_bytes",
        "_counted",
        "_finish",
        "_max_tokens",
        "_exact",
        "_sent_ns",
        "_tokenizer",
        "_usage",
        "_usage_seen",
        "_prompt",
        "_input_tokens",
        "_continuous",
        "done_ns",
        "_without_done",
        "error",
        "events",
    )

    def __init__(
        self,
        sent_ns: int,
        *,
        tokenizer: Tokenizer = "words",
        max_tokens: int | None = None,
        exact: bool = False,
        input_tokens: int | None = None,
    ) -> None:
        self._sent_ns = sent_ns
        self._input_tokens = input_tokens  # the prompt's length as built
        self._prompt: int | None = None  # the server's count of it (usage.prompt_tokens)
        self._tokenizer = tokenizer
        self._max_tokens = max_tokens
        self._exact = exact  # the request asked for exactly max_tokens (ignore_eos, min_tokens)
        self._buffer = b""
        self._bytes = 0
        self._counted = 0  # tokens in the events so far
        self._usage: int | None = None  # the last usage count streamed
        self._usage_seen = 0  # the usage count the token-bearing events have accounted for
        self._continuous = False  # usage came with text chunks: per-event counts from it
        self._finish: str | None = None
        self.events: list[tuple[int, int]] = []  # token-bearing events: (arrival ns, tokens)
        self.done_ns: int | None = None
        self.error: StreamError | None = None
        self._without_done = False

    def feed(self, data: bytes, stamp: int) -> None:
        if self.error is not None or self.done_ns is not None:
            return
        self._bytes += len(data)
        if self._bytes > MAX_STREAM_BYTES:
            self.error = StreamError(
                "oversized-stream", f"the response passed {MAX_STREAM_BYTES >> 20} MiB"
            )
            return
        buffer = self._buffer + data if self._buffer else data
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            self._line(buffer[start:end], stamp)
            start = end + 1
            if self.error is not None or self.done_ns is not None:
                self._buffer = b""
                return
        rest = buffer[start:]
        if len(rest) > MAX_EVENT_BYTES:
            self.error = StreamError(
                "oversized-event", f"an event of more than {MAX_EVENT_BYTES:,} bytes"
            )
            rest = b""
        self._buffer = rest

    def _line(self, raw: bytes, stamp: int) -> None:
        if len(raw) > MAX_EVENT_BYTES:
            self.error = StreamError("oversized-event", f"an event of {len(raw):,} bytes")
            return
        if not raw.startswith(b"data:"):
            return  # blank separators, comments, `event:` and `id:` fields
        data = raw[5:].strip()
        if data == b"[DONE]":
            self.done_ns = stamp
            return
        try:
            chunk = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self.error = StreamError("malformed-event", f"not JSON ({exc})")
            return
        if not isinstance(chunk, dict):
            self.error = StreamError("malformed-event", "an event that is not a JSON object")
            return
        if isinstance(chunk.get("error"), dict):
            message = chunk["error"].get("message", "no message")
            self.error = StreamError("stream-error", str(message)[:500])
            return
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                self._finish = choice["finish_reason"]
        usage = usage_of(chunk)
        prompt = (chunk.get("usage") or {}).get("prompt_tokens") if usage is not None else None
        if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt >= 0:
            self._prompt = prompt
        has_text = _has_text(chunk)
        if usage is not None:
            self._usage = usage
            if has_text:
                self._continuous = True
        if not has_text:
            return
        if self._continuous and usage is not None:
            tokens = max(usage - self._usage_seen, 0)
            self._usage_seen = usage
        elif callable(self._tokenizer):
            tokens = count_tokens(chunk, self._tokenizer)
        elif self._tokenizer == "events":
            tokens = 1
        else:
            tokens = count_tokens(chunk)
        if tokens <= 0:
            return
        self.events.append((stamp, tokens))
        self._counted += tokens
        limit = self._max_tokens
        if limit is not None and self._counted > limit:
            self.error = StreamError(
                "exceeded-max-tokens",
                f"{self._counted} tokens where max_tokens asked for {limit}: the server "
                "ignores max_tokens",
            )

    def body_ended(self, stamp: int) -> None:
        """The HTTP response ended whole (its last chunk, or its length, read) at `stamp`.
        A stream without `[DONE]` that had finished (a `finish_reason` seen, as `transformers
        serve` ends its streams) is complete then; one that had not stays truncated."""
        if self.done_ns is None and self.error is None and self._finish is not None:
            if self._buffer.strip():
                self._line(self._buffer.strip(), stamp)  # a last event without its newline
                self._buffer = b""
            self.done_ns = stamp
            self._without_done = True

    @property
    def source(self) -> str:
        if self._continuous:
            return "usage"
        return "tokenizer" if callable(self._tokenizer) else self._tokenizer

    def result(self) -> StreamResult:
        """The stream's timing (its end: `[DONE]`'s arrival), or its StreamError."""
        if self.error is not None:
            raise self.error
        if self.done_ns is None:
            raise StreamError("truncated", "the stream ended without [DONE]")
        total = self._usage if self._usage is not None else None
        tokens = total if total is not None else self._counted
        limit = self._max_tokens
        if limit is not None and tokens > limit:
            raise StreamError(
                "exceeded-max-tokens",
                f"{tokens} tokens where max_tokens asked for {limit}: the server ignores "
                "max_tokens",
            )
        if limit is not None and tokens < limit:
            if self._exact:
                raise StreamError(
                    "short-output",
                    f"{tokens} tokens where exactly {limit} were asked for (ignore_eos)",
                )
            if self._finish == "length" and total is not None:
                raise StreamError(
                    "length-shortfall",
                    f"finish_reason length after {tokens} of {limit} tokens",
                )
        timing = StreamTiming(
            self._sent_ns,
            self._sent_ns,
            tuple(self.events),
            self.done_ns,
            total,
            self._prompt if self._prompt is not None else self._input_tokens,
            self.source,
            self._without_done,
        )
        return StreamResult(timing, self._usage, self._finish, self.source)


async def read_stream(
    lines: AsyncIterator[bytes], intended_ns: int, sent_ns: int, **options: Any
) -> StreamResult:
    """Time a stream from `lines`, an async iterator of its raw lines (aiohttp's
    `response.content`), each stamped when it is read: `SseReader` on another client."""
    import time

    reader = SseReader(sent_ns, **options)
    try:
        async for raw in lines:
            reader.feed(raw if raw.endswith(b"\n") else raw + b"\n", time.monotonic_ns())
            if reader.error is not None or reader.done_ns is not None:
                break
    except ValueError as exc:  # aiohttp: a line past its reader's limit
        raise StreamError("oversized-event", str(exc)) from None
    found = reader.result()
    timing = found.timing
    shifted = dataclasses.replace(timing, intended_ns=intended_ns, sent_ns=sent_ns)
    return StreamResult(shifted, found.usage_tokens, found.finish_reason, found.source)
