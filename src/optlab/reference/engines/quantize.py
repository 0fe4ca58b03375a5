"""int8 static quantisation of the exported model with onnxruntime.quantization.

Calibration uses renders of the TRAIN split only (the held-out split measures accuracy and must
never shape the model), decoded with the canonical `data.decode_reference`: the same inputs the
served model sees. The result is a QDQ model: onnxruntime's CPU provider fuses it into int8
kernels, and TensorRT reads it as explicit quantisation.

Two configurations are used:
- `ORT_CPU_INT8` for onnxruntime on the CPU: activations QUInt8 (asymmetric), weights QInt8
  per channel. Chosen by measurement (`benchmarks/gpu_check.py --cpu`) on the 2-core AVX2
  machine without VNNI, 1 thread: fp32 0.69 ms at batch 1 and 5.7 ms at batch 8; this int8
  0.53 and 4.0 ms, with held-out top-1 equal to fp32 (98.05%, 100% agreement). QInt8
  activations are about twice as slow (1.0-1.1 and 7.8-8.3 ms: slower than fp32 here), while
  per-tensor weights, reduce_range and QOperator stayed within the run-to-run noise of this
  choice (0.53-0.71 and 4.0-5.0 ms).
- `TENSORRT_INT8` for TensorRT: TensorRT accepts only symmetric int8 (zero point 0) and
  8-bit dequantisation, so activations and weights are QInt8 and symmetric, biases float.

onnxruntime is imported inside the functions: this module is imported by `onnx_engine`, which
`load_engine` imports lazily.
"""

from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from optlab.reference.engines.base import EngineError, EngineUnavailableError, sha256_file

CALIBRATION_BATCH = 32


@dataclass(frozen=True)
class QuantConfig:
    """The quantize_static options that shape the int8 model, and its calibration data."""

    name: str
    quant_format: str = "QDQ"  # QDQ | QOperator
    activation_type: str = "QUInt8"  # QUInt8 | QInt8
    weight_type: str = "QInt8"
    per_channel: bool = True
    reduce_range: bool = False
    symmetric_activations: bool = False
    # Biases as int32 behind a DequantizeLinear (onnxruntime's default), or left in float.
    quantize_bias: bool = True
    # Ops left in float. InstanceNormalization has no int8 kernel in either runtime: quantising
    # around it only adds a quantise/dequantise pair and rounds the raw input to 8 bits.
    exclude_op_types: tuple[str, ...] = ("InstanceNormalization",)
    calibration_method: str = "MinMax"  # MinMax | Entropy | Percentile
    calibration_count: int = 256
    calibration_seed: int = 0
    # Side of the rendered payloads before decode: the served default (data.requests size=256).
    calibration_payload_side: int = 256

    def key_parts(self) -> dict[str, Any]:
        parts = dataclasses.asdict(self)
        # Calibration renders depend on the render code: a change there changes the scales.
        parts["data_source_sha256"] = sha256_file(_data_source())
        return parts


ORT_CPU_INT8 = QuantConfig(name="ort")
# TensorRT dequantises only 8-bit (and narrower) tensors, so int32 biases stay float: it fuses
# them into its int8 convolutions itself.
TENSORRT_INT8 = QuantConfig(
    name="trt",
    activation_type="QInt8",
    weight_type="QInt8",
    symmetric_activations=True,
    quantize_bias=False,
)


def _data_source() -> Path:
    from optlab.reference.classifier import data

    return Path(data.__file__)


def calibration_batches(config: QuantConfig) -> list[npt.NDArray[np.float32]]:
    """Train-split renders through the canonical decode, in batches of CALIBRATION_BATCH."""
    from optlab.reference.classifier.data import MODEL_SIDE, decode_reference, requests

    samples = requests(
        split="train",
        count=config.calibration_count,
        size=config.calibration_payload_side,
        seed=config.calibration_seed,
    )
    images = np.stack([decode_reference(sample.jpeg, MODEL_SIDE) for sample in samples])
    return [
        np.ascontiguousarray(images[start : start + CALIBRATION_BATCH])
        for start in range(0, len(images), CALIBRATION_BATCH)
    ]


def _reader(batches: list[npt.NDArray[np.float32]], input_name: str) -> Any:
    from onnxruntime.quantization import CalibrationDataReader

    class _Reader(CalibrationDataReader):  # type: ignore[misc]  # onnxruntime is untyped
        def __init__(self) -> None:
            self._position = 0

        def get_next(self) -> dict[str, npt.NDArray[np.float32]] | None:
            if self._position >= len(batches):
                return None
            self._position += 1
            return {input_name: batches[self._position - 1]}

        def rewind(self) -> None:
            self._position = 0

    return _Reader()


def _nodes_of_types(model_path: Path, op_types: tuple[str, ...]) -> list[str]:
    import onnx

    model = onnx.load(str(model_path))
    names = [node.name for node in model.graph.node if node.op_type in op_types]
    if any(not name for name in names):
        raise EngineError(
            "the exported model has unnamed nodes, so they cannot be kept out of quantisation",
            hint="check the torch and onnxscript versions against constraints.txt",
        )
    return names


def quantize_int8(fp32: bytes, config: QuantConfig, input_name: str = "input") -> bytes:
    """The int8 model for `config`, from the serialised fp32 model."""
    try:
        from onnxruntime import quantization as q
        from onnxruntime.quantization.shape_inference import quant_pre_process
    except ImportError as exc:
        raise EngineUnavailableError(
            "int8 needs onnxruntime.quantization, which cannot be imported here",
            hint="pip install onnxruntime (or onnxruntime-gpu) >= 1.17, or knobs.precision: fp32",
        ) from exc
    batches = calibration_batches(config)
    with tempfile.TemporaryDirectory(prefix="optlab-quantize-") as tmp:
        source = Path(tmp) / "fp32.onnx"
        prepared = Path(tmp) / "prepared.onnx"
        output = Path(tmp) / "int8.onnx"
        source.write_bytes(fp32)
        try:
            # Shape inference and graph clean-up first, as onnxruntime recommends: quantising
            # a graph whose shapes are unknown leaves tensors unquantised.
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=False)
            excluded = _nodes_of_types(prepared, config.exclude_op_types)
            q.quantize_static(
                str(prepared),
                str(output),
                _reader(batches, input_name),
                quant_format=getattr(q.QuantFormat, config.quant_format),
                activation_type=getattr(q.QuantType, config.activation_type),
                weight_type=getattr(q.QuantType, config.weight_type),
                per_channel=config.per_channel,
                reduce_range=config.reduce_range,
                calibrate_method=getattr(q.CalibrationMethod, config.calibration_method),
                nodes_to_exclude=excluded,
                extra_options={
                    "ActivationSymmetric": config.symmetric_activations,
                    "WeightSymmetric": True,
                    "QuantizeBias": config.quantize_bias,
                },
            )
        except Exception as exc:  # quantisation raises assorted untyped errors
            raise EngineError(
                f"onnxruntime static quantisation failed ({config.name}): {exc}",
                hint="knobs.precision: use fp32, or check the onnxruntime version against "
                "constraints.txt",
            ) from exc
        return output.read_bytes()


__all__ = ["ORT_CPU_INT8", "TENSORRT_INT8", "QuantConfig", "calibration_batches", "quantize_int8"]
