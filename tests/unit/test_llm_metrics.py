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
    LlmTally,
    StreamTiming,
    decoding_beside,
    figures,
    fold_streams,
    itl_event_gaps,
    itl_request_mean,
    itl_token_split,
    line_fit,
)
from optlab.metrics.stats import percentile
from optlab.targets.sse import (
    MAX_STREAM_BYTES,
    SseReader,
    StreamError,
    count_tokens,
    read_stream,
)

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


def test_the_reader_stamps_each_event_with_the_bytes_that_completed_it() -> None:
    body = b"".join(_sse(_chat(content=" a"), _chat(content=" b c"), _chat(content=" d")))
    reader = SseReader(0, tokenizer="words", max_tokens=4)
    # Split mid-event and mid-line: an event's time is when its line's end arrived.
    cut1, cut2 = body.index(b" b c") + 2, body.index(b" d") + 1
    reader.feed(body[:cut1], 10 * MS)
    reader.feed(body[cut1:cut2], 20 * MS)
    reader.feed(body[cut2:], 30 * MS)
    found = reader.result().timing
    assert found.events == ((10 * MS, 1), (20 * MS, 2), (30 * MS, 1))
    assert found.end_ns == 30 * MS and found.tokens == 4


def test_per_chunk_usage_gives_each_events_tokens_and_events_mode_counts_one() -> None:
    usage = [{**_chat(content=" xx"), "usage": {"completion_tokens": n}} for n in (3, 5)]
    reader = SseReader(0, tokenizer="words")
    for line in _sse(*usage):
        reader.feed(line, 1)
    result = reader.result()
    assert [n for _, n in result.timing.events] == [3, 2] and result.source == "usage"
    reader = SseReader(0, tokenizer="events")
    for line in _sse(_chat(content=" a b"), _chat(content=" c")):
        reader.feed(line, 1)
    assert reader.result().timing.tokens == 2 and reader.source == "events"


@pytest.mark.parametrize(
    ("options", "lines", "kind"),
    [
        ({"max_tokens": 2}, _sse(_chat(content=" a b c")), "exceeded-max-tokens"),
        ({"max_tokens": 4, "exact": True}, _sse(_chat(content=" a")), "short-output"),
        (
            {"max_tokens": 4},
            _sse(
                {"choices": [{"text": " a", "finish_reason": "length"}]},
                {"choices": [], "usage": {"completion_tokens": 1}},
            ),
            "length-shortfall",
        ),
    ],
)
def test_answers_of_the_wrong_length_are_refused(
    options: dict[str, Any], lines: list[bytes], kind: str
) -> None:
    reader = SseReader(0, **options)
    for line in lines:
        reader.feed(line, 1)
    with pytest.raises(StreamError) as refused:
        reader.result()
    assert refused.value.kind == kind


def test_a_runaway_stream_is_cut_off_without_being_kept() -> None:
    reader = SseReader(0)
    comment = b": " + b"x" * (1 << 16) + b"\n"  # SSE comments: bytes without a token
    fed = 0
    while reader.error is None:
        reader.feed(comment, 1)
        fed += 1
    assert reader.error.kind == "oversized-stream" and fed == MAX_STREAM_BYTES // len(comment) + 1


def test_folding_streams_takes_each_requests_origin_and_judges_goodput() -> None:
    tally = LlmTally()
    # Two requests: intended at 0 and 100 ms; the second sent 30 ms late (the client waited).
    quick = StreamTiming(0, 0, ((10 * MS, 1), (20 * MS, 1), (30 * MS, 1)), 31 * MS, 3, 5, "words")
    late = StreamTiming(0, 130 * MS, ((150 * MS, 2), (190 * MS, 2)), 200 * MS, None, 5, "words")
    series = fold_streams([quick, late], [0, 100 * MS], tally)
    assert series["llm.ttft"] == [10 * MS, 50 * MS]
    assert series["llm.ttft_sent"] == [10 * MS, 20 * MS]
    assert series["llm.client_wait"] == [0, 30 * MS]
    assert series["llm.itl_event_gap"] == [10 * MS, 10 * MS, 40 * MS]
    assert series["llm.itl_token_split"] == [10 * MS, 10 * MS, 20 * MS, 20 * MS]
    assert series["llm.tpot"] == [round(21 * MS / 2), round(50 * MS / 3)]
    assert len(series["llm.tpot_token_weighted"]) == 2 + 3
    assert series["llm.e2e"] == [31 * MS, 100 * MS]
    assert (tally.requests, tally.output_tokens, tally.token_events) == (2, 7, 5)
    assert tally.totals_from_usage == 1 and tally.input_tokens == 10
    assert tally.goodput(20.0, None) == 0.5  # the late one's TTFT is 50 ms
    assert tally.goodput(None, 12.0) == 0.5  # its TPOT is 16.7 ms
    assert tally.goodput(100.0, 100.0) == 1.0 and tally.goodput(None, None) is None


