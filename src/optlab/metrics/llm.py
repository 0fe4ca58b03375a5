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

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

from optlab.metrics.stages import LLM_PREFIX
from optlab.metrics.stats import batch_means

__all__ = [
    "LLM_SERIES",
    "LlmTally",
    "StreamTiming",
    "decoding_beside",
    "fold_streams",
    "is_llm_series",
    "TokenFigures",
    "figures",
    "itl_event_gaps",
    "itl_request_mean",
    "itl_token_split",
    "line_fit",
]


@dataclass(frozen=True)
class StreamTiming:
    """One streamed request as seen by whoever timed it (client or server).

    `events` are (time ns, tokens carried) in arrival order (events that carry no token, a
    role-only first chunk or a `usage` chunk, may be among them with 0); `end_ns` is when the
    stream ended. `total_tokens` is the server's own count of the answer (its `usage`) where
    it gave one; the events' sum otherwise.
    """

    intended_ns: int
    sent_ns: int
    events: tuple[tuple[int, int], ...]
    end_ns: int
    total_tokens: int | None = None
    input_tokens: int | None = None  # the prompt's tokens: the server's usage, else as built
    source: str | None = None  # where the events' token counts came from (`optlab.targets.sse`)
    # Ended without `[DONE]`: the response ended whole after a finish_reason (end_ns is then
    # its last bytes' arrival), as `transformers serve` ends its streams.
    without_done: bool = False

    @property
    def tokens(self) -> int:
        if self.total_tokens is not None:
            return self.total_tokens
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
    """The pooled figures of `streams` (ms), each from its own intended send: what
    `fold_streams` gives a run, read back in ms."""
    found = list(streams)
    tally = LlmTally()
    series = fold_streams(found, [s.intended_ns for s in found], tally)

    def ms(name: str) -> list[float]:
        return [value / 1e6 for value in series[name]]

    return TokenFigures(
        ttft_ms=ms(TTFT),
        ttft_sent_ms=ms(TTFT_SENT),
        client_wait_ms=ms(CLIENT_WAIT),
        itl_event_gap_ms=ms(ITL_EVENT_GAP),
        itl_token_split_ms=ms(ITL_TOKEN_SPLIT),
        itl_request_mean_ms=ms(ITL_REQUEST_MEAN),
        tpot_ms=ms(TPOT),
        tpot_token_weighted_ms=ms(TPOT_TOKEN_WEIGHTED),
        e2e_ms=ms(E2E),
        output_tokens=tally.output_tokens,
        events=tally.token_events,
        requests=tally.requests,
    )


# -- a run's streams, folded as they complete (`optlab.metrics.log.Collector`) -------------------

# The histograms a streaming run adds beside "total" (which is its E2E), each named by its
# definition above (docs/run-json.md "llm"); stored with the run's other series.
TTFT, TTFT_SENT, CLIENT_WAIT = "llm.ttft", "llm.ttft_sent", "llm.client_wait"
ITL_EVENT_GAP, ITL_TOKEN_SPLIT, ITL_REQUEST_MEAN = (
    "llm.itl_event_gap",
    "llm.itl_token_split",
    "llm.itl_request_mean",
)
TPOT, TPOT_TOKEN_WEIGHTED, E2E = "llm.tpot", "llm.tpot_token_weighted", "llm.e2e"
LLM_SERIES = (
    TTFT,
    TTFT_SENT,
    CLIENT_WAIT,
    ITL_EVENT_GAP,
    ITL_TOKEN_SPLIT,
    ITL_REQUEST_MEAN,
    TPOT,
    TPOT_TOKEN_WEIGHTED,
    E2E,
)


def is_llm_series(name: str) -> bool:
    return name.startswith(LLM_PREFIX)


# The columns of a tally's per-request rows (int64 ns, -1 where a request has none): its TTFT
# from the origin and from the send, its TPOT, its prompt's tokens, the arrival of its first
# token and its stream's end on the run's clock (its decode: the span between them), and the
# median of its per-token ITL (its typical decode step: a stall, another's prefill, moves a
# mean but not the median).
ROW_TTFT, ROW_TPOT, ROW_INPUT, ROW_TTFT_SENT, ROW_FIRST, ROW_END, ROW_ITL_MEDIAN = range(7)
ROW_COLUMNS = 7


