"""Three more labelled targets for `optlab diagnose`'s benchmark, of kinds its first scenarios
missed (a garbage collector busy with the target's objects, a pool of one worker, a stage that
only sleeps); `optlab.reference.faults` re-exports them, so their factories are named there:

- `gc_churn`: each request builds cyclic garbage beside a large heap of live objects, so the
  collector runs often and its full collections walk the whole heap (pauses of tens to hundreds
  of ms, every thread stopped).
- `pool_of_one`: every request hands its numpy computation to a thread pool of ONE worker and
  waits for it in `infer`: one request at a time, one core busy, the others idle.
- `sleep_stage`: `infer` is a plain `time.sleep` of a few ms and nothing else: a fixed service
  time with no queue, healthy at any concurrency (the harness's own CPU is not the target's).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt

from optlab.metrics.stages import stage
from optlab.reference.fault_target import FaultTarget, knob

__all__ = ["GcChurn", "PoolOfOne", "SleepStage", "gc_churn", "pool_of_one", "sleep_stage"]

F32 = npt.NDArray[np.float32]


class GcChurn(FaultTarget):
    fault = "cyclic garbage per request beside a large live heap (GC pauses)"

    def __init__(self, knobs: Mapping[str, Any]) -> None:
        super().__init__(knobs)
        # Live, tracked containers: every full collection walks all of them.
        self.heap = [{"i": i, "v": [i]} for i in range(int(knob(knobs, "heap", 150_000)))]
        self.cycles = int(knob(knobs, "cycles", 1_000))
        # The last `keep` requests' objects stay alive long enough to reach the oldest
        # generation, then die: the collector's full passes come every few dozen requests.
        self.recent: deque[list[Any]] = deque(maxlen=max(1, int(knob(knobs, "keep", 10))))
        self._recent_lock = threading.Lock()

    def __call__(self, request: Any) -> Any:
        with stage("preprocess"):
            value = hash((request, self.seed)) & 0xFF
        with stage("infer"):
            made: list[Any] = []
            for i in range(self.cycles):
                node: list[Any] = [i]
                node.append(node)  # a cycle: only the collector frees it
                made.append(node)
            with self._recent_lock:
                self.recent.append(made)
        self._served()
        return value

    def close(self) -> None:
        self.heap = []


def gc_churn(knobs: Mapping[str, Any]) -> GcChurn:
    """{None, memory} (gc-churn): knobs `heap` (150,000 live dicts), `cycles` (1,000 cyclic
    lists per request), `keep` (the last 10 requests' lists stay alive), `seed`."""
    return GcChurn(knobs)


class PoolOfOne(FaultTarget):
    fault = "a worker pool of one in front of a numpy computation (in infer)"

    def __init__(self, knobs: Mapping[str, Any]) -> None:
        super().__init__(knobs)
        side = max(8, int(knob(knobs, "side", 64)))
        batch = max(1, int(knob(knobs, "batch", 256)))
        rng = np.random.default_rng(self.seed)
        self.weights: F32 = rng.standard_normal((side, side), dtype=np.float32)
        self.inputs: F32 = rng.standard_normal((batch, side, side), dtype=np.float32)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pool-of-one")

    def _compute(self) -> float:
        # A stack of small matrices: OpenBLAS runs each on the calling thread.
        return float(np.matmul(self.inputs, self.weights)[0, 0, 0])

    def __call__(self, request: Any) -> Any:
        with stage("preprocess"):
            value = float(hash((request, self.seed)) & 0xFF)
        with stage("infer"):
            value += self.pool.submit(self._compute).result()
        self._served()
        return value

    def close(self) -> None:
        self.pool.shutdown(wait=True)


def pool_of_one(knobs: Mapping[str, Any]) -> PoolOfOne:
    """{infer, lock}: knobs `side` (64), `batch` (256): a (batch, side, side) @ (side, side)
    float32 matmul per request on the pool's single worker thread, `seed`."""
    return PoolOfOne(knobs)


class SleepStage(FaultTarget):
    fault = "none (a fixed time.sleep per request, no queue)"

    def __init__(self, knobs: Mapping[str, Any]) -> None:
        super().__init__(knobs)
        self.sleep_s = knob(knobs, "sleep_ms", 2.0) / 1000

    def __call__(self, request: Any) -> Any:
        with stage("preprocess"):
            value = hash((request, self.seed)) & 0xFF
        with stage("infer"):
            time.sleep(self.sleep_s)
        self._served()
        return value


def sleep_stage(knobs: Mapping[str, Any]) -> SleepStage:
    """Healthy: knobs `sleep_ms` (2), `seed`; `infer` is `time.sleep` and nothing else."""
    return SleepStage(knobs)