def test_a_tokenizers_count_replaces_the_words_where_usage_is_not_streamed() -> None:
    def chars(text: str) -> int:
        return len(text.strip())

    chunk = {"choices": [{"delta": {"content": " ab", "reasoning": "cde"}}]}
    assert count_tokens(chunk, chars) == 5 and count_tokens(chunk) == 2
    reader = SseReader(0, tokenizer=chars)
    for line in _sse(_chat(content=" t1 t2"), _chat(content=" t3")):
        reader.feed(line, 1)
    result = reader.result()
    assert [n for _, n in result.timing.events] == [5, 2] and result.source == "tokenizer"


def _tally(verdicts: list[bool]) -> LlmTally:
    """Requests whose TTFT is 10 ms (good under 50 ms) or 100 ms (bad), in this order."""
    import numpy as np

    tally = LlmTally()
    rows = [(10_000_000 if ok else 100_000_000, -1, -1, 0, 0, 0, -1) for ok in verdicts]
    tally.rows.append(np.asarray(rows, dtype=np.int64))
    return tally


def test_the_goodput_interval_is_wilsons_or_wider_where_misses_come_in_runs() -> None:
    from scipy.stats import binomtest

    scattered = [k % 10 != 0 for k in range(400)]  # 10% bad, spread evenly
    found = _tally(scattered).goodput_interval(50.0, None)
    wilson = binomtest(360, 400).proportion_ci(confidence_level=0.99, method="wilson")
    assert found == pytest.approx((wilson.low, wilson.high), abs=1e-9)
    # The same 10% bad in four runs of 10 (a stall behind a queue): a wider interval.
    bunched = [not (k % 100 < 10) for k in range(400)]
    low, high = _tally(bunched).goodput_interval(50.0, None) or (0.0, 0.0)
    assert high - low > wilson.high - wilson.low and low < 0.9 < high
    all_good = _tally([True] * 400).goodput_interval(50.0, None)
    assert all_good is not None and all_good[1] == 1.0 and 0.97 < all_good[0] < 1.0
    assert _tally([True] * 5).goodput_interval(50.0, None) is None  # too few to say
    assert _tally(scattered).goodput_interval(None, None) is None  # no bound


def test_decoding_beside_is_the_mean_count_of_open_decode_spans_over_each_span() -> None:
    import numpy as np

    rng = np.random.default_rng(7)
    starts = np.sort(rng.integers(0, 1_000, 60))
    ends = starts + rng.integers(0, 200, 60)
    starts[5], ends[5] = 300, 300  # a one-token answer: a span of no length
    found = decoding_beside(starts, ends)
    # Brute force on the unit grid: the count of spans open over each nanosecond of a span.
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        if e == s:
            assert found[i] == 1.0
            continue
        grid = np.arange(s, e) + 0.5
        open_count = ((starts[:, None] <= grid) & (grid < ends[:, None])).sum(axis=0)
        assert found[i] == pytest.approx(open_count.mean(), rel=1e-12)


def test_line_fit_is_ordinary_least_squares_and_needs_a_spread() -> None:
    import numpy as np
    from scipy.stats import linregress

    rng = np.random.default_rng(3)
    x = rng.integers(16, 512, 200).astype(float)
    y = 4.0 + 0.5 * x + rng.normal(0, 20, 200)
    fit = line_fit(x, y)
    truth = linregress(x, y)
    assert fit is not None
    assert fit["slope"] == pytest.approx(truth.slope) and fit["intercept"] == pytest.approx(
        truth.intercept
    )
    assert fit["r2"] == pytest.approx(truth.rvalue**2)
    assert (fit["x_min"], fit["x_max"], fit["requests"]) == (x.min(), x.max(), 200)
    assert line_fit(np.full(200, 64.0), y) is None  # one prompt length: nothing to relate
    assert line_fit(x[:29], y[:29]) is None  # too few requests
