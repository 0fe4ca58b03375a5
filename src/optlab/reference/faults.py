"""Targets with ONE known fault each: the labelled ground truth `optlab diagnose` is scored on.

Each factory here is a `kind: python` target (docs/experiment-files.md, "python"):

    target: {kind: python, factory: "optlab.reference.faults:lock_contention"}
    knobs: {seed: 3, hold_ms: 4.0}

takes the knobs as a dict (every knob has a default; `seed` varies the work) and returns a
thread-safe callable that records its stages with `optlab.metrics.stages.stage`, as the
reference pipeline does. :data:`SCENARIOS` pairs each factory with the load that shows its
fault and with the label a diagnosis should give: the stage that holds the bottleneck (None:
no one stage) and the resource. Two faults come from outside the target and are the caller's
to arrange: the load generator pushed past its limit (only the load says so) and a noisy
neighbour (`Scenario.neighbour`: a process that burns every core for the whole run).

The faults, by factory:

- `cpu_preprocess`: numpy ufuncs (they release the GIL) saturate the cores in `preprocess`.
- `compute_infer`: float32 matmuls dominate in `infer`.
- `lock_contention`: every request holds one global lock for a few ms (sleeping) in `infer`.
- `under_batching`: a dynamic batcher (max batch 32, a long max wait) at low concurrency:
  batches of 1-2, each request waits out the timeout in `queue`.
- `gil_contention`: pure-Python loops in `preprocess` on many threads: one core's worth of CPU.
- `memory_leak`: each request keeps 50-200 KiB it never frees (anonymous mappings, so the
  resident size grows with every request and shrinks again at `close()`).
- `io_wait`: each request creates, writes and fsyncs a new file in `load`.
- `periodic_stall`: a background thread holds the lock every request passes, 100-300 ms
  every 1-2 s.
- `cheap`: next to nothing per request (the generator-limit scenario's target).
- `moderate`: a little numpy work and a short sleep (the noisy-neighbour scenario's target).
- `healthy`: a few ms of mostly sleeping work (the control, at a load well below capacity).
- `gc_churn`, `pool_of_one`, `sleep_stage`: in `optlab.reference.faults_extra`.
"""

from __future__ import annotations

import itertools
import mmap
import os
import random
import shutil
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from optlab.load.timerslack import sleep_until
from optlab.metrics.stages import stage
from optlab.reference.fault_target import FaultTarget, knob
from optlab.reference.faults_extra import gc_churn, pool_of_one, sleep_stage

__all__ = [
    "cheap",
    "compute_infer",
    "cpu_preprocess",
    "gc_churn",
    "gil_contention",
    "healthy",
    "io_wait",
    "lock_contention",
    "memory_leak",
    "moderate",
    "periodic_stall",
    "pool_of_one",
    "sleep_stage",
    "under_batching",
]

KIB = 1024
F32 = npt.NDArray[np.float32]


def _light(request: Any) -> int:
    """A request's parsing: a few microseconds, so a light stage still shows in the breakdown."""
    return hash((request, 17)) & 0xFF


def _sleep_ms(ms: float) -> None:
    sleep_until(time.perf_counter_ns() + round(ms * 1e6))


class _Numpy(FaultTarget):
    """Ufunc passes over one seeded array, into a scratch buffer allocated per call.

    Not a buffer per thread: the open loop spreads its calls over all of its worker threads
    (512 by default), so per-thread buffers would grow the resident size for the first 512
    requests and look like a leak."""

    def __init__(self, knobs: Mapping[str, Any], elements: int) -> None:
        super().__init__(knobs)
        self.data: F32 = np.random.default_rng(self.seed).random(elements, dtype=np.float32)

    def crunch(self, rounds: int) -> float:
        """`rounds` passes of three ufuncs over the array; each pass drops the GIL."""
        out = np.empty_like(self.data)
        for _ in range(rounds):
            np.multiply(self.data, 1.0001, out=out)
            np.exp(out, out=out)
            np.sqrt(out, out=out)
        return float(out[0])


# -- cpu -----------------------------------------------------------------------------------------


