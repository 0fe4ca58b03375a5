"""The onnxruntime engine, and the ONNX export that TensorRT builds from too.

The shipped weights are exported once with torch's dynamo exporter (dynamic batch axis) and
cached on disk under a content key (see `onnx_artifact`); a later load reads the file and does
not export again. Derived models are cached the same way: fp16 (for the CUDA provider) and
int8 (static QDQ quantisation, `quantize.py`).

Precisions:
- fp32: CPU or CUDA provider.
- fp16: CUDA provider only. The model is converted with onnxruntime's own float16 converter
  (`onnxruntime.transformers.float16`, the code onnxconverter-common ships; inputs and outputs
  stay float32). On the CPU provider it is refused: onnxruntime has no x86 fp16 kernels for
  this model's convolutions, inserts casts and constant-folds the weights back to float32,
  so the "fp16" session would be the fp32 graph (checked with onnxruntime 1.32: the optimised
  graph is the fp32 one). That is a silent fallback, so it is an error instead.
- bf16: refused (onnxruntime has no bf16 convolution kernels in either provider).
- int8: QDQ static quantisation calibrated on train renders, CPU provider only (the CUDA
  provider has no int8 convolutions and would run the QDQ model in fp32; TensorRT runs it).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from optlab.reference.classifier.data import MODEL_SIDE
from optlab.reference.engines.base import (
    CHANNELS,
    Artifact,
    EngineError,
    EngineUnavailableError,
    UnsupportedPrecisionError,
    artifact_description,
    cache_root,
    cached_artifact,
    check_batch_shape,
    check_open,
    host_array,
    is_torch_tensor,
    sha256_file,
)
from optlab.reference.engines.quantize import ORT_CPU_INT8, QuantConfig, quantize_int8

# Pinned rather than the exporter's default, so a torch upgrade cannot silently produce a model
# TensorRT's parser rejects; opset 20 is what torch 2.13's dynamo exporter emits by default.
OPSET = 20
# Bump when the export or conversion code changes in a way that changes the file.
EXPORT_FORMAT = 1
INPUT_NAME = "input"
OUTPUT_NAME = "logits"
# Model files are found without importing the model module (it imports torch): a cache hit
# then loads no torch at all. `model.WEIGHTS_FILE` names the same file (a test checks it).
_MODEL_MODULE = "optlab.reference.classifier.model"
_WEIGHTS_FILE = "classifier.pt"
_STEM = "digitresnet"


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def model_files() -> tuple[Path, Path]:
    """(model source file, weights file) of the reference classifier."""
    spec = importlib.util.find_spec(_MODEL_MODULE)
    if spec is None or spec.origin is None:
        raise EngineError(
            f"the reference model module {_MODEL_MODULE} cannot be found",
            hint="reinstall optlab (pip install -e .)",
        )
    source = Path(spec.origin)
    return source, source.with_name(_WEIGHTS_FILE)


def export_key_parts(precision: str) -> dict[str, Any]:
    """Everything an exported model depends on: the weights, the model's source, the opset,
    the precision and the versions of the exporter and of the runtime that will load it."""
    import onnxruntime

    source, weights = model_files()
    if not weights.is_file():
        raise EngineError(
            f"the reference model's weights are missing: {weights}",
            hint="regenerate them with scripts/train_reference_model.sh",
        )
    return {
        "artifact": "digitresnet-onnx",
        "format": EXPORT_FORMAT,
        "precision": precision,
        "weights_sha256": sha256_file(weights),
        "model_source_sha256": sha256_file(source),
        "opset": OPSET,
        "torch": _version("torch"),
        "onnx": _version("onnx"),
        "onnxscript": _version("onnxscript"),
        "onnxruntime": onnxruntime.__version__,
    }


def export_fp32() -> bytes:
    """The shipped weights as an ONNX model with a dynamic batch axis (any batch size)."""
    import torch

    from optlab.reference.classifier.model import load_trained

    if importlib.util.find_spec("onnxscript") is None:
        raise EngineUnavailableError(
            "exporting the model to ONNX needs the onnxscript package, which is not installed",
            hint="pip install onnxscript (an optlab dependency), or knobs.engine: torch",
        )
    model = load_trained("cpu")
    example = torch.zeros(2, CHANNELS, MODEL_SIDE, MODEL_SIDE)
    batch = torch.export.Dim("batch", min=1)
    # The exporter logs a warning per torchvision op it cannot register and emits deprecation
    # warnings from torch internals: noise for a model that uses none of them.
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=FutureWarning)
            warnings.simplefilter("ignore", category=DeprecationWarning)
            program = torch.onnx.export(
                model,
                (example,),
                dynamo=True,
                opset_version=OPSET,
                input_names=[INPUT_NAME],
                output_names=[OUTPUT_NAME],
                dynamic_shapes=({0: batch},),
                optimize=True,
                verbose=False,
            )
    except Exception as exc:  # the exporter raises many types; all mean the same here
        raise EngineError(
            f"torch.onnx.export failed for the reference model: {exc}",
            hint="check that torch, onnx and onnxscript versions match constraints.txt, "
            "or use knobs.engine: torch",
        ) from exc
    finally:
        exporter_log.setLevel(level)
    if program is None:
        raise EngineError("torch.onnx.export returned no program", hint="upgrade onnxscript")
    data: bytes = program.model_proto.SerializeToString()
    return data


def convert_fp16(fp32: bytes) -> bytes:
    """fp16 weights and activations, float32 inputs and outputs (keep_io_types)."""
    import onnx

    try:
        from onnxruntime.transformers.float16 import convert_float_to_float16
    except ImportError as exc:
        raise EngineUnavailableError(
            "fp16 conversion needs onnxruntime.transformers.float16, which this onnxruntime "
            "does not ship",
            hint="install onnxruntime-gpu >= 1.17 (pip install 'optlab[gpu]'), or "
            "knobs.precision: fp32",
        ) from exc
    model = onnx.load_from_string(fp32)
    with warnings.catch_warnings():
        # It warns about weights outside the fp16 range and clips them; there are none here.
        warnings.simplefilter("ignore", category=UserWarning)
        converted = convert_float_to_float16(model, keep_io_types=True)
    data: bytes = converted.SerializeToString()
    return data


def onnx_artifact(
    precision: str, cache_dir: Path | None = None, quant: QuantConfig = ORT_CPU_INT8
) -> Artifact:
    """The cached ONNX model for `precision` (fp32, fp16 or int8), built on a miss."""
    folder = cache_root(cache_dir) / "onnx"
    parts = export_key_parts(precision)
    if precision == "fp32":
        return cached_artifact(folder, f"{_STEM}-fp32", ".onnx", parts, export_fp32)
    if precision == "fp16":
        return cached_artifact(
            folder,
            f"{_STEM}-fp16",
            ".onnx",
            parts,
            lambda: convert_fp16(onnx_artifact("fp32", cache_dir).data),
        )
    if precision == "int8":
        parts |= {"quantization": quant.key_parts()}
        return cached_artifact(
            folder,
            f"{_STEM}-int8-{quant.name}",
            ".onnx",
            parts,
            lambda: quantize_int8(onnx_artifact("fp32", cache_dir).data, quant),
        )
    raise UnsupportedPrecisionError(
        f"no ONNX model for precision {precision}",
        hint="knobs.precision: use fp32, fp16 or int8 with onnxruntime or tensorrt",
    )


def _check_precision(precision: str, device: str) -> None:
    if precision == "bf16":
        raise UnsupportedPrecisionError(
            "engine onnxruntime has no bf16 precision (no bf16 convolution kernels in its CPU "
            "or CUDA providers)",
            hint="knobs.precision: use fp32 or int8 (or fp16 on device cuda) with onnxruntime, "
            "or knobs.engine: torch for bf16",
        )
    if precision == "int8" and device != "cpu":
        raise UnsupportedPrecisionError(
            "onnxruntime's CUDA provider has no int8 convolution kernels: the QDQ model would "
            "dequantise around fp32 convolutions, fp32 compute under the int8 name",
            hint="knobs.engine: tensorrt for int8 on cuda (it runs the same QDQ model in "
            "int8), or knobs.device: cpu for onnxruntime int8",
        )
    if precision == "fp16" and device == "cpu":
        raise UnsupportedPrecisionError(
            "onnxruntime's CPU provider has no fp16 kernels for this model's convolutions: it "
            "would cast the fp16 model back to fp32 and run the fp32 graph under the fp16 name",
            hint="knobs.precision: use fp32 or int8 with onnxruntime on cpu; fp16 needs "
            "knobs.device: cuda (onnxruntime-gpu), or knobs.engine: torch",
        )


def _providers(ort: Any, device: str) -> list[Any]:
    if device == "cpu":
        return ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise EngineUnavailableError(
            "device cuda needs onnxruntime's CUDA provider, but the installed onnxruntime "
            f"offers only {', '.join(ort.get_available_providers())}",
            hint="on a machine with an NVIDIA GPU: pip uninstall onnxruntime, then "
            "pip install 'optlab[gpu]' (onnxruntime-gpu); or knobs.device: cpu",
        )
    _load_cuda_libraries(ort)
    index = int(device.removeprefix("cuda:")) if device.startswith("cuda:") else 0
    return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]


def _load_cuda_libraries(ort: Any) -> None:
    """Make CUDA and cuDNN loadable for the CUDA provider: a CUDA build of torch loads them when
    imported (onnxruntime's documented way to coexist); without one, onnxruntime's own
    preload_dlls looks in the nvidia pip packages."""
    try:
        import torch
    except ImportError:
        torch_cuda = None
    else:
        torch_cuda = torch.version.cuda
    if torch_cuda is None and hasattr(ort, "preload_dlls"):
        ort.preload_dlls()


def _session_options(ort: Any, threads: int) -> Any:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    # One request batch at a time; parallel requests come from instances, not from ORT.
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # ORT's idle intra-op threads spin by default: in a service they burn the cores that
    # the request threads need for decode and preprocessing (measured on the 2-core dev
    # machine: python preprocess P50 7 -> 41 ms when the engine switched to onnxruntime).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _check_cuda_started(device: str, used: list[str]) -> None:
    if device != "cpu" and "CUDAExecutionProvider" not in used:
        # onnxruntime-gpu falls back to the CPU quietly when CUDA or cuDNN cannot load.
        raise EngineUnavailableError(
            f"onnxruntime did not start its CUDA provider (session providers: {used}): the "
            "CUDA or cuDNN libraries it needs could not be loaded, or no GPU is visible",
            hint="install the CUDA 12 and cuDNN 9 libraries onnxruntime-gpu needs (or a "
            "CUDA build of torch, which brings them), or knobs.device: cpu",
        )


class OnnxRuntimeEngine:
    """An onnxruntime InferenceSession over the cached model. `infer` is thread-safe."""

    def __init__(
        self,
        precision: str,
        device: str,
        threads: int,
        cache_dir: Path | None = None,
        quant: QuantConfig = ORT_CPU_INT8,
    ) -> None:
        _check_precision(precision, device)
        import onnxruntime as ort

        providers = _providers(ort, device)
        artifact = onnx_artifact(precision, cache_dir, quant)
        options = _session_options(ort, threads)
        start = time.perf_counter()
        try:
            self._session = ort.InferenceSession(
                artifact.data, sess_options=options, providers=providers
            )
        except Exception as exc:  # onnxruntime raises its own untyped exceptions
            raise EngineError(
                f"onnxruntime cannot load {artifact.path}: {exc}",
                hint=f"delete {artifact.path} to rebuild it, or knobs.engine: torch",
            ) from exc
        load_s = time.perf_counter() - start
        used = list(self._session.get_providers())
        _check_cuda_started(device, used)
        self._ort = ort
        self._device = device
        self._device_id = 0 if device == "cpu" else int(providers[0][1]["device_id"])
        self._closed = False
        self.description: dict[str, Any] = {
            "engine": "onnxruntime",
            "precision": precision,
            "device": device,
            "threads": threads,
            "inter_op_threads": 1,
            "allow_spinning": False,
            "graph_optimization": "ORT_ENABLE_ALL",
            "providers": used,
            **artifact_description(artifact),
            "load_s": round(load_s, 3),
            "opset": OPSET,
            "onnxruntime": ort.__version__,
        }
        if precision == "int8":
            self.description["quantization"] = quant.key_parts()

    def infer(self, batch: Any) -> npt.NDArray[np.float32]:
        check_open(self._closed, "onnxruntime")
        if self._device != "cpu" and is_torch_tensor(batch) and batch.device.type == "cuda":
            return self._infer_on_device(batch)
        outputs = self._session.run([OUTPUT_NAME], {INPUT_NAME: host_array(batch)})
        return np.asarray(outputs[0], dtype=np.float32)

    def _infer_on_device(self, batch: Any) -> npt.NDArray[np.float32]:
        """A torch tensor already on the GPU is bound in place (IO binding): no host trip."""
        import torch

        check_batch_shape(tuple(batch.shape))
        tensor = batch.detach().to(device=f"cuda:{self._device_id}", dtype=torch.float32)
        tensor = tensor.contiguous()
        # onnxruntime reads the buffer from its own CUDA stream: torch's work that produced it
        # must have finished first.
        torch.cuda.current_stream(tensor.device).synchronize()
        binding = self._session.io_binding()
        binding.bind_input(
            name=INPUT_NAME,
            device_type="cuda",
            device_id=self._device_id,
            element_type=np.float32,
            shape=tuple(tensor.shape),
            buffer_ptr=tensor.data_ptr(),
        )
        # Output on the host: onnxruntime copies it back and synchronises before returning.
        binding.bind_output(OUTPUT_NAME, "cpu")
        self._session.run_with_iobinding(binding)
        return np.asarray(binding.copy_outputs_to_cpu()[0], dtype=np.float32)

    def close(self) -> None:
        self._closed = True
        self._session = None


def build(precision: str, device: str, threads: int, cache_dir: Path | None) -> OnnxRuntimeEngine:
    return OnnxRuntimeEngine(precision, device, threads, cache_dir)
