"""Inference engines: real torch and onnxruntime on this machine's CPU, against the torch fp32
reference, on decoded held-out renders; the artefact cache; the errors that name the knob.

GPU paths (torch cuda, onnxruntime's CUDA provider, TensorRT) run only where a GPU is visible
and are skipped with the reason otherwise.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

# torch, onnxruntime, onnxscript are dependencies (pyproject): a broken install fails, never skips.
import onnxruntime as ort
import onnxscript  # noqa: F401
import pytest
import torch

from optlab.reference.classifier import accuracy, data
from optlab.reference.engines import (
    Engine,
    EngineError,
    EngineUnavailableError,
    UnsupportedPrecisionError,
    base,
    load_engine,
    onnx_engine,
)
from tests.support import capabilities
from tests.support.capabilities import lacks
from tests.support.proc import optlab_env, run_python

REPO = Path(__file__).resolve().parents[2]
HAS_CUDA = bool(torch.cuda.is_available())
HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
HAS_ORT_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
needs_cuda = capabilities.needs_cuda()
THREADS = 1


@pytest.fixture(scope="module", autouse=True)
def _restore_torch_threads() -> Iterator[None]:
    # Building a torch engine calls torch.set_num_threads, which is process-global.
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def cache(engine_cache: Path) -> Path:
    """The session's artefact cache: the export and the quantisation are built once."""
    return engine_cache


@pytest.fixture(scope="module")
def held() -> tuple[np.ndarray, np.ndarray]:
    """48 held-out renders through the canonical decode, and their labels."""
    samples = data.requests(split="holdout", count=48, size=256, seed=0)
    images = np.stack([data.decode_reference(s.jpeg, data.MODEL_SIDE) for s in samples])
    return images, np.array([s.label for s in samples])


