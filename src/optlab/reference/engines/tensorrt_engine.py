"""The TensorRT engine: a plan built from the cached ONNX export, run on a torch CUDA stream.

Written against the TensorRT 10 Python API (name-based tensors, `execute_async_v3`):
- fp32 and fp16/bf16 build from the fp32 ONNX model; fp16 and bf16 set the builder flag, which
  lets TensorRT choose that precision per layer (inputs and outputs stay float32).
- int8 builds from a QDQ model (explicit quantisation): `quantize.TENSORRT_INT8`, symmetric
  QInt8, since TensorRT accepts only zero-point-0 quantisation.
One optimisation profile covers batch 1..MAX_BATCH (tuned for OPT_BATCH); a larger batch is run
in chunks. The serialised plan is cached under a key that includes the ONNX model's hash, the
TensorRT version and the GPU (plans are not portable across either).

TensorRT 11 removed the precision builder flags in favour of strongly typed networks; this
module needs 10.x and says so.
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
    Artifact,
    EngineError,
    EngineUnavailableError,
    UnsupportedPrecisionError,
    artifact_description,
    cache_root,
    cached_artifact,
    check_batch_shape,
    check_open,
    cuda_unavailable,
    host_array,
    is_torch_tensor,
)
from optlab.reference.engines.onnx_engine import INPUT_NAME, OUTPUT_NAME, onnx_artifact
from optlab.reference.engines.quantize import TENSORRT_INT8

if TYPE_CHECKING:
    import torch

# The batching knob allows up to 1024 per batch; the profile covers all of it.
MAX_BATCH = 1024
OPT_BATCH = 8
WORKSPACE_BYTES = 1 << 30
PLAN_FORMAT = 1
_FLAGS = {"fp16": "FP16", "bf16": "BF16", "int8": "INT8"}


def import_tensorrt() -> Any:
    try:
        import tensorrt
    except ImportError as exc:
        raise EngineUnavailableError(
            "engine tensorrt needs the tensorrt package, which is not installed",
            hint="pip install 'optlab[tensorrt]' on a machine with an NVIDIA GPU, or choose "
            "knobs.engine: onnxruntime",
        ) from exc
    return tensorrt


def _check_device(device: str) -> None:
    if device == "cpu":
        raise EngineUnavailableError(
            "engine tensorrt runs on cuda only, and device cpu was asked for",
            hint="knobs.device: cuda (on a machine with an NVIDIA GPU), or knobs.engine: "
            "onnxruntime or torch for cpu",
        )


def _build_plan(trt: Any, onnx_model: bytes, precision: str) -> bytes:
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # Flags 0: networks are always explicit-batch in TensorRT 10.
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_model):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineError(
            f"TensorRT's ONNX parser rejected the {precision} model: {errors}",
            hint="check the tensorrt version (10.x) against the exported opset, or "
            "knobs.engine: onnxruntime",
        )
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    flag = _FLAGS.get(precision)
    if flag is not None:
        if not hasattr(trt.BuilderFlag, flag):
            raise UnsupportedPrecisionError(
                f"tensorrt {trt.__version__} has no BuilderFlag.{flag} (removed in 11.x)",
                hint="pip install 'tensorrt>=10,<11', or knobs.precision: fp32",
            )
        config.set_flag(getattr(trt.BuilderFlag, flag))
    profile = builder.create_optimization_profile()
    sample = (CHANNELS, MODEL_SIDE, MODEL_SIDE)
    profile.set_shape(INPUT_NAME, (1, *sample), (OPT_BATCH, *sample), (MAX_BATCH, *sample))
    config.add_optimization_profile(profile)
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise EngineError(
            f"TensorRT could not build a {precision} plan (see its log above)",
            hint="knobs.precision: fp32 or fp16, or knobs.engine: onnxruntime",
        )
    return bytes(plan)


def _torch_dtype(trt: Any, dtype: Any) -> torch.dtype:
    import torch

    table = {
        trt.DataType.FLOAT: torch.float32,
        trt.DataType.HALF: torch.float16,
        trt.DataType.INT8: torch.int8,
        trt.DataType.INT32: torch.int32,
    }
    if hasattr(trt.DataType, "BF16"):
        table[trt.DataType.BF16] = torch.bfloat16
    if dtype not in table:
        raise EngineError(f"unexpected TensorRT tensor type {dtype}", hint="rebuild the plan")
    return table[dtype]


def _cached_plan(
    trt: Any,
    source: Artifact,
    precision: str,
    gpu: str,
    capability: list[int],
    cache_dir: Path | None,
) -> Artifact:
    """The serialised plan for this ONNX model, TensorRT version and GPU: cached, else built."""
    parts = {
        "artifact": "digitresnet-tensorrt-plan",
        "format": PLAN_FORMAT,
        "precision": precision,
        "onnx_sha256": source.sha256,
        "tensorrt": trt.__version__,
        "gpu": gpu,
        "compute_capability": capability,
        "batch_profile": [1, OPT_BATCH, MAX_BATCH],
        "workspace_bytes": WORKSPACE_BYTES,
    }
    return cached_artifact(
        cache_root(cache_dir) / "tensorrt",
        f"digitresnet-{precision}",
        ".plan",
        parts,
        lambda: _build_plan(trt, source.data, precision),
    )


def _check_io_tensors(trt: Any, engine: Any, plan_path: Path) -> None:
    modes = {
        engine.get_tensor_name(i): engine.get_tensor_mode(engine.get_tensor_name(i))
        for i in range(engine.num_io_tensors)
    }
    if modes.get(INPUT_NAME) != trt.TensorIOMode.INPUT or OUTPUT_NAME not in modes:
        raise EngineError(
            f"the plan's tensors are {sorted(modes)}, expected {INPUT_NAME} and {OUTPUT_NAME}",
            hint=f"delete {plan_path} to rebuild it",
        )


class TensorRTEngine:
    """A deserialised plan and one execution context, used under a lock (an execution context
    runs one inference at a time); use one engine per worker for parallelism."""

    def __init__(self, precision: str, device: str, threads: int, cache_dir: Path | None) -> None:
        _check_device(device)
        trt = import_tensorrt()
        import torch

        if not torch.cuda.is_available():
            raise cuda_unavailable("tensorrt")
        self._device = torch.device(device)
        if self._device.index is None:
            self._device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(self._device)
        quant = TENSORRT_INT8
        source = onnx_artifact("int8" if precision == "int8" else "fp32", cache_dir, quant)
        name = torch.cuda.get_device_name(self._device)
        capability = torch.cuda.get_device_capability(self._device)
        plan = _cached_plan(trt, source, precision, name, list(capability), cache_dir)
        start = time.perf_counter()
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(plan.data)
        if self._engine is None:
            raise EngineError(
                f"TensorRT could not deserialise {plan.path}",
                hint=f"delete {plan.path} to rebuild it",
            )
        self._context = self._engine.create_execution_context()
        _check_io_tensors(trt, self._engine, plan.path)
        self._input_dtype = _torch_dtype(trt, self._engine.get_tensor_dtype(INPUT_NAME))
        self._output_dtype = _torch_dtype(trt, self._engine.get_tensor_dtype(OUTPUT_NAME))
        self._stream = torch.cuda.Stream(self._device)  # type: ignore[no-untyped-call]
        self._lock = threading.Lock()
        self._pinned: torch.Tensor | None = None
        self._closed = False
        load_s = time.perf_counter() - start
        self.description: dict[str, Any] = {
            "engine": "tensorrt",
            "precision": precision,
            "device": str(self._device),
            "threads": threads,
            "threads_note": "unused: TensorRT runs on the GPU",
            "providers": [f"TensorRT {trt.__version__} on {name}"],
            **artifact_description(plan),
            "onnx_artifact": str(source.path),
            "load_s": round(load_s, 3),
            "batch_profile": [1, OPT_BATCH, MAX_BATCH],
            "tensorrt": trt.__version__,
        }
        if precision == "int8":
            self.description["quantization"] = quant.key_parts()

    def _staged(self, batch: Any) -> torch.Tensor:
        """The batch on the GPU in the plan's input dtype, contiguous. On the engine's stream."""
        import torch

        if is_torch_tensor(batch) and batch.device.type == "cuda":
            check_batch_shape(tuple(batch.shape))
            moved: torch.Tensor = batch.detach().to(self._device, self._input_dtype)
            return moved.contiguous()
        host = torch.from_numpy(host_array(batch))
        count = host.shape[0]
        if self._pinned is None or self._pinned.shape[0] < count:
            self._pinned = torch.empty(
                (max(count, 64), CHANNELS, MODEL_SIDE, MODEL_SIDE), dtype=torch.float32
            ).pin_memory()
        staging = self._pinned[:count]
        staging.copy_(host)
        # Reusing the pinned buffer next call is safe: each call ends synchronised (below).
        on_device = staging.to(self._device, non_blocking=True)
        return on_device.to(self._input_dtype).contiguous()

    def infer(self, batch: Any) -> npt.NDArray[np.float32]:
        check_open(self._closed, "tensorrt")
        import torch

        with self._lock, torch.inference_mode():
            self._stream.wait_stream(torch.cuda.current_stream(self._device))
            with torch.cuda.stream(self._stream):
                inputs = self._staged(batch)
                outputs = []
                for start in range(0, inputs.shape[0], MAX_BATCH):
                    chunk = inputs[start : start + MAX_BATCH]
                    out = torch.empty(
                        (chunk.shape[0], NUM_CLASSES), dtype=self._output_dtype, device=self._device
                    )
                    self._context.set_input_shape(INPUT_NAME, tuple(chunk.shape))
                    self._context.set_tensor_address(INPUT_NAME, chunk.data_ptr())
                    self._context.set_tensor_address(OUTPUT_NAME, out.data_ptr())
                    if not self._context.execute_async_v3(self._stream.cuda_stream):
                        raise EngineError(
                            "TensorRT failed to enqueue the batch (see its log above)",
                            hint="knobs.engine: onnxruntime or torch",
                        )
                    outputs.append(out)
                logits = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
                # .cpu() is a blocking copy that waits for this stream: the plan has really
                # run when infer returns, so the "infer" stage time is true.
                host = logits.float().cpu()
        return np.ascontiguousarray(host.numpy(), dtype=np.float32)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._context = None
            self._engine = None
            self._pinned = None


def build(precision: str, device: str, threads: int, cache_dir: Path | None) -> TensorRTEngine:
    return TensorRTEngine(precision, device, threads, cache_dir)
