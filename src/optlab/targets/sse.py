"""One streamed completion from an OpenAI-compatible endpoint, timed event by event: the client
side of `optlab.metrics.llm` (its definitions are there).

Each Server-Sent Event is stamped when its line is read off the connection, before its JSON is
parsed; the tokens it carries are counted from its text (choices' `text`, `delta.content`, and
the reasoning fields `delta.reasoning_content`, `delta.reasoning`, `reasoning`, which count
toward the first token and the length) as whitespace-separated words, unless a `usage` chunk
says otherwise for the whole answer (then `usage_tokens` holds it and the run says which it
used). A stream that ends without `[DONE]`, an HTTP error, a malformed event and an event with an
`error` object are each a `StreamError` with its type; nothing of such a stream enters the
latency statistics.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from optlab.metrics.llm import StreamTiming

__all__ = [
    "MAX_EVENT_BYTES",
    "StreamError",
    "StreamResult",
    "count_tokens",
    "read_stream",
    "usage_of",
]

MAX_EVENT_BYTES = 1 << 20  # one event's data: beyond it the stream is refused, not buffered

_TEXT_KEYS = ("text", "content", "reasoning_content", "reasoning")


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


def count_tokens(chunk: dict[str, Any]) -> int:
    """Tokens in one chunk: its choices' text and reasoning, as whitespace-separated words."""
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
                    found += len(value.split())
    return found


async def read_stream(lines: Any, intended_ns: int, sent_ns: int) -> StreamResult:
    """Time a stream from `lines`, an async iterator of its raw lines (aiohttp's
    `response.content`): `[DONE]` ends it; the connection closing before then is `truncated`."""
    try:
        return await _read(lines, intended_ns, sent_ns)
    except ValueError as exc:  # aiohttp: a line past its reader's limit
        if isinstance(exc, StreamError):
            raise
        raise StreamError("oversized-event", str(exc)) from None


async def _read(lines: Any, intended_ns: int, sent_ns: int) -> StreamResult:
    events: list[tuple[int, int]] = []
    usage: int | None = None
    finish: str | None = None
    async for raw in lines:
        stamp = time.monotonic_ns()
        if len(raw) > MAX_EVENT_BYTES:
            raise StreamError("oversized-event", f"an event of {len(raw):,} bytes")
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # blank separators, comments, `event:` and `id:` fields
        data = line[5:].strip()
        if data == b"[DONE]":
            timing = StreamTiming(intended_ns, sent_ns, tuple(events), stamp)
            return StreamResult(timing, usage, finish)
        try:
            chunk = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise StreamError("malformed-event", f"not JSON ({exc})") from None
        if not isinstance(chunk, dict):
            raise StreamError("malformed-event", "an event that is not a JSON object")
        if isinstance(chunk.get("error"), dict):
            message = chunk["error"].get("message", "no message")
            raise StreamError("stream-error", str(message)[:500])
        counted = usage_of(chunk)
        if counted is not None:
            usage = counted
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict) and isinstance(choice.get("finish_reason"), str):
                finish = choice["finish_reason"]
        events.append((stamp, count_tokens(chunk)))
    raise StreamError("truncated", "the stream ended without [DONE]")


def usage_of(chunk: dict[str, Any]) -> int | None:
    usage = chunk.get("usage")
    if isinstance(usage, dict):
        tokens = usage.get("completion_tokens")
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
            return tokens
    return None