@pytest.fixture(scope="module")
def reference(held: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    from optlab.reference.classifier.model import load_trained

    with torch.inference_mode():
        logits: np.ndarray = load_trained("cpu")(torch.from_numpy(held[0])).numpy()
    return logits


def _agreement(logits: np.ndarray, reference: np.ndarray) -> float:
    return float((logits.argmax(1) == reference.argmax(1)).mean())


# --- the package and the protocol ----------------------------------------------------------


def test_importing_the_package_loads_no_framework() -> None:
    code = (
        "import sys, optlab.reference.engines\n"
        "heavy = [m for m in ('torch', 'onnxruntime', 'tensorrt', 'onnx') if m in sys.modules]\n"
        "print(heavy)\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    done = run_python(code)
    assert done.returncode == 0, done.stdout + done.stderr


def test_model_files_are_found_without_importing_the_model_module() -> None:
    from optlab.reference.classifier import model

    source, weights = onnx_engine.model_files()
    assert weights == model.weights_path()
    assert source == Path(model.__file__).resolve() or source.samefile(model.__file__)


def test_torch_fp32_engine_is_the_shipped_model(
    held: tuple[np.ndarray, np.ndarray], reference: np.ndarray
) -> None:
    engine = load_engine("torch", "fp32", "cpu", THREADS)
    assert isinstance(engine, Engine)
    logits = engine.infer(held[0])
    assert logits.dtype == np.float32 and logits.shape == (48, 10)
    np.testing.assert_allclose(logits, reference, rtol=1e-5, atol=1e-5)
    description = engine.description
    assert description["engine"] == "torch" and description["precision"] == "fp32"
    assert description["device"] == "cpu" and description["threads"] == THREADS
    assert description["providers"] == ["cpu"] and description["artifact"] is None
    assert torch.get_num_threads() == THREADS
    engine.close()
    with pytest.raises(EngineError, match="closed"):
        engine.infer(held[0][:1])


RUNS_HERE = [
    ("torch", "bf16"),
    ("torch", "fp16"),
    ("onnxruntime", "fp32"),
    ("onnxruntime", "int8"),
]


@pytest.mark.parametrize(("engine_name", "precision"), RUNS_HERE)
def test_engine_agrees_with_the_fp32_reference_at_any_batch_size(
    engine_name: str,
    precision: str,
    cache: Path,
    held: tuple[np.ndarray, np.ndarray],
    reference: np.ndarray,
) -> None:
    engine = load_engine(engine_name, precision, "cpu", THREADS, cache_dir=cache)
    assert isinstance(engine, Engine)
    for key in ("engine", "precision", "device", "threads", "providers", "artifact", "build_s"):
        assert key in engine.description
    assert engine.description["precision"] == precision
    full = engine.infer(held[0])
    assert full.dtype == np.float32 and full.shape == (48, 10)
    assert _agreement(full, reference) >= 0.99
    if (engine_name, precision) == ("onnxruntime", "fp32"):
        np.testing.assert_allclose(full, reference, rtol=1e-4, atol=1e-4)
    for size in (1, 8, 33):
        part = engine.infer(held[0][:size])
        assert part.shape == (size, 10) and part.dtype == np.float32
        assert _agreement(part, reference[:size]) >= 0.99
    # A torch tensor in another float dtype is accepted and cast.
    as_tensor = engine.infer(torch.from_numpy(held[0][:8]).double())
    assert _agreement(as_tensor, reference[:8]) >= 0.99
    engine.close()


def test_onnxruntime_description_says_what_runs(cache: Path) -> None:
    engine = load_engine("onnxruntime", "fp32", "cpu", 2, cache_dir=cache)
    description = engine.description
    assert description["providers"] == ["CPUExecutionProvider"]
    assert description["threads"] == 2 and description["inter_op_threads"] == 1
    assert description["graph_optimization"] == "ORT_ENABLE_ALL"
    assert Path(description["artifact"]).parent == cache / "onnx"
    assert description["opset"] == onnx_engine.OPSET
    engine.close()


def test_a_bad_batch_shape_is_an_error(cache: Path) -> None:
    engine = load_engine("onnxruntime", "fp32", "cpu", THREADS, cache_dir=cache)
    for shape in [(3, 64, 64), (2, 3, 32, 32), (0, 3, 64, 64), (2, 1, 64, 64)]:
        with pytest.raises(EngineError, match="shape") as raised:
            engine.infer(np.zeros(shape, dtype=np.float32))
        assert raised.value.hint
    engine.close()


# --- the artefact cache ---------------------------------------------------------------------


def test_second_load_reads_the_cache_and_does_not_export(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = load_engine("onnxruntime", "fp32", "cpu", THREADS, cache_dir=cache)
    path = Path(first.description["artifact"])
    mtime, digest = path.stat().st_mtime_ns, base.sha256_file(path)

    def no_export() -> bytes:
        raise AssertionError("the model was exported again")

    monkeypatch.setattr(onnx_engine, "export_fp32", no_export)
    second = load_engine("onnxruntime", "fp32", "cpu", THREADS, cache_dir=cache)
    assert second.description["cached"] is True
    assert second.description["build_s"] == 0.0
    assert second.description["artifact"] == str(path)
    assert path.stat().st_mtime_ns == mtime and base.sha256_file(path) == digest
    first.close()
    second.close()


def test_the_cache_key_follows_the_precision_and_the_environment_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert onnx_engine.export_key_parts("fp32") == onnx_engine.export_key_parts("fp32")
    assert base.content_key(onnx_engine.export_key_parts("fp32")) != base.content_key(
        onnx_engine.export_key_parts("int8")
    )
    monkeypatch.setenv(base.CACHE_ENV, str(tmp_path / "from-env"))
    assert base.cache_root() == tmp_path / "from-env"
    assert base.cache_root(tmp_path / "explicit") == tmp_path / "explicit"
    monkeypatch.delenv(base.CACHE_ENV)
    assert base.cache_root() == Path.home() / ".cache" / "optlab" / "engines"


@pytest.mark.parametrize("damage", ["truncate", "garbage", "manifest"])
def test_a_corrupt_cached_model_is_rebuilt(
    damage: str,
    cache: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    held: tuple[np.ndarray, np.ndarray],
    reference: np.ndarray,
) -> None:
    good = onnx_engine.onnx_artifact("fp32", cache)
    copy = tmp_path / "onnx"
    copy.mkdir()
    target = copy / good.path.name
    target.write_bytes(good.data)
    manifest = target.with_name(target.name + ".json")
    manifest.write_bytes(good.path.with_name(good.path.name + ".json").read_bytes())
    if damage == "truncate":
        target.write_bytes(good.data[: len(good.data) // 2])
    elif damage == "garbage":
        target.write_bytes(b"not an onnx model" * 100)
    else:
        manifest.write_text("{", encoding="utf-8")
    exports: list[int] = []

    def export_again() -> bytes:  # the real export is tested above; this counts the rebuild
        exports.append(1)
        return good.data

    monkeypatch.setattr(onnx_engine, "export_fp32", export_again)
    engine = load_engine("onnxruntime", "fp32", "cpu", THREADS, cache_dir=tmp_path)
    assert exports == [1]
    assert engine.description["repaired"] is True and engine.description["cached"] is False
    assert target.read_bytes() == good.data
    np.testing.assert_allclose(engine.infer(held[0][:4]), reference[:4], rtol=1e-4, atol=1e-4)
    engine.close()


def test_concurrent_builds_of_one_artefact_build_it_once(tmp_path: Path) -> None:
    builds: list[int] = []

    def build() -> bytes:
        builds.append(1)
        time.sleep(0.2)
        return b"artefact"

    results: list[base.Artifact] = []
    workers = [
        threading.Thread(
            target=lambda: results.append(
                base.cached_artifact(tmp_path, "thing", ".bin", {"k": 1}, build)
            )
        )
        for _ in range(3)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert builds == [1]
    assert [r.data for r in results] == [b"artefact"] * 3
    assert sorted(r.cached for r in results) == [False, True, True]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


# --- int8 accuracy ---------------------------------------------------------------------------


def _predict(engine: Any) -> accuracy.Predict:
    def predict(payloads: list[bytes]) -> list[int]:
        batch = np.stack([data.decode_reference(p, data.MODEL_SIDE) for p in payloads])
        logits = np.concatenate([engine.infer(batch[i : i + 64]) for i in range(0, len(batch), 64)])
        return [int(label) for label in logits.argmax(1)]

    return predict


def test_int8_held_out_top1_is_within_one_point_of_fp32(cache: Path) -> None:
    fp32 = load_engine("onnxruntime", "fp32", "cpu", 2, cache_dir=cache)
    int8 = load_engine("onnxruntime", "int8", "cpu", 2, cache_dir=cache)
    quantization = int8.description["quantization"]
    assert quantization["quant_format"] == "QDQ" and quantization["calibration_count"] >= 200
    fp32_predict = _predict(fp32)
    baseline = accuracy.evaluate(fp32_predict, count=200)
    quantized = accuracy.evaluate(_predict(int8), count=200, reference=fp32_predict)
    assert abs(quantized.top1 - baseline.top1) <= 0.01, (quantized, baseline)
    assert quantized.agreement is not None and quantized.agreement >= 0.98
    fp32.close()
    int8.close()


def test_the_fp16_model_for_the_cuda_provider_keeps_float32_io(
    cache: Path, held: tuple[np.ndarray, np.ndarray], reference: np.ndarray
) -> None:
    """Built here (the conversion needs no GPU) and checked for its interface and its answers;
    the CPU provider runs it by casting back to fp32, which is why the engine refuses it there."""
    import onnx

    artifact = onnx_engine.onnx_artifact("fp16", cache)
    model = onnx.load_from_string(artifact.data)
    float32, float16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16
    assert model.graph.input[0].type.tensor_type.elem_type == float32
    assert model.graph.output[0].type.tensor_type.elem_type == float32
    assert any(init.data_type == float16 for init in model.graph.initializer)
    session = ort.InferenceSession(artifact.data, providers=["CPUExecutionProvider"])
    logits = session.run(None, {onnx_engine.INPUT_NAME: held[0]})[0]
    assert _agreement(logits, reference) >= 0.99


def test_calibration_uses_train_renders_only() -> None:
    from optlab.reference.engines.quantize import ORT_CPU_INT8, calibration_batches

    batches = calibration_batches(ORT_CPU_INT8)
    assert sum(len(b) for b in batches) == ORT_CPU_INT8.calibration_count
    train = data.requests(split="train", count=4, size=256, seed=ORT_CPU_INT8.calibration_seed)
    first = np.stack([data.decode_reference(s.jpeg, data.MODEL_SIDE) for s in train])
    np.testing.assert_array_equal(batches[0][:4], first)
    holdout = set(data.split_indices("holdout"))
    assert not {s.index for s in train} & holdout


# --- errors that name the knob --------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "error", "message", "knob"),
    [
        (("torch", "int8", "cpu"), UnsupportedPrecisionError, "onnxruntime", "knobs.engine"),
        (("onnxruntime", "bf16", "cpu"), UnsupportedPrecisionError, "bf16", "knobs.precision"),
        (("onnxruntime", "fp16", "cpu"), UnsupportedPrecisionError, "fp16", "knobs.device"),
        (("onnxruntime", "int8", "cuda"), UnsupportedPrecisionError, "int8", "knobs.engine"),
        (("tensorrt", "fp16", "cpu"), EngineUnavailableError, "cuda only", "knobs.device"),
        (("tflite", "fp32", "cpu"), EngineError, "unknown engine", "knobs.engine"),
        (("torch", "fp8", "cpu"), EngineError, "unknown precision", "knobs.precision"),
        (("torch", "fp32", "tpu"), EngineError, "unknown device", "knobs.device"),
    ],
)
def test_unsupported_combinations_are_clear_errors(
    args: tuple[str, str, str], error: type[EngineError], message: str, knob: str, tmp_path: Path
) -> None:
    with pytest.raises(error, match=message) as raised:
        load_engine(*args, THREADS, cache_dir=tmp_path)
    assert raised.value.hint is not None and knob in raised.value.hint
    assert not list(tmp_path.iterdir()), "nothing should be built for a refused combination"


@pytest.mark.parametrize("threads", [0, -1, True])
def test_threads_must_be_positive(threads: Any) -> None:
    with pytest.raises(EngineError, match="threads") as raised:
        load_engine("torch", "fp32", "cpu", threads)
    assert raised.value.hint is not None and "knobs.threads" in raised.value.hint


@capabilities.without_tensorrt()
def test_tensorrt_missing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailableError) as raised:
        load_engine("tensorrt", "fp16", "cuda", THREADS, cache_dir=tmp_path)
    assert "engine tensorrt needs the tensorrt package, which is not installed" in str(raised.value)
    assert raised.value.hint is not None
    assert "optlab[tensorrt]" in raised.value.hint and "onnxruntime" in raised.value.hint


@capabilities.without_cuda()
@pytest.mark.parametrize("engine_name", ["torch", "onnxruntime"])
def test_cuda_without_a_gpu_is_a_clear_error(engine_name: str, tmp_path: Path) -> None:
    if engine_name == "onnxruntime" and HAS_ORT_CUDA:
        lacks("onnxruntime-gpu is installed: the session check is the one that applies")
    with pytest.raises(EngineUnavailableError, match="cuda|CUDA") as raised:
        load_engine(engine_name, "fp32", "cuda", THREADS, cache_dir=tmp_path)
    assert raised.value.hint is not None and "knobs.device" in raised.value.hint


@pytest.mark.filterwarnings("ignore:Specified provider 'CUDAExecutionProvider'")
def test_onnxruntime_falling_back_to_cpu_is_caught(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """onnxruntime-gpu quietly runs on the CPU when CUDA cannot load. Here the CPU build is
    made to claim a CUDA provider: the session it creates really does fall back, and the engine
    must notice from session.get_providers() and refuse."""
    if HAS_ORT_CUDA:
        lacks("onnxruntime-gpu is installed: its CUDA provider may really start")
    monkeypatch.setattr(
        ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    with pytest.raises(EngineUnavailableError, match="did not start its CUDA provider") as raised:
        load_engine("onnxruntime", "fp32", "cuda", THREADS, cache_dir=cache)
    assert raised.value.hint is not None and "knobs.device" in raised.value.hint


def test_gpu_check_degrades_without_a_gpu(tmp_path: Path) -> None:
    if HAS_CUDA:
        lacks("a GPU is visible: gpu_check.py would measure, not degrade")
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "gpu_check.py"), "--cache-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env=optlab_env(),
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "nothing GPU could run on this machine" in done.stdout
    assert done.stdout.count("skipped:") >= 10
    assert "FAILED" not in done.stdout


# --- GPU paths (skipped without a GPU) ------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_torch_cuda_agrees_and_takes_device_tensors(
    precision: str, held: tuple[np.ndarray, np.ndarray], reference: np.ndarray
) -> None:
    engine = load_engine("torch", precision, "cuda", THREADS)
    assert _agreement(engine.infer(held[0]), reference) >= 0.99
    for size in (1, 8, 33, 100):  # 100 grows the pinned buffer past its first size
        batch = np.concatenate([held[0]] * 3)[:size]
        assert engine.infer(batch).shape == (size, 10)
    on_device = torch.from_numpy(held[0]).cuda().half()
    assert _agreement(engine.infer(on_device), reference) >= 0.99
    engine.close()


@needs_cuda
@capabilities.needs_ort_cuda()
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_onnxruntime_cuda_uses_the_cuda_provider(
    precision: str, cache: Path, held: tuple[np.ndarray, np.ndarray], reference: np.ndarray
) -> None:
    engine = load_engine("onnxruntime", precision, "cuda", THREADS, cache_dir=cache)
    assert engine.description["providers"][0] == "CUDAExecutionProvider"
    assert _agreement(engine.infer(held[0]), reference) >= 0.99
    assert _agreement(engine.infer(torch.from_numpy(held[0]).cuda()), reference) >= 0.99
    engine.close()


@needs_cuda
@capabilities.needs_tensorrt()
@pytest.mark.parametrize("precision", ["fp32", "fp16", "int8"])
def test_tensorrt_agrees_and_caches_its_plan(
    precision: str, cache: Path, held: tuple[np.ndarray, np.ndarray], reference: np.ndarray
) -> None:
    engine = load_engine("tensorrt", precision, "cuda", THREADS, cache_dir=cache)
    assert _agreement(engine.infer(held[0]), reference) >= 0.97
    for size in (1, 8, 33):
        assert engine.infer(held[0][:size]).shape == (size, 10)
    again = load_engine("tensorrt", precision, "cuda", THREADS, cache_dir=cache)
    assert again.description["cached"] is True and again.description["build_s"] == 0.0
    engine.close()
    again.close()
