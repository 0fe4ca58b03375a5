"""The token streamer (optlab.reference.streamer) served on 127.0.0.1 and read by the SSE reader
(optlab.targets.sse): exact token counts against the server's own log, events of the configured
size, reasoning counted toward the first token, `usage` when asked, a step time that the
server's log shows, and bad requests refused with the OpenAI error shape."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from optlab.metrics.llm import StreamTiming, itl_event_gaps
from optlab.reference.llm_queueing import SimRequest, simulate
from optlab.reference.streamer import Streamer, StreamerKnobs
from optlab.targets.sse import StreamResult, read_stream
from tests.support.proc import free_port

Body = dict[str, Any]


def served(
    knobs: StreamerKnobs, test: Callable[[str, aiohttp.ClientSession], Awaitable[None]]
) -> None:
    """Run `test(base_url, session)` against a streamer with these knobs."""

    async def main() -> None:
        streamer = Streamer(knobs)
        port = free_port()
        server = await streamer.start("127.0.0.1", port)
        try:
            async with aiohttp.ClientSession() as session:
                await test(f"http://127.0.0.1:{port}", session)
        finally:
            server.close()
            streamer.stop()

    asyncio.run(main())


async def stream(session: aiohttp.ClientSession, url: str, body: Body) -> StreamResult:
    sent = time.monotonic_ns()
    async with session.post(url, json={"stream": True, **body}) as response:
        assert response.status == 200, await response.text()
        return await read_stream(response.content, sent, sent)


async def truth(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    async with session.get(f"{base}/truth") as response:
        return {record["id"]: record for record in await response.json()}


def test_token_counts_events_and_usage_match_the_servers_log() -> None:
    knobs = StreamerKnobs(slots=4, decode_base_ms=2.0, tokens_per_event=4)

    async def check(base: str, session: aiohttp.ClientSession) -> None:
        bodies = [{"prompt": "a b c", "max_tokens": n, "user": f"r{n}"} for n in (1, 5, 8, 30)]
        found = await asyncio.gather(
            *(stream(session, f"{base}/v1/completions", body) for body in bodies)
        )
        logged = await truth(session, base)
        for body, result in zip(bodies, found, strict=True):
            record = logged[body["user"]]
            n = body["max_tokens"]
            assert result.timing.tokens == record["output_tokens"] == n
            assert record["input_tokens"] == 3
            # Events of 4 tokens, the last one holding what is left.
            sizes = [k for _, k in result.timing.token_events]
            assert sizes == [4] * (n // 4) + ([n % 4] if n % 4 else []), sizes
            assert [k for _, k in record["events"]] == sizes
            assert result.finish_reason == "length" and result.usage_tokens is None

    served(knobs, check)


def test_chat_reasoning_counts_toward_the_first_token_and_usage_is_streamed() -> None:
    knobs = StreamerKnobs(slots=2, decode_base_ms=1.0, reasoning_tokens=3)

    async def check(base: str, session: aiohttp.ClientSession) -> None:
        body = {
            "messages": [{"role": "user", "content": "why is the sky blue"}],
            "max_tokens": 6,
            "stream_options": {"include_usage": True},
            "user": "chat",
        }
        result = await stream(session, f"{base}/v1/chat/completions", body)
        assert result.timing.tokens == 6 and result.usage_tokens == 6
        record = (await truth(session, base))["chat"]
        assert record["input_tokens"] == 5
        # The first token is a reasoning token: TTFT is its arrival, not the first content's.
        first = result.timing.token_events[0][0]
        assert result.timing.ttft_ns() == first - result.timing.intended_ns

    served(knobs, check)


def test_the_servers_log_shows_its_step_time() -> None:
    # One sequence at a time, 10 ms a step, on the model's clock: no event leaves before its
    # step is due (arrival + k steps), and a late step does not push the schedule back (the
    # next one catches up), so however busy the machine the last event stays near its due
    # time and the gaps centre on the step. (A catch-up shortens the gap after a late one: a
    # slow CI host's median gap was 8.3 ms, so no bound holds for every gap.)
    knobs = StreamerKnobs(slots=1, decode_base_ms=10.0)

    async def check(base: str, session: aiohttp.ClientSession) -> None:
        await stream(
            session, f"{base}/v1/completions", {"prompt": "x", "max_tokens": 20, "user": "u"}
        )
        record = (await truth(session, base))["u"]
        events = tuple((t, n) for t, n in record["events"])
        server = StreamTiming(record["arrived_ns"], record["arrived_ns"], events, record["end_ns"])
        gaps = sorted(itl_event_gaps(server))
        late = [t - record["arrived_ns"] - (k + 1) * 10_000_000 for k, (t, _) in enumerate(events)]
        assert len(gaps) == 19 and sum(gaps) == events[-1][0] - events[0][0], gaps
        assert min(late) >= -50_000 and late[-1] < 50_000_000, late  # never early; no drift
        assert 5e6 < gaps[len(gaps) // 2] < 15e6, gaps

    served(knobs, check)


def test_bad_requests_are_refused_with_the_openai_error_shape() -> None:
    async def check(base: str, session: aiohttp.ClientSession) -> None:
        for body in (
            {"prompt": 5, "stream": True},
            {"prompt": "x", "max_tokens": 0, "stream": True},
            {"prompt": "x", "max_tokens": "many", "stream": True},
            {"prompt": "x", "stream": False},
        ):
            async with session.post(f"{base}/v1/completions", json=body) as response:
                assert response.status == 400
                error = (await response.json())["error"]
                assert error["type"] == "invalid_request_error" and error["message"], body
        async with session.post(f"{base}/v1/chat/completions", data=b"{nope") as response:
            assert response.status == 400

    served(StreamerKnobs(), check)


def test_the_simulation_is_the_servers_model() -> None:
    """The streamer's events for requests arriving at staggered times, against the discrete-
    event simulation of its model given the same arrivals (optlab.reference.llm_queueing)."""
    knobs = StreamerKnobs(slots=2, decode_base_ms=8.0, decode_per_seq_ms=2.0, tokens_per_event=2)
    offsets = [0.0, 0.005, 0.012, 0.03, 0.031, 0.09, 0.2, 0.201, 0.202]

    async def check(base: str, session: aiohttp.ClientSession) -> None:
        async def later(delay: float, k: int) -> None:
            await asyncio.sleep(delay)
            body = {"prompt": "a b c", "max_tokens": 6 + k, "user": f"r{k}"}
            await stream(session, f"{base}/v1/completions", body)

        await asyncio.gather(*(later(d, k) for k, d in enumerate(offsets)))
        logged = await truth(session, base)
        records = [logged[f"r{k}"] for k in range(len(offsets))]
        zero = min(r["arrived_ns"] for r in records)
        order = sorted(range(len(records)), key=lambda k: records[k]["arrived_ns"])
        arrivals = [SimRequest((records[k]["arrived_ns"] - zero) / 1e9, 3, 6 + k) for k in order]
        simulated = simulate(knobs, arrivals).streams
        diffs = []
        for k, sim in zip(order, simulated, strict=True):
            real = [(t - zero, n) for t, n in records[k]["events"]]
            assert [n for _, n in real] == [n for _, n in sim.events]
            diffs += [abs(t - s) / 1e6 for (t, _), (s, _) in zip(real, sim.events, strict=True)]
        # Each event leaves when its step ends, late only by the loop's wake-up (no drift): the
        # median within half the shortest step (8 ms) of the model's, so events sit in their
        # own steps. (Quiet: 0.8-1.0 ms; beside `stress-ng --cpu 8` on 2 cores 1.2-3.0 ms,
        # the worst event 11 ms: a late wake near a boundary moves an arrival's admission.)
        diffs.sort()
        assert diffs[len(diffs) // 2] < 4.0 and diffs[-1] < 30.0, diffs

    served(knobs, check)
