"""A streamed completion's figures (optlab.metrics.llm) on constructed event times, each
convention against its definition worked by hand, and the SSE reader (optlab.targets.sse) on
constructed streams: what it counts, and every way a stream is refused."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from optlab.metrics.llm import (
    StreamTiming,
    figures,
    itl_event_gaps,
    itl_request_mean,
    itl_token_split,
)
from optlab.metrics.stats import percentile
from optlab.targets.sse import StreamError, count_tokens, read_stream

MS = 1_000_000

# Intended at 0, sent at 2 ms (the client waited 2 ms for a connection); a role-only chunk at
# 5 ms, then tokens: 1 at 10 ms, 3 at 30 ms (a chunk of three), 1 at 40 ms; [DONE] at 41 ms.
STREAM = StreamTiming(
    intended_ns=0,
    sent_ns=2 * MS,
    events=((5 * MS, 0), (10 * MS, 1), (30 * MS, 3), (40 * MS, 1)),
    end_ns=41 * MS,
)


def test_each_convention_by_its_definition() -> None:
    assert STREAM.tokens == 5
    assert STREAM.ttft_ns() == 10 * MS  # from the intended send: the client's wait inside
    assert STREAM.ttft_ns(from_sent=True) == 8 * MS
    assert STREAM.e2e_ns() == 41 * MS
    # vLLM/SGLang: one gap per token-bearing event, a chunk of three is one gap.
    assert itl_event_gaps(STREAM) == [20 * MS, 10 * MS]
    # genai-perf: a chunk's gap split over its tokens, once per token.
    assert itl_token_split(STREAM) == pytest.approx([20 / 3 * MS] * 3 + [10 * MS])
    # AIPerf/GuideLLM: (last - first) / (n - 1).
    assert itl_request_mean(STREAM) == pytest.approx(30 / 4 * MS)
    # TPOT: (E2E - TTFT) / (n - 1), to the stream's end.
    assert STREAM.tpot_ns() == pytest.approx(31 / 4 * MS)


def test_pooled_figures_weigh_requests_and_tokens() -> None:
    short = StreamTiming(0, 0, ((4 * MS, 1), (6 * MS, 1)), 6 * MS)  # 2 tokens, TPOT 2 ms
    found = figures([STREAM, short])
    assert found.requests == 2 and found.output_tokens == 7
    assert found.events == 5 and found.tokens_per_event == pytest.approx(7 / 5)
    assert found.ttft_ms == [10.0, 4.0] and found.ttft_sent_ms == [8.0, 4.0]
    assert found.client_wait_ms == [2.0, 0.0]
    assert found.tpot_ms == pytest.approx([7.75, 2.0])  # one per request
    # Token-weighted: the 5-token request counts 4 times, the 2-token one once.
    assert found.tpot_token_weighted_ms == pytest.approx([7.75] * 4 + [2.0])
    assert found.itl_event_gap_ms == pytest.approx([20.0, 10.0, 2.0])


def test_a_request_under_two_tokens_has_no_itl_or_tpot() -> None:
    one = StreamTiming(0, 0, ((3 * MS, 1),), 4 * MS)
    none = StreamTiming(0, 0, ((3 * MS, 0),), 4 * MS)
    found = figures([one, none])
    assert found.ttft_ms == [3.0] and found.e2e_ms == [4.0, 4.0]
    assert not (found.itl_event_gap_ms or found.itl_request_mean_ms or found.tpot_ms)
    assert none.ttft_ns() is None


def test_percentile_matches_linear_interpolation() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([5.0], 99) == 5.0
    assert percentile(list(range(101)), 99) == pytest.approx(99.0)


def _sse(*chunks: Any, done: bool = True) -> list[bytes]:
    lines: list[bytes] = []
    for chunk in chunks:
        data = chunk if isinstance(chunk, bytes) else json.dumps(chunk).encode()
        lines += [b"data: " + data + b"\n", b"\n"]
    if done:
        lines += [b"data: [DONE]\n", b"\n"]
    return lines


async def _lines(items: Sequence[bytes]) -> AsyncIterator[bytes]:
    for item in items:
        yield item


def _read(lines: Sequence[bytes]) -> Any:
    return asyncio.run(read_stream(_lines(lines), 0, 0))


def _chat(**delta: str) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}


def test_the_reader_counts_text_reasoning_and_usage() -> None:
    stream = _sse(
        _chat(role="assistant"),
        _chat(reasoning_content=" think hard"),
        _chat(content=" t1 t2 t3"),
        {"choices": [{"index": 0, "text": " t4", "finish_reason": "length"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}},
    )
    result = _read(stream)
    assert [n for _, n in result.timing.events] == [2, 3, 1]  # token-bearing events only
    assert result.timing.tokens == 6 and result.usage_tokens == 6 and result.source == "words"
    assert result.finish_reason == "length"
    assert count_tokens({"choices": [{"delta": {"reasoning": "a b"}, "text": "c"}]}) == 3


@pytest.mark.parametrize(
    ("lines", "kind"),
    [
        (_sse(_chat(content=" t1"), done=False), "truncated"),
        (_sse(b"{not json"), "malformed-event"),
        (_sse(b"[1, 2]"), "malformed-event"),
        (_sse({"error": {"message": "overloaded"}}), "stream-error"),
        ([b"data: " + b"x" * (1 << 20) + b"\n"], "oversized-event"),
    ],
)
def test_a_stream_that_cannot_be_measured_is_refused_by_type(lines: list[bytes], kind: str) -> None:
    with pytest.raises(StreamError) as refused:
        _read(lines)
    assert refused.value.kind == kind