@dataclass
class LlmTally:
    """A phase's streams beyond their histograms: counts, and one row per request that had a
    first token (the ROW_* columns) for goodput under any bound and for the lines that relate
    TTFT to the prompt's length and ITL to the sequences decoding beside it."""

    requests: int = 0
    output_tokens: int = 0
    input_tokens: int = 0
    token_events: int = 0
    totals_from_usage: int = 0  # requests whose length is the server's own count
    sources: dict[str, int] = field(default_factory=dict)  # per-event counts: from where
    rows: list[Any] = field(default_factory=list)  # int64 arrays of (n, ROW_COLUMNS): ROW_*
    without_done: int = 0  # streams that ended whole after a finish_reason, without [DONE]

    def copy(self) -> LlmTally:
        return LlmTally(
            self.requests,
            self.output_tokens,
            self.input_tokens,
            self.token_events,
            self.totals_from_usage,
            dict(self.sources),
            list(self.rows),
            self.without_done,
        )

    def _good(self, ttft_ms: float | None, tpot_ms: float | None) -> Any:
        """Each request's verdict under the bounds (a bool array, in the order folded); None
        with no bound, or no request."""
        import numpy as np

        if ttft_ms is None and tpot_ms is None:
            return None
        rows = self.table()
        if rows is None:
            return None
        good = np.ones(len(rows), dtype=bool)
        if ttft_ms is not None:
            good &= rows[:, ROW_TTFT] <= ttft_ms * 1e6
        if tpot_ms is not None:
            # A one-token answer has no TPOT: nothing of it can miss a TPOT bound.
            tpot = rows[:, ROW_TPOT]
            good &= (tpot < 0) | (tpot <= tpot_ms * 1e6)
        return good

    def table(self) -> Any:
        """Every row, in the order folded (int64, shape (n, ROW_COLUMNS)); None with none."""
        import numpy as np

        if not self.rows:
            return None
        if len(self.rows) > 1:  # the folds' arrays joined once, not once per figure read
            self.rows = [np.concatenate(self.rows)]
        rows = self.rows[0]
        return rows if rows.size else None

    def ttft_by_input(self) -> dict[str, float] | None:
        """TTFT from the send (ms) against the prompt's tokens, a least-squares line over the
        requests whose prompt length is known (`line_fit`): prefill's share of the first
        token shows as its slope; None where fewer than 30 requests or one prompt length."""
        rows = self.table()
        if rows is None:
            return None
        known = rows[rows[:, ROW_INPUT] >= 0]
        return line_fit(known[:, ROW_INPUT], known[:, ROW_TTFT_SENT] / 1e6)

    def itl_by_running(self) -> dict[str, float] | None:
        """Each request's median per-token ITL (ms) against the sequences decoding while it
        decoded (itself included: `decoding_beside`), a least-squares line (`line_fit`) over
        the requests with two tokens or more: a decode step's cost per running sequence,
        where another's prefill stalling the batch moves the median little; None where
        fewer than 30 or the count never varied."""
        rows = self.table()
        if rows is None:
            return None
        running = decoding_beside(rows[:, ROW_FIRST], rows[:, ROW_END])
        has = rows[:, ROW_ITL_MEDIAN] >= 0
        return line_fit(running[has], rows[has, ROW_ITL_MEDIAN] / 1e6)

    def goodput(self, ttft_ms: float | None, tpot_ms: float | None) -> float | None:
        """The share of requests whose TTFT and TPOT are within the bounds given; None with no
        bound, or no request."""
        good = self._good(ttft_ms, tpot_ms)
        return None if good is None else float(good.mean())

    def goodput_interval(
        self, ttft_ms: float | None, tpot_ms: float | None, confidence: float = 0.99
    ) -> tuple[float, float] | None:
        """The goodput's interval: the wider of Wilson's score interval (requests taken as
        independent) and batch means over consecutive requests (which widens it where good
        and bad requests come in runs, as they do behind a queue); None below 10 requests."""
        good = self._good(ttft_ms, tpot_ms)
        if good is None or len(good) < 10:
            return None
        n, share = len(good), float(good.mean())
        z = NormalDist().inv_cdf(0.5 + confidence / 2)
        centre = (share + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        low, high = centre - half, centre + half
        batched = batch_means([float(v) for v in good], confidence=confidence)
        if batched is not None and batched.high - batched.low > high - low:
            low, high = batched.low, batched.high
        return max(0.0, low), min(1.0, high)


def fold_streams(
    streams: Sequence[StreamTiming],
    origins: Sequence[int],
    tally: LlmTally,
    each: list[tuple[int, int, int]] | None = None,
) -> dict[str, list[int]]:
    """Each stream's values (ns) by series, its origin being its request's (the intended send
    in an open loop, the send otherwise); the counts go into `tally`, and where `each` is
    given, every stream's (TTFT, TPOT, output tokens) in order (-1: none) into it."""
    out: dict[str, list[int]] = {name: [] for name in LLM_SERIES}
    rows: list[tuple[int, ...]] = []
    for given, origin in zip(streams, origins, strict=True):
        # The definitions above, from the request's origin.
        stream = given if given.intended_ns == origin else replace(given, intended_ns=origin)
        tokens = stream.tokens
        tally.requests += 1
        tally.output_tokens += tokens
        tally.input_tokens += stream.input_tokens or 0
        tally.token_events += len(stream.token_events)
        if stream.total_tokens is not None:
            tally.totals_from_usage += 1
        tally.without_done += stream.without_done
        source = stream.source or "events"
        tally.sources[source] = tally.sources.get(source, 0) + 1
        out[E2E].append(stream.e2e_ns())
        ttft = stream.ttft_ns()
        if ttft is None:
            if each is not None:
                each.append((-1, -1, tokens))
            continue
        wait = stream.sent_ns - origin
        out[TTFT].append(ttft)
        out[TTFT_SENT].append(ttft - wait)
        out[CLIENT_WAIT].append(wait)
        out[ITL_EVENT_GAP].extend(itl_event_gaps(stream))
        split = [round(gap) for gap in itl_token_split(stream)]
        out[ITL_TOKEN_SPLIT].extend(split)
        mean, tpot_ns = itl_request_mean(stream), stream.tpot_ns()
        tpot = -1
        if mean is not None and tpot_ns is not None:
            out[ITL_REQUEST_MEAN].append(round(mean))
            tpot = round(tpot_ns)
            out[TPOT].append(tpot)
            out[TPOT_TOKEN_WEIGHTED].extend([tpot] * (tokens - 1))
        given_input = stream.input_tokens if stream.input_tokens is not None else -1
        median = sorted(split)[len(split) // 2] if split else -1
        rows.append((ttft, tpot, given_input, ttft - wait, origin + ttft, stream.end_ns, median))
        if each is not None:
            each.append((ttft, tpot, tokens))
    if rows:
        import numpy as np

        tally.rows.append(np.asarray(rows, dtype=np.int64))
    return out


MIN_FIT_REQUESTS = 30


def line_fit(x: Any, y: Any) -> dict[str, float] | None:
    """The least-squares line y = intercept + slope * x over paired samples, with its R² (the
    share of y's variance the line explains) and x's range and mean (docs/run-json.md "llm");
    None under MIN_FIT_REQUESTS samples or where x never varies."""
    import numpy as np

    xs, ys = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xs.size < MIN_FIT_REQUESTS:
        return None
    x_mean, y_mean = float(xs.mean()), float(ys.mean())
    dx, dy = xs - x_mean, ys - y_mean
    sxx, syy = float(dx @ dx), float(dy @ dy)
    if sxx <= 1e-12 * max(1.0, x_mean * x_mean) * xs.size:
        return None
    slope = float(dx @ dy) / sxx
    r2 = (slope * slope * sxx / syy) if syy > 0 else 0.0
    return {
        "requests": int(xs.size),
        "slope": slope,
        "intercept": y_mean - slope * x_mean,
        "r2": min(1.0, r2),
        "x_min": float(xs.min()),
        "x_mean": x_mean,
        "x_max": float(xs.max()),
        "y_mean": y_mean,
    }


def decoding_beside(first_ns: Any, end_ns: Any) -> Any:
    """For each request, the mean number of requests decoding (between their first token and
    their stream's end, itself included) over its own decode: the integral of the count of
    open decode spans over [first, end], divided by its length; 1.0 for a zero-length span.
    Exact, from a sweep over every span's start and end (O(n log n))."""
    import numpy as np

    starts, ends = np.asarray(first_ns, dtype=np.int64), np.asarray(end_ns, dtype=np.int64)
    times = np.concatenate([starts, ends])
    steps = np.concatenate([np.ones(starts.size), -np.ones(ends.size)])
    order = np.argsort(times, kind="stable")
    times, steps = times[order], steps[order]
    open_after = np.cumsum(steps)  # spans open just after each breakpoint
    # The integral of the open count from the first breakpoint to each breakpoint.
    area = np.concatenate([[0.0], np.cumsum(open_after[:-1] * np.diff(times).astype(np.float64))])

    def integral(at: Any) -> Any:
        # The last breakpoint at or before `at`, plus the open count since (the count after
        # every breakpoint at that instant, so ties count whole).
        index = np.searchsorted(times, at, side="right") - 1
        return area[index] + open_after[index] * (at - times[index])

    span = (ends - starts).astype(np.float64)
    covered = integral(ends) - integral(starts)
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(span > 0, covered / np.where(span > 0, span, 1.0), 1.0)
    return mean
