"""A streamed completion's timing: time to first token, inter-token latency under each of the
conventions tools use, time per output token and end-to-end latency, from the arrival time of
each Server-Sent Event and the tokens it carried.

One word, several formulas (the tools that report "ITL" disagree); each is named here by its
definition, and every figure is computed the same way from the server's own send times, so a
measured figure is compared with the truth under the SAME definition:

- ``ttft``: first token-bearing event's arrival minus the origin. The origin is the intended
  send time in an open loop (so the client's own wait for a free connection is inside it), or
  the actual send time (``from_sent``); both are kept, and ``client_wait`` is their difference.
- ``itl_event_gap`` (vLLM, SGLang): every gap between consecutive token-bearing events; an
  event that carries several tokens is ONE gap.
- ``itl_token_split`` (genai-perf): an event's gap since the previous token-bearing event
  divided by the tokens it carried, once per token; the first event's extra tokens arrived with
  the first token and add no gap.
- ``itl_request_mean`` (AIPerf, GuideLLM): per request, (last token's event − first token's
  event) / (tokens − 1).
- ``tpot`` = (E2E − TTFT) / (tokens − 1) per request, E2E ending with the stream (`[DONE]` or
  the close): request-weighted (one value per request) and token-weighted (each request's value
  counted once per token after the first). It differs from the request-mean ITL by the tail
  between the last token and the stream's end.
- ``e2e``: the last event (the stream's end, `[DONE]` or the connection's close) minus the
  origin.

A request with fewer than two tokens has a TTFT and an E2E but no ITL or TPOT. Times are
integer nanoseconds on one monotonic clock (CLOCK_MONOTONIC is shared by every process of a
Linux host, so a server's log on the same host is comparable).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

__all__ = [
    "StreamTiming",
    "TokenFigures",
    "figures",
    "itl_event_gaps",
    "itl_request_mean",
    "itl_token_split",
]


@dataclass(frozen=True)
class StreamTiming:
    """One streamed request as seen by whoever timed it (client or server).

    `events` are (time ns, tokens carried) for every event in arrival order, token-bearing or
    not (a role-only first chunk, a `usage` chunk carry 0); `end_ns` is when the stream ended.
    """

    intended_ns: int
    sent_ns: int
    events: tuple[tuple[int, int], ...]
    end_ns: int

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.events)

    @property
    def token_events(self) -> tuple[tuple[int, int], ...]:
        return tuple((t, n) for t, n in self.events if n > 0)

    def ttft_ns(self, from_sent: bool = False) -> int | None:
        found = self.token_events
        if not found:
            return None
        return found[0][0] - (self.sent_ns if from_sent else self.intended_ns)

    def e2e_ns(self, from_sent: bool = False) -> int:
        return self.end_ns - (self.sent_ns if from_sent else self.intended_ns)

    def tpot_ns(self) -> float | None:
        """(E2E - TTFT) / (tokens - 1): from the first token to the stream's end."""
        found = self.token_events
        n = self.tokens
        if n < 2 or not found:
            return None
        return (self.end_ns - found[0][0]) / (n - 1)


def itl_event_gaps(stream: StreamTiming) -> list[int]:
    """Every gap between consecutive token-bearing events (ns)."""
    times = [t for t, _ in stream.token_events]
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def itl_token_split(stream: StreamTiming) -> list[float]:
    """Each event's gap split over its tokens, once per token (ns); none for the first event."""
    found = stream.token_events
    out: list[float] = []
    for (before, _), (at, n) in zip(found, found[1:], strict=False):
        out.extend([(at - before) / n] * n)
    return out


def itl_request_mean(stream: StreamTiming) -> float | None:
    """(last token's event - first token's event) / (tokens - 1), ns; None under 2 tokens."""
    found = stream.token_events
    n = stream.tokens
    if n < 2 or not found:
        return None
    return (found[-1][0] - found[0][0]) / (n - 1)


@dataclass
class TokenFigures:
    """Every request's figures, in ms, pooled over a set of streams."""

    ttft_ms: list[float] = field(default_factory=list)
    ttft_sent_ms: list[float] = field(default_factory=list)
    client_wait_ms: list[float] = field(default_factory=list)
    itl_event_gap_ms: list[float] = field(default_factory=list)
    itl_token_split_ms: list[float] = field(default_factory=list)
    itl_request_mean_ms: list[float] = field(default_factory=list)
    tpot_ms: list[float] = field(default_factory=list)  # request-weighted
    tpot_token_weighted_ms: list[float] = field(default_factory=list)  # once per token after 1st
    e2e_ms: list[float] = field(default_factory=list)
    output_tokens: int = 0
    events: int = 0  # token-bearing events
    requests: int = 0

    @property
    def tokens_per_event(self) -> float | None:
        return self.output_tokens / self.events if self.events else None


def figures(streams: Iterable[StreamTiming]) -> TokenFigures:
    """The pooled figures of `streams` (ms)."""
    found = TokenFigures()
    for stream in streams:
        found.requests += 1
        found.output_tokens += stream.tokens
        found.events += len(stream.token_events)
        found.e2e_ms.append(stream.e2e_ns() / 1e6)
        ttft = stream.ttft_ns()
        sent = stream.ttft_ns(from_sent=True)
        if ttft is not None and sent is not None:
            found.ttft_ms.append(ttft / 1e6)
            found.ttft_sent_ms.append(sent / 1e6)
            found.client_wait_ms.append((stream.sent_ns - stream.intended_ns) / 1e6)
        found.itl_event_gap_ms.extend(g / 1e6 for g in itl_event_gaps(stream))
        found.itl_token_split_ms.extend(g / 1e6 for g in itl_token_split(stream))
        mean = itl_request_mean(stream)
        if mean is not None:
            found.itl_request_mean_ms.append(mean / 1e6)
        tpot = stream.tpot_ns()
        if tpot is not None:
            found.tpot_ms.append(tpot / 1e6)
            found.tpot_token_weighted_ms.extend([tpot / 1e6] * (stream.tokens - 1))
    return found
