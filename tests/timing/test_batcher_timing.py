"""The dynamic batcher on the real clock: a lone request leaves at max_wait_ms, never before
and not much after. Its logic (full batches never wait, the queue stage is recorded, draining,
shedding) is tested in tests/unit/test_batcher.py. The bound is generous for a busy 2-core
machine (checked beside `stress-ng --cpu 2`); the message prints every figure measured."""

from __future__ import annotations

import statistics
import time
from typing import Any

from optlab.metrics.stages import RequestTiming
from optlab.reference.classifier.batcher import DynamicBatcher


def echo(worker: int, items: list[int], timings: list[RequestTiming]) -> list[int]:
    return items


def test_a_lone_request_leaves_at_max_wait_ms() -> None:
    max_wait_ms = 30.0
    batcher: DynamicBatcher[int, Any] = DynamicBatcher(
        echo, max_batch_size=8, max_wait_ms=max_wait_ms, max_queue=64
    )
    latencies_ms = []
    try:
        for i in range(5):
            start = time.perf_counter_ns()
            assert batcher.submit(i) == i, f"request {i} got another answer"
            latencies_ms.append((time.perf_counter_ns() - start) / 1e6)
    finally:
        batcher.close(timeout_s=5)
    figures = f"max_wait_ms {max_wait_ms:g}; five lone requests took {latencies_ms} ms"
    # Never early: the deadline is taken from the enqueue time, after `start`.
    assert min(latencies_ms) >= max_wait_ms, figures
    # Not much more: the median of five, with room for a busy machine's late wake-ups.
    assert statistics.median(latencies_ms) < max_wait_ms + 50, figures
    assert batcher.batch_sizes() == {1: 5}, figures
