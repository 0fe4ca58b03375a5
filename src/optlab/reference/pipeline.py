"""The reference image-classifier service: every knob of `BuiltinKnobs` is a real code path.

One request (JPEG bytes) flows: response cache lookup -> `preprocess` (decode, resize,
normalise; on the caller's thread, as a web handler would) -> `queue` (waiting for a batch or a
free model instance) -> `infer` (the engine's forward pass over the whole batch, attributed to
each request in it) -> `postprocess` (softmax, top-k, JSON response) -> cache store. Each arrow
is a stage of the run's breakdown, so a step's gain shows in the stage it changed.

torch, onnxruntime and tensorrt are imported by the engines when a pipeline is built, never
when this module is imported.
"""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from optlab.config.knobs import BatchingDynamic, BuiltinKnobs, CacheLRU, ImageInputs
from optlab.config.validation import target_knobs
from optlab.metrics.stages import RequestTiming, stage
from optlab.reference.classifier.cache import content_key
from optlab.reference.classifier.data import MODEL_SIDE, Sample

__all__ = ["ImageClassifier", "build", "encode_response", "inputs", "render_pool"]

TOP_K = 3
ACCURACY_BATCH = 32


def encode_response(logits: npt.NDArray[np.float32], k: int = TOP_K) -> bytes:
    """Softmax over one request's logits, the top-k classes, as the JSON bytes a client gets."""
    # Ten values: plain floats beat a dozen numpy calls on tiny arrays, and hold the GIL less.
    values = logits.tolist()
    peak = max(values)
    weights = [math.exp(v - peak) for v in values]
    scale = 1.0 / sum(weights)
    top = sorted(range(len(weights)), key=weights.__getitem__, reverse=True)[:k]
    body = {
        "label": top[0],
        "top": [{"label": i, "p": round(weights[i] * scale, 6)} for i in top],
    }
    return json.dumps(body, separators=(",", ":")).encode()


def _payload(request: Any) -> bytes:
    if isinstance(request, Sample):
        return request.jpeg
    if isinstance(request, bytes | bytearray | memoryview):
        return bytes(request)
    raise TypeError(f"the image classifier takes JPEG bytes, not {type(request).__name__}")