class CpuPreprocess(_Numpy):
    fault = "cpu in preprocess (numpy, the GIL released)"

    def __init__(self, knobs: Mapping[str, Any]) -> None:
        super().__init__(knobs, int(knob(knobs, "elements", 500_000)))
        self.rounds = max(1, int(knob(knobs, "rounds", 4)))

    def __call__(self, request: Any) -> Any:
        with stage("preprocess"):
            value = self.crunch(self.rounds)
        with stage("infer"):
            value += _light(request)
        self._served()
        return value


def cpu_preprocess(knobs: Mapping[str, Any]) -> CpuPreprocess:
    """{preprocess, cpu}: knobs `elements` (500,000), `rounds` (4), `seed`."""
    return CpuPreprocess(knobs)


class ComputeInfer(FaultTarget):
    fault = "cpu in infer (float32 matmuls)"

    def __init__(self, knobs: Mapping[str, Any]) -> None:
        super().__init__(knobs)
        side = max(8, int(knob(knobs, "side", 64)))
        batch = max(1, int(knob(knobs, "batch", 384)))
        rng = np.random.default_rng(self.seed)
        self.weights: F32 = rng.standard_normal((side, side), dtype=np.float32)
        self.inputs: F32 = rng.standard_normal((batch, side, side), dtype=np.float32)

    def __call__(self, request: Any) -> Any:
        with stage("preprocess"):
            row = _light(request) % self.inputs.shape[1]
        with stage("infer"):
            # A stack of small matrices: OpenBLAS runs each on the calling thread (the GIL
            # released). One large matmul would wake OpenBLAS's own threads, which spin
            # against the other clients' calls and give a tail as long as a stall's.
            out = np.matmul(self.inputs, self.weights)
        self._served()
        return float(out[0, row, 0])


def compute_infer(knobs: Mapping[str, Any]) -> ComputeInfer:
    """{infer, cpu}: knobs `side` (64) and `batch` (384): a (batch, side, side) @ (side, side)
    float32 matmul per request, ~2 ms of one core; `seed`."""
    return ComputeInfer(knobs)


# -- lock, queue, gil ----------------------------------------------------------------------------


class LockContention(FaultTarget):
    fault = "one global lock held a few ms per request (in infer)"

    def __init__(self, knobs: Mapping[str, Any]) -> None:
        super().__init__(knobs)
        self.hold_ms = knob(knobs, "hold_ms", 4.0)
        self.lock = threading.Lock()

    def __call__(self, request: Any) -> Any:
        with stage("preprocess"):
            value = _light(request)
        with stage("infer"), self.lock:
            _sleep_ms(self.hold_ms)
        self._served()
        return value


def lock_contention(knobs: Mapping[str, Any]) -> LockContention:
    """{infer, lock}: knobs `hold_ms` (4.0), `seed`. Throughput is about 1000 / hold_ms per
    second whatever the concurrency, with the CPU idle."""
    return LockContention(knobs)


class UnderBatching(FaultTarget):
    fault = "a dynamic batcher that waits out its timeout for batches of 1-2"

    def __init__(self, knobs: Mapping[str, Any]) -> None:
        from optlab.reference.classifier.batcher import DynamicBatcher

        super().__init__(knobs)
        batching = knobs.get("batching") or {}
        self.max_batch = int(batching.get("max_batch_size", 32))
        self.max_wait_ms = float(batching.get("max_wait_ms", 8.0))
        side = max(8, int(knob(knobs, "side", 128)))
        rng = np.random.default_rng(self.seed)
        self.weights: F32 = rng.standard_normal((side, side), dtype=np.float32)
        self.batcher: DynamicBatcher[F32, float] = DynamicBatcher(
            self._run_batch,
            max_batch_size=self.max_batch,
            max_wait_ms=self.max_wait_ms,
            max_queue=int(batching.get("max_queue", 1024)),
            workers=1,
            name="under-batching",
        )
        self._rows: F32 = rng.standard_normal((64, side), dtype=np.float32)

    def _run_batch(self, worker: int, rows: list[F32], timings: list[Any]) -> list[float]:
        with stage("infer", requests=timings):
            out = np.stack(rows) @ self.weights
        return [float(v) for v in out[:, 0]]

    def __call__(self, request: Any) -> Any:
        with stage("preprocess"):
            row = self._rows[_light(request) % len(self._rows)]
        value = self.batcher.submit(row)  # the wait is the batcher's `queue` stage
        self._served()
        return value

    def metrics(self) -> dict[str, Any]:
        batching = self.batcher.metrics()
        batching["max_batch_size"] = self.max_batch
        batching["max_wait_ms"] = self.max_wait_ms
        return {**super().metrics(), "batching": batching}

    def reset_metrics(self) -> None:
        super().reset_metrics()
        self.batcher.reset_metrics()

    def close(self) -> None:
        self.batcher.close()


