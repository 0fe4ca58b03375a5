"""A small user-style target: a bag-of-words text classifier in numpy, with dynamic batching.

It shows what a real target does with optlab: build(knobs) returns a thread-safe callable,
inputs(workload) the requests, and `optlab.stage` splits each request's latency into stages,
including the forward pass that a batching thread runs for many requests at once.
"""

from __future__ import annotations

import queue
import threading
import zlib
from concurrent.futures import Future
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

import optlab


class BatchingOff(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    mode: Literal["off"] = "off"


class BatchingDynamic(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    mode: Literal["dynamic"]
    max_batch_size: int = Field(8, ge=2, le=256)
    max_wait_ms: float = Field(2.0, ge=0, le=1000)


class Knobs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tokenizer: Literal["python", "numpy"] = "python"
    dim: int = Field(512, ge=8, le=8192)
    batching: BatchingOff | BatchingDynamic = Field(BatchingOff(), discriminator="mode")


VOCAB = 4096
CLASSES = 16


class Classifier:
    def __init__(self, knobs: Knobs) -> None:
        rng = np.random.default_rng(0)
        self.knobs = knobs
        self.embedding = rng.standard_normal((VOCAB, knobs.dim)).astype(np.float32)
        self.weights = rng.standard_normal((knobs.dim, CLASSES)).astype(np.float32)
        self._queue: queue.Queue[tuple[np.ndarray, Any, Future[int]] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def setup(self) -> None:
        if isinstance(self.knobs.batching, BatchingDynamic):
            self._thread = threading.Thread(target=self._batch_loop, daemon=True)
            self._thread.start()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=5)

    def _tokens(self, text: str) -> np.ndarray:
        if self.knobs.tokenizer == "numpy":
            words = np.array(text.split())
            return np.fromiter((zlib.crc32(w.encode()) for w in words), np.uint32) % VOCAB
        return np.array([zlib.crc32(w.encode()) % VOCAB for w in text.split()], dtype=np.int64)

    def _forward(self, bags: np.ndarray) -> np.ndarray:
        logits = bags @ self.weights
        return np.argmax(logits, axis=1)

    def __call__(self, text: str) -> int:
        with optlab.stage("preprocess"):
            bag = self.embedding[self._tokens(text)].mean(axis=0)
        if self._thread is None:
            with optlab.stage("forward"):
                label = int(self._forward(bag[None, :])[0])
        else:
            done: Future[int] = Future()
            self._queue.put((bag, optlab.current_request(), done))
            label = done.result()
        with optlab.stage("postprocess"):
            return int(label)

    def _batch_loop(self) -> None:
        batching = self.knobs.batching
        assert isinstance(batching, BatchingDynamic)
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = threading.Event()
            timer = threading.Timer(batching.max_wait_ms / 1000, deadline.set)
            timer.start()
            while len(batch) < batching.max_batch_size and not deadline.is_set():
                try:
                    item = self._queue.get(timeout=batching.max_wait_ms / 1000)
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            timer.cancel()
            requests = [timing for _, timing, _ in batch if timing is not None]
            with optlab.stage("forward", requests=requests):
                labels = self._forward(np.stack([bag for bag, _, _ in batch]))
            for (_, _, done), label in zip(batch, labels, strict=True):
                done.set_result(int(label))


def build(knobs: dict[str, Any]) -> Classifier:
    return Classifier(Knobs.model_validate(knobs))


def inputs(workload: Any) -> list[str]:
    rng = np.random.default_rng(getattr(workload, "seed", 0))
    words = [f"w{i}" for i in range(2000)]
    return [" ".join(rng.choice(words, size=int(rng.integers(8, 64)))) for _ in range(256)]