class ImageClassifier:
    """callable(JPEG bytes or Sample) -> JSON response bytes; thread-safe.

    Batching off: each request runs on its caller's thread on one of `instances` engines
    (waiting for a free one is the `queue` stage). Batching on: a dynamic batcher with one
    worker per instance forms the batches.
    """

    def __init__(self, knobs: BuiltinKnobs) -> None:
        from optlab.reference.classifier.batcher import DynamicBatcher, InstancePool
        from optlab.reference.classifier.cache import ResponseCache
        from optlab.reference.classifier.preprocess import make_preprocessor
        from optlab.reference.engines import load_engine

        self.knobs = knobs
        self.preprocess = make_preprocessor(knobs.preprocess, side=MODEL_SIDE, device=knobs.device)
        self.engines: list[Any] = []
        self.batcher: Any = None
        self.pool: Any = None
        try:
            for _ in range(knobs.instances):
                self.engines.append(
                    load_engine(knobs.engine, knobs.precision, knobs.device, knobs.threads)
                )
            batching = knobs.batching
            if isinstance(batching, BatchingDynamic):
                # One reused input buffer per worker: stacking a batch allocates nothing.
                self._buffers = [
                    np.empty((batching.max_batch_size, 3, MODEL_SIDE, MODEL_SIDE), np.float32)
                    for _ in self.engines
                ]
                self.batcher = DynamicBatcher(
                    self._run_batch,
                    max_batch_size=batching.max_batch_size,
                    max_wait_ms=batching.max_wait_ms,
                    max_queue=batching.max_queue,
                    workers=len(self.engines),
                    name="image-classifier",
                )
            else:
                self.pool = InstancePool(self.engines)
        except BaseException:
            self.close()
            raise
        # Engine time per request: a batch's forward pass divided among its requests. The
        # `infer` stage gives each request the whole pass, which is its latency, not its cost.
        self._infer_lock = threading.Lock()
        self._infer_ns = 0
        self._inferred = 0
        self._passes = 0
        cache = knobs.cache
        self.cache = (
            ResponseCache(cache.max_entries, cache.ttl_s) if isinstance(cache, CacheLRU) else None
        )

    # -- serving ----------------------------------------------------------------------------
    def __call__(self, request: Any) -> bytes:
        payload = _payload(request)
        key = None
        if self.cache is not None:
            key = content_key(payload)
            hit = self.cache.get(key)
            if hit is not None:
                return bytes(hit)
        with stage("preprocess"):
            image = self.preprocess(payload)
        if self.batcher is not None:
            logits = self.batcher.submit(image)
        else:
            with self.pool.acquire() as engine, stage("infer"):
                started = time.perf_counter_ns()
                logits = engine.infer(image[None])[0]
                self._count_infer(time.perf_counter_ns() - started, 1)
        with stage("postprocess"):
            response = encode_response(logits)
        if self.cache is not None and key is not None:
            self.cache.put(key, response)
        return response

    def _run_batch(
        self, worker: int, images: list[Any], timings: list[RequestTiming]
    ) -> Sequence[npt.NDArray[np.float32]]:
        with stage("infer", requests=timings):
            started = time.perf_counter_ns()
            batch = self._stack(worker, images)
            logits = self.engines[worker].infer(batch)
            self._count_infer(time.perf_counter_ns() - started, len(images))
        return list(logits)

    def _count_infer(self, ns: int, requests: int) -> None:
        with self._infer_lock:
            self._infer_ns += ns
            self._inferred += requests
            self._passes += 1

    def _stack(self, worker: int, images: list[Any]) -> Any:
        if isinstance(images[0], np.ndarray):
            return np.stack(images, out=self._buffers[worker][: len(images)])
        import torch  # the torch preprocess variant hands over tensors, possibly on the GPU

        return torch.stack(images)

    # -- the run's extra records ----------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        found: dict[str, Any] = {
            "engine": self.engines[0].description if self.engines else None,
            "instances": len(self.engines),
        }
        with self._infer_lock:
            ns, inferred, passes = self._infer_ns, self._inferred, self._passes
        found["infer"] = {
            "passes": passes,
            "requests": inferred,
            "busy_ms": round(ns / 1e6, 3),
            "ms_per_request": round(ns / 1e6 / inferred, 4) if inferred else None,
        }
        if self.batcher is not None:
            found["batching"] = self.batcher.metrics()
        if self.pool is not None:
            found["instances_pool"] = self.pool.metrics()
        if self.cache is not None:
            found["cache"] = self.cache.metrics()
        return found

    def reset_metrics(self) -> None:
        with self._infer_lock:
            self._infer_ns = self._inferred = self._passes = 0
        for part in (self.batcher, self.pool, self.cache):
            if part is not None:
                part.reset_metrics()

    def predict(self, payloads: list[bytes]) -> list[int]:
        """Labels through this pipeline's own preprocess and engine, bypassing batcher and
        cache: what the accuracy check runs."""
        labels: list[int] = []
        engine = self.engines[0]
        for start in range(0, len(payloads), ACCURACY_BATCH):
            # Each image copied at once: the pooled variant returns the same reused buffer on
            # every call, so keeping the returned arrays would stack N copies of the last one.
            images = [_owned(self.preprocess(p)) for p in payloads[start : start + ACCURACY_BATCH]]
            if isinstance(images[0], np.ndarray):
                batch: Any = np.stack(images)
            else:
                import torch

                batch = torch.stack(images)
            labels.extend(int(i) for i in np.asarray(engine.infer(batch)).argmax(axis=1))
        return labels

    def accuracy(self) -> dict[str, Any]:
        """Held-out top-1 of this configuration, its agreement with the shipped fp32 torch
        model on the same payloads, and the points lost against that model's own top-1."""
        from optlab.reference.classifier.accuracy import evaluate, reference_predict

        report = evaluate(self.predict, reference=reference_predict)
        reference = _reference_top1()
        return {
            "split": "holdout",
            "n": report.n,
            "top1": round(report.top1, 6),
            "agreement": None if report.agreement is None else round(report.agreement, 6),
            "reference_top1": round(reference, 6),
            "drop_pts": round((reference - report.top1) * 100, 4),
        }

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()
        for engine in self.engines:
            engine.close()
        self.engines = []


def _owned(image: Any) -> Any:
    return image.copy() if isinstance(image, np.ndarray) else image.clone()


@functools.lru_cache(maxsize=1)
def _reference_top1() -> float:
    from optlab.reference.classifier.accuracy import evaluate, reference_predict

    return evaluate(reference_predict).top1


def build(knobs: dict[str, Any]) -> ImageClassifier:
    """The target's factory: validates the knobs (already checked at load), builds the service."""
    model = target_knobs(BuiltinKnobs, knobs, "image-classifier")
    return ImageClassifier(model)


@functools.lru_cache(maxsize=8)
def render_pool(
    split: str, count: int, size: int | tuple[int, int], seed: int, skew: float | None
) -> tuple[Sample, ...]:
    """Rendered payloads, memoised: a chain run in one process renders them once."""
    from optlab.reference.classifier.data import requests

    return tuple(
        requests(
            split="train" if split == "train" else "holdout",
            count=count,
            size=size,
            seed=seed,
            repeat_skew=skew,
        )
    )


def inputs(workload: Any) -> list[Sample]:
    """The request pool `workload.inputs` describes (see ImageInputs)."""
    spec = ImageInputs.model_validate(getattr(workload, "inputs", None) or {})
    size = spec.size if isinstance(spec.size, int) else (spec.size[0], spec.size[1])
    seed = int(getattr(workload, "seed", 0))
    return list(render_pool(spec.split, spec.count, size, seed, spec.repeat_skew))