def under_batching(knobs: Mapping[str, Any]) -> UnderBatching:
    """{queue, queue}: knobs `batching` ({max_batch_size: 32, max_wait_ms: 8, max_queue}),
    `side` (128), `seed`. Its `metrics()` has the batcher's `batching` section."""
    return UnderBatching(knobs)


class GilContention(FaultTarget):
    fault = "pure-Python loops on many threads (the GIL)"

    def __init__(self, knobs: Mapping[str, Any]) -> None:
        super().__init__(knobs)
        self.iterations = max(1, int(knob(knobs, "iterations", 20_000)))

    def __call__(self, request: Any) -> Any:
        with stage("preprocess"):
            total = self.seed
            for i in range(self.iterations):
                total = (total * 31 + i) & 0xFFFFFF
        with stage("infer"):
            total ^= _light(request)
        self._served()
        return total


def gil_contention(knobs: Mapping[str, Any]) -> GilContention:
    """{preprocess, gil}: knobs `iterations` (20,000: ~1-2 ms of bytecode), `seed`."""
    return GilContention(knobs)


# -- memory, io, stalls --------------------------------------------------------------------------


class MemoryLeak(FaultTarget):
    fault = "every request keeps 50-200 KiB it never frees"

    def __init__(self, knobs: Mapping[str, Any]) -> None:
        super().__init__(knobs)
        self.low = int(knob(knobs, "leak_kib_min", 50) * KIB)
        self.high = max(self.low, int(knob(knobs, "leak_kib_max", 200) * KIB))
        self.work_ms = knob(knobs, "work_ms", 1.0)
        self._rng = random.Random(self.seed)
        self._kept: list[mmap.mmap] = []
        self._lock = threading.Lock()
        self.kept_bytes = 0

    def __call__(self, request: Any) -> Any:
        with stage("preprocess"):
            value = _light(request)
        with stage("infer"):
            with self._lock:
                size = self._rng.randint(self.low, self.high)
            # Anonymous mappings: every page is written, so it is resident at once, and
            # unmapping them at close() gives the memory back (a malloc'd heap may keep it and
            # hide the next run's leak).
            kept = mmap.mmap(-1, size)
            kept.write(bytes((value,)) * size)
            with self._lock:
                self._kept.append(kept)
                self.kept_bytes += size
            _sleep_ms(self.work_ms)
        self._served()
        return value

    def metrics(self) -> dict[str, Any]:
        return {**super().metrics(), "kept_mib": round(self.kept_bytes / 2**20, 1)}

    def close(self) -> None:
        with self._lock:
            kept, self._kept = self._kept, []
            self.kept_bytes = 0
        for block in kept:
            block.close()


def memory_leak(knobs: Mapping[str, Any]) -> MemoryLeak:
    """{None, memory}: knobs `leak_kib_min` (50), `leak_kib_max` (200), `work_ms` (1), `seed`."""
    return MemoryLeak(knobs)


