"""The token streamer's timing model (`optlab.reference.streamer`) as a discrete-event
simulation: for a schedule of arrivals, when each sequence's events leave, and from them the
TTFT, ITL and TPOT percentiles and the capacity under token SLOs that a measurement of the
streamer should find, as `optlab.reference.queueing` gives M/M/c's for the synthetic target.

The simulation steps exactly as the streamer's engine does: a step admits the sequences that
have arrived into free slots (arrival order), takes ``decode_base_ms + decode_per_seq_ms x
running + prefill_ms_per_token x (input tokens admitted)`` (plus `stall_ms` when a stall is
due: every `stall_every_s` from `stall_origin_s`), and at its end every running sequence gains
a token; events of `tokens_per_event` leave then. An idle engine starts its next step when a
request arrives. Times are seconds from the schedule's zero; nothing here sleeps.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from optlab.metrics.llm import StreamTiming, figures
from optlab.metrics.stats import percentile
from optlab.reference.streamer import StreamerKnobs

__all__ = [
    "SimRequest",
    "SimResult",
    "poisson_arrivals",
    "saturation_rate",
    "simulate",
    "token_capacity",
]

NS = 1_000_000_000


@dataclass(frozen=True)
class SimRequest:
    arrival_s: float
    input_tokens: int
    max_tokens: int


@dataclass
class _Seq:
    index: int
    request: SimRequest
    generated: int = 0
    pending: int = 0
    events: list[tuple[int, int]] = field(default_factory=list)
    end_ns: int = 0


@dataclass(frozen=True)
class SimResult:
    """Each request's stream as the server would send it (ns from the schedule's zero), its
    origin being its arrival."""

    streams: tuple[StreamTiming, ...]

    def percentiles(self, q: float = 99.0) -> dict[str, float | None]:
        """TTFT, per-event ITL, per-token ITL, request-mean ITL, TPOT and E2E at `q`, ms."""
        found = figures(self.streams)
        return {
            "ttft": percentile(found.ttft_ms, q),
            "itl_event_gap": percentile(found.itl_event_gap_ms, q),
            "itl_token_split": percentile(found.itl_token_split_ms, q),
            "itl_request_mean": percentile(found.itl_request_mean_ms, q),
            "tpot": percentile(found.tpot_ms, q),
            "e2e": percentile(found.e2e_ms, q),
        }


def poisson_arrivals(
    rate: float, n: int, seed: int, input_tokens: int, max_tokens: int
) -> list[SimRequest]:
    """`n` Poisson arrivals at `rate` per second (exponential gaps), the first at its gap."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, size=n))
    return [SimRequest(float(t), input_tokens, max_tokens) for t in times]


def simulate(
    knobs: StreamerKnobs, requests: Sequence[SimRequest], stall_origin_s: float = 0.0
) -> SimResult:
    """The streamer's events for `requests` (in arrival order)."""
    pending = deque(_Seq(i, r) for i, r in enumerate(requests))
    waiting: deque[_Seq] = deque()
    running: list[_Seq] = []
    done: list[_Seq] = []
    every = knobs.stall_every_s
    next_stall = stall_origin_s + every if every is not None else math.inf
    now = 0.0
    while pending or waiting or running:
        if not waiting and not running:
            now = max(now, pending[0].request.arrival_s)
        while pending and pending[0].request.arrival_s <= now:
            waiting.append(pending.popleft())
        admitted = 0
        while waiting and len(running) < knobs.slots:
            seq = waiting.popleft()
            admitted += seq.request.input_tokens
            running.append(seq)
        step_ms = (
            knobs.decode_base_ms
            + knobs.decode_per_seq_ms * len(running)
            + knobs.prefill_ms_per_token * admitted
        )
        if every is not None and now >= next_stall:
            step_ms += knobs.stall_ms
            while next_stall <= now:
                next_stall += every
        now += step_ms / 1000.0
        stamp = round(now * NS)
        for seq in list(running):
            seq.generated += 1
            seq.pending += 1
            finished = seq.generated >= seq.request.max_tokens
            if seq.pending >= knobs.tokens_per_event or finished:
                seq.events.append((stamp, seq.pending))
                seq.pending = 0
            if finished:
                seq.end_ns = stamp
                running.remove(seq)
                done.append(seq)
    done.sort(key=lambda s: s.index)
    streams = tuple(
        StreamTiming(
            round(s.request.arrival_s * NS),
            round(s.request.arrival_s * NS),
            tuple(s.events),
            s.end_ns,
        )
        for s in done
    )
    return SimResult(streams)


def saturation_rate(knobs: StreamerKnobs, input_tokens: int, max_tokens: int) -> float:
    """Requests per second the engine completes with every slot busy: `slots` sequences per
    `max_tokens` steps of base + per-sequence x slots (plus each admission's prefill)."""
    step_ms = knobs.decode_base_ms + knobs.decode_per_seq_ms * knobs.slots
    per_sequence_ms = max_tokens * step_ms + knobs.prefill_ms_per_token * input_tokens
    return knobs.slots / (per_sequence_ms / 1000.0)


def token_capacity(
    knobs: StreamerKnobs,
    *,
    ttft_p99_ms: float | None,
    tpot_p99_ms: float | None,
    input_tokens: int,
    max_tokens: int,
    requests: int = 4000,
    seed: int = 0,
    tolerance: float = 0.002,
) -> float | None:
    """The highest Poisson rate whose simulated P99 TTFT and P99 TPOT (those given) are within
    their bounds, by bisection below the saturation rate; None when even a trickle misses."""

    def meets(rate: float) -> bool:
        found = simulate(
            knobs, poisson_arrivals(rate, requests, seed, input_tokens, max_tokens)
        ).percentiles(99.0)
        ok = True
        if ttft_p99_ms is not None:
            ok &= (found["ttft"] or math.inf) <= ttft_p99_ms
        if tpot_p99_ms is not None:
            ok &= (found["tpot"] or math.inf) <= tpot_p99_ms
        return ok

    high = saturation_rate(knobs, input_tokens, max_tokens)
    low = high * 0.01
    if not meets(low):
        return None
    if meets(high):
        return high
    while (high - low) / high > tolerance:
        middle = (low + high) / 2
        if meets(middle):
            low = middle
        else:
            high = middle
    return low
