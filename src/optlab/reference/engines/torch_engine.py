"""The eager torch engine: the shipped DigitResNet under `torch.inference_mode`.

Precisions: fp32 everywhere; fp16 and bf16 by casting the model and each batch. On this
project's CPU (AVX2, no AVX512-BF16/FP16, no AMX) both half precisions run but take the slow,
non-vectorised convolution paths: about 15x slower than fp32 (measured with torch 2.13: batch 1
3 ms fp32, 45 ms bf16, 49 ms fp16). They are allowed anyway, so the tracker can show the
regression rather than hide it. int8 is not a torch engine feature here: it is built by
onnxruntime static quantisation.

Threads: `torch.set_num_threads` is process-global. Building an engine sets it to `threads`, so
it applies to every torch engine (and any other torch work) in the process: the last engine
built wins. Engines of one process should therefore be built with the same `threads`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from optlab.reference.classifier.data import MODEL_SIDE
from optlab.reference.engines.base import (
    CHANNELS,
    NUM_CLASSES,
    EngineError,
    UnsupportedPrecisionError,
    check_batch_shape,
    check_open,
    cuda_unavailable,
    host_array,
    is_torch_tensor,
)

if TYPE_CHECKING:
    import torch

_INITIAL_PINNED = 64


def _dtype(precision: str) -> torch.dtype:
    import torch

    if precision == "int8":
        raise UnsupportedPrecisionError(
            "engine torch has no int8 precision: int8 is built by onnxruntime static "
            "quantisation (QDQ, calibrated on train renders)",
            hint="knobs.engine: set onnxruntime for int8 (or knobs.precision: fp32, fp16, bf16 "
            "with engine torch)",
        )
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    return dtypes[precision]


def _device(device: str, precision: str) -> torch.device:
    import torch

    if device == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise cuda_unavailable("torch")
    resolved = torch.device(device)
    index = resolved.index if resolved.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise EngineError(
            f"device {device} does not exist: torch sees {torch.cuda.device_count()} GPU(s)",
            hint="knobs.device: use cuda (the first GPU)",
        )
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        raise UnsupportedPrecisionError(
            f"the GPU {torch.cuda.get_device_name(index)} does not support bf16",
            hint="knobs.precision: use fp16 (or fp32) on this GPU",
        )
    return torch.device("cuda", index)


class TorchEngine:
    """DigitResNet in eval mode, cast to the requested precision, on one device.

    On cuda, host batches go through a reused pinned buffer with a non-blocking copy, and the
    forward pass runs on the engine's own stream (so engines of parallel instances can overlap).
    `infer` holds a lock on cuda because of that shared buffer; use one engine per worker for
    parallelism. On cpu `infer` is thread-safe.
    """

    def __init__(self, precision: str, device: str, threads: int) -> None:
        import torch

        from optlab.reference.classifier.model import load_trained, weights_path

        start = time.perf_counter()
        self._dtype = _dtype(precision)
        self._device = _device(device, precision)
        self._cuda = self._device.type == "cuda"
        torch.set_num_threads(threads)
        self._model = load_trained("cpu").to(device=self._device, dtype=self._dtype)
        self._lock = threading.Lock()
        self._stream: torch.cuda.Stream | None = None
        if self._cuda:
            self._stream = torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]
        self._pinned: torch.Tensor | None = None
        self._closed = False
        # One forward pass now, so a missing kernel (say, a half-precision convolution a CPU
        # build lacks) is an error at load time rather than on the first request.
        try:
            self.infer(np.zeros((1, CHANNELS, MODEL_SIDE, MODEL_SIDE), dtype=np.float32))
        except RuntimeError as exc:
            raise UnsupportedPrecisionError(
                f"torch cannot run the model in {precision} on {self._device}: {exc}",
                hint="knobs.precision: use fp32 on this device",
            ) from exc
        providers = [str(self._device)]
        if self._cuda:
            providers = [f"{self._device} ({torch.cuda.get_device_name(self._device)})"]
        self.description: dict[str, Any] = {
            "engine": "torch",
            "precision": precision,
            "device": str(self._device),
            "threads": threads,
            "threads_note": "torch.set_num_threads is process-global",
            "providers": providers,
            "artifact": None,
            "cached": None,
            "build_s": round(time.perf_counter() - start, 3),
            "weights": str(weights_path()),
            "torch": torch.__version__,
        }

    def _pinned_view(self, count: int) -> torch.Tensor:
        import torch

        if self._pinned is None or self._pinned.shape[0] < count:
            previous = _INITIAL_PINNED if self._pinned is None else 2 * self._pinned.shape[0]
            shape = (max(count, previous), CHANNELS, MODEL_SIDE, MODEL_SIDE)
            self._pinned = torch.empty(shape, dtype=torch.float32).pin_memory()
        return self._pinned[:count]

    def _to_cuda(self, batch: Any) -> torch.Tensor:
        """The batch on the engine's GPU, cast to its dtype. Runs on the engine's stream."""
        import torch

        if is_torch_tensor(batch) and batch.device.type == "cuda":
            check_batch_shape(tuple(batch.shape))
            # Already on the GPU (the torch preprocess variant): no host round trip.
            moved: torch.Tensor = batch.detach().to(device=self._device, dtype=self._dtype)
            return moved
        host = torch.from_numpy(host_array(batch))
        staging = self._pinned_view(host.shape[0])
        staging.copy_(host)
        # Safe to reuse the buffer on the next call: every call ends with a synchronising
        # device-to-host copy (under the lock), so this copy has finished by then.
        on_device = staging.to(self._device, non_blocking=True)
        return on_device.to(self._dtype)

    def _to_cpu(self, batch: Any) -> torch.Tensor:
        import torch

        if is_torch_tensor(batch):
            check_batch_shape(tuple(batch.shape))
            tensor: torch.Tensor = batch.detach().to(device="cpu", dtype=self._dtype)
            return tensor
        array = host_array(batch)
        if not array.flags.writeable:
            array = array.copy()  # torch.from_numpy warns on read-only arrays
        return torch.from_numpy(array).to(self._dtype)

    def infer(self, batch: Any) -> npt.NDArray[np.float32]:
        check_open(self._closed, "torch")
        import torch

        if not self._cuda:
            with torch.inference_mode():
                logits = self._model(self._to_cpu(batch))
            return _logits(logits.float().numpy())
        assert self._stream is not None
        with self._lock, torch.inference_mode():
            # A batch made on the GPU by another stream (the preprocess) must be complete before
            # this stream reads it.
            self._stream.wait_stream(torch.cuda.current_stream(self._device))
            with torch.cuda.stream(self._stream):
                logits = self._model(self._to_cuda(batch))
                # .cpu() is a blocking device-to-host copy: it waits for this stream, so the
                # forward pass has really finished when infer returns and timings are true.
                host = logits.float().cpu()
        return _logits(host.numpy())

    def close(self) -> None:
        self._closed = True
        self._pinned = None
        self._model = None  # type: ignore[assignment]
        if self._cuda:
            import torch

            torch.cuda.empty_cache()


def _logits(array: npt.NDArray[Any]) -> npt.NDArray[np.float32]:
    if array.ndim != 2 or array.shape[1] != NUM_CLASSES:
        raise EngineError(
            f"the model returned shape {array.shape}, expected N x {NUM_CLASSES}",
            hint="the weights do not match the reference model; reinstall optlab",
        )
    return np.ascontiguousarray(array, dtype=np.float32)


def build(precision: str, device: str, threads: int, cache_dir: Path | None) -> TorchEngine:
    """Load the eager model; `cache_dir` is unused (nothing is built on disk)."""
    del cache_dir
    return TorchEngine(precision, device, threads)