class IoWait(FaultTarget):
    fault = "a new file written and fsynced per request (in load)"

    def __init__(self, knobs: Mapping[str, Any]) -> None:
        super().__init__(knobs)
        size = max(1, int(knob(knobs, "write_kib", 64) * KIB))
        self.block = np.random.default_rng(self.seed).bytes(size)
        self.folder = tempfile.mkdtemp(prefix="optlab-io-wait-", dir=knobs.get("dir") or None)
        self._names = itertools.count()

    def __call__(self, request: Any) -> Any:
        with stage("preprocess"):
            value = _light(request)
        with stage("load"):
            # A new file each time: its fsync must commit the file system's journal (the
            # new inode and its blocks), a wait on the device. Rewriting one file in place
            # was acknowledged in ~0.1 ms by this VM's disk cache: CPU time, not I/O wait.
            path = os.path.join(self.folder, str(next(self._names)))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, self.block)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.unlink(path)
        self._served()
        return value

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def io_wait(knobs: Mapping[str, Any]) -> IoWait:
    """{load, io}: knobs `write_kib` (64), `dir` (a temp dir's parent; default the system's),
    `seed`. Each request creates, writes, fsyncs and deletes a file of its own."""
    return IoWait(knobs)


class PeriodicStall(FaultTarget):
    fault = "a background thread holds every request's lock 100-300 ms every 1-2 s"

    def __init__(self, knobs: Mapping[str, Any]) -> None:
        super().__init__(knobs)
        self.work_ms = knob(knobs, "work_ms", 1.0)
        self.every_s = knob(knobs, "stall_every_s", 1.5)
        self.stall_ms = knob(knobs, "stall_ms", 200.0)
        self.gate = threading.Lock()
        self.stalls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._stall, name="periodic-stall", daemon=True)
        self._thread.start()

    def _stall(self) -> None:
        rng = random.Random(self.seed)
        while not self._stop.wait(self.every_s * rng.uniform(0.8, 1.2)):
            with self.gate:
                self.stalls += 1
                _sleep_ms(self.stall_ms)

    def __call__(self, request: Any) -> Any:
        with stage("preprocess"):
            value = _light(request)
        with stage("infer"):
            with self.gate:
                pass
            _sleep_ms(self.work_ms)
        self._served()
        return value

    def metrics(self) -> dict[str, Any]:
        return {**super().metrics(), "stalls": self.stalls}

    def reset_metrics(self) -> None:
        super().reset_metrics()
        self.stalls = 0

    def close(self) -> None:
        self._stop.set()
        self._thread.join(self.stall_ms / 1000 + 1.0)


def periodic_stall(knobs: Mapping[str, Any]) -> PeriodicStall:
    """{None, stall}: knobs `stall_every_s` (1.5, jittered +-20%), `stall_ms` (200), `work_ms`
    (1), `seed`."""
    return PeriodicStall(knobs)


# -- targets whose fault is elsewhere, and the control ---------------------------------------


class Cheap(FaultTarget):
    fault = "none in the target (next to no work per request)"

    def __call__(self, request: Any) -> Any:
        with stage("infer"):
            value = _light(request)
        return value


def cheap(knobs: Mapping[str, Any]) -> Cheap:
    """Next to nothing per request; the generator-limit scenario drives it past what an
    in-process load generator can send."""
    return Cheap(knobs)


class Sleepy(_Numpy):
    """A little numpy work (`rounds` passes over `elements`) then `sleep_ms` of waiting."""

    fault = "none"

    def __init__(self, knobs: Mapping[str, Any], sleep_ms: float, rounds: int) -> None:
        super().__init__(knobs, int(knob(knobs, "elements", 20_000)))
        self.sleep_ms = knob(knobs, "sleep_ms", sleep_ms)
        self.rounds = int(knob(knobs, "rounds", rounds))

    def __call__(self, request: Any) -> Any:
        with stage("preprocess"):
            value = float(_light(request))
        with stage("infer"):
            value += self.crunch(self.rounds) if self.rounds else 0.0
            _sleep_ms(self.sleep_ms)
        self._served()
        return value


def moderate(knobs: Mapping[str, Any]) -> Sleepy:
    """CPU work (`rounds` 4 over `elements` 100,000) and a 2 ms sleep: the noisy-neighbour
    scenario's target, which a neighbour burning every core slows."""
    return Sleepy({"elements": 100_000, **knobs}, sleep_ms=2.0, rounds=4)


def healthy(knobs: Mapping[str, Any]) -> Sleepy:
    """A few ms of mostly sleeping work (`sleep_ms` 3, one light numpy pass): the control."""
    return Sleepy(knobs, sleep_ms=3.0, rounds=1)
