"""Exercise every GPU inference path once and print latency and held-out accuracy per path.

Paths: torch on cuda (fp32, fp16, bf16), torch on cuda fed by the torch preprocess on the
device, onnxruntime's CUDA provider (fp32, fp16, and int8, which is refused by design),
TensorRT (fp32, fp16, bf16, int8). A path that cannot run here prints `skipped: <reason>` (the
engine's own error) instead of crashing; on a machine without a GPU every path is skipped and
the script exits 0 after saying so. An unexpected failure prints `FAILED` and the exit code is 1.

`--cpu` adds the CPU paths (torch fp32/bf16/fp16, onnxruntime fp32 and int8 with the
quantisation variants worth comparing) so the same table gives the CPU figures.

Latency is per `engine.infer` call on decoded held-out images (host numpy batches, except the
preprocess path, which includes the device preprocess of each JPEG): median and P90 over
interleaved rounds, so a noisy neighbour slows every path alike. Accuracy is top-1 on the first
`--count` held-out renders, and agreement with the torch fp32 CPU reference on the same inputs.

    PYTHONPATH=src python benchmarks/gpu_check.py            # GPU paths only
    PYTHONPATH=src python benchmarks/gpu_check.py --cpu      # and the CPU paths
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from optlab.errors import OptlabError
from optlab.reference.engines import load_engine
from optlab.reference.engines.base import Engine
from optlab.reference.engines.quantize import ORT_CPU_INT8, TENSORRT_INT8, QuantConfig

BATCH_SIZES = (1, 8)


@dataclass
class Path_:
    label: str
    engine: str
    precision: str
    device: str
    quant: str | None = None  # name of a quantize.QuantConfig variant (onnxruntime int8)
    preprocess: bool = False  # feed JPEGs through the torch preprocess on the device
    gpu: bool = True


@dataclass
class Row:
    path: Path_
    status: str = "ok"
    reason: str = ""
    loaded: Any = None
    build_s: float = 0.0
    samples: dict[int, list[float]] = field(default_factory=lambda: {b: [] for b in BATCH_SIZES})
    top1: float | None = None
    agreement: float | None = None
    note: str = ""
    run: Callable[[int], None] | None = None


def gpu_paths() -> list[Path_]:
    return [
        Path_("torch cuda fp32", "torch", "fp32", "cuda"),
        Path_("torch cuda fp16", "torch", "fp16", "cuda"),
        Path_("torch cuda bf16", "torch", "bf16", "cuda"),
        Path_("torch cuda fp32 + torch preprocess", "torch", "fp32", "cuda", preprocess=True),
        Path_("onnxruntime cuda fp32", "onnxruntime", "fp32", "cuda"),
        Path_("onnxruntime cuda fp16", "onnxruntime", "fp16", "cuda"),
        Path_("onnxruntime cuda int8", "onnxruntime", "int8", "cuda"),
        Path_("tensorrt fp32", "tensorrt", "fp32", "cuda"),
        Path_("tensorrt fp16", "tensorrt", "fp16", "cuda"),
        Path_("tensorrt bf16", "tensorrt", "bf16", "cuda"),
        Path_("tensorrt int8 (QDQ)", "tensorrt", "int8", "cuda"),
    ]


def cpu_paths() -> list[Path_]:
    paths = [
        Path_("torch cpu fp32", "torch", "fp32", "cpu", gpu=False),
        Path_("torch cpu bf16", "torch", "bf16", "cpu", gpu=False),
        Path_("torch cpu fp16", "torch", "fp16", "cpu", gpu=False),
        Path_("onnxruntime cpu fp32", "onnxruntime", "fp32", "cpu", gpu=False),
    ]
    for name in QUANT_VARIANTS:
        label = f"onnxruntime cpu int8 {name}"
        paths.append(Path_(label, "onnxruntime", "int8", "cpu", quant=name, gpu=False))
    return paths


# The quantisation options that matter on an x86 CPU: format, activation type, per-channel
# weights, reduce_range (7-bit weights against VPMADDUBSW saturation on CPUs without VNNI).
QUANT_VARIANTS: dict[str, QuantConfig] = {
    "QDQ u8/s8 per-channel (default)": ORT_CPU_INT8,
    "QDQ s8/s8 symmetric (TensorRT's)": TENSORRT_INT8,
    "QDQ s8/s8 per-channel": QuantConfig(name="qdq-s8", activation_type="QInt8"),
    "QDQ u8/s8 per-tensor": QuantConfig(name="qdq-u8-pt", per_channel=False),
    "QDQ u8/s8 reduce_range": QuantConfig(name="qdq-u8-rr", reduce_range=True),
    "QOperator u8/s8 per-channel": QuantConfig(name="qop-u8", quant_format="QOperator"),
}


class HeldOut:
    """The held-out payloads, their decoded inputs and labels, and the reference predictions;
    built on first use, so a machine where nothing runs does no work."""

    def __init__(self, count: int, threads: int) -> None:
        from optlab.reference.classifier.data import MODEL_SIDE, decode_reference, requests

        samples = requests(split="holdout", count=count, size=256, seed=0)
        self.payloads = [sample.jpeg for sample in samples]
        self.labels = np.array([sample.label for sample in samples])
        self.images = np.stack([decode_reference(jpeg, MODEL_SIDE) for jpeg in self.payloads])
        # The same threads as the paths: torch.set_num_threads is process-global, so another
        # value here would change the torch paths' threads after they were built.
        reference = load_engine("torch", "fp32", "cpu", threads=threads)
        self.reference = predictions(reference.infer, self.images)
        reference.close()


def predictions(infer: Callable[[Any], np.ndarray], images: np.ndarray) -> np.ndarray:
    chunks = [infer(images[start : start + 64]) for start in range(0, len(images), 64)]
    labels: np.ndarray = np.concatenate(chunks).argmax(axis=1)
    return labels


def load(path: Path_, threads: int, cache_dir: Path | None) -> Engine:
    if path.quant is not None:
        from optlab.reference.engines.onnx_engine import OnnxRuntimeEngine

        config = QUANT_VARIANTS[path.quant]
        return OnnxRuntimeEngine("int8", path.device, threads, cache_dir, quant=config)
    return load_engine(path.engine, path.precision, path.device, threads, cache_dir=cache_dir)


def preprocessor(device: str) -> Callable[[bytes], Any]:
    try:
        from optlab.reference.classifier.preprocess import make_preprocessor
    except ImportError as exc:
        raise OptlabError(
            f"the torch preprocess is not available: {exc}",
            hint="optlab.reference.classifier.preprocess.make_preprocessor is needed",
        ) from exc
    made: Callable[[bytes], Any] = make_preprocessor("torch", device=device)
    return made


def prepare(row: Row, held: HeldOut) -> None:
    """Set the path's `run(batch_size)` and `predict_all()`, warm it up, measure accuracy."""
    engine: Engine = row.loaded
    if row.path.preprocess:
        import torch

        prep = preprocessor(row.path.device)

        def infer_jpegs(payloads: list[bytes]) -> np.ndarray:
            return engine.infer(torch.stack([prep(jpeg) for jpeg in payloads]))

        def run(batch: int) -> None:
            infer_jpegs(held.payloads[:batch])

        def predict_all() -> np.ndarray:
            chunks = range(0, len(held.payloads), 64)
            return np.concatenate(
                [infer_jpegs(held.payloads[i : i + 64]).argmax(1) for i in chunks]
            )

        first = prep(held.payloads[0]).float().cpu().numpy()
        diff = float(np.abs(first - held.images[0]).max())
        row.note = f"preprocess max |diff| vs decode_reference {diff:.4f}"
    else:

        def run(batch: int) -> None:
            engine.infer(held.images[:batch])

        def predict_all() -> np.ndarray:
            return predictions(engine.infer, held.images)

    row.run = run
    for batch in BATCH_SIZES:
        for _ in range(3):
            run(batch)
    predicted = predict_all()
    row.top1 = float((predicted == held.labels).mean())
    row.agreement = float((predicted == held.reference).mean())


def time_round(rows: list[Row], seconds: float) -> None:
    """One pass over every path; rounds interleave, so a noisy neighbour slows all alike."""
    for row in rows:
        assert row.run is not None
        for batch in BATCH_SIZES:
            deadline = time.perf_counter() + seconds
            count = 0
            while count < 3 or time.perf_counter() < deadline:
                start = time.perf_counter_ns()
                row.run(batch)
                row.samples[batch].append((time.perf_counter_ns() - start) / 1e6)
                count += 1


def header(threads: int) -> str:
    lines = [f"# gpu_check: Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
             f"load average {os.getloadavg()[0]:.2f}, engine threads {threads}"]
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none visible"
        lines.append(f"# torch {torch.__version__} (CUDA {torch.version.cuda}), GPU: {gpu}")
    except ImportError:
        lines.append("# torch: not installed")
    try:
        import onnxruntime

        providers = ", ".join(onnxruntime.get_available_providers())
        lines.append(f"# onnxruntime {onnxruntime.__version__}: {providers}")
    except ImportError:
        lines.append("# onnxruntime: not installed")
    try:
        import tensorrt

        lines.append(f"# tensorrt {tensorrt.__version__}")
    except ImportError:
        lines.append("# tensorrt: not installed")
    return "\n".join(lines)


def report(rows: list[Row], count: int) -> str:
    out = [
        f"{'path':<50} {'b1 ms (p90)':>15} {'b8 ms (p90)':>15} {'b8 ms/img':>9} "
        f"{'top1':>7} {'agree':>7} {'build s':>8}"
    ]
    for row in rows:
        if row.status != "ok":
            out.append(f"{row.path.label:<50} {row.status}: {row.reason}")
            continue
        cells = []
        for batch in BATCH_SIZES:
            times = sorted(row.samples[batch])
            p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
            cells.append(f"{statistics.median(times):7.3f} ({p90:6.3f})")
        per_image = statistics.median(row.samples[8]) / 8
        out.append(
            f"{row.path.label:<50} {cells[0]:>15} {cells[1]:>15} {per_image:9.3f} "
            f"{row.top1:7.2%} {row.agreement:7.2%} {row.build_s:8.1f}"
            + (f"  {row.note}" if row.note else "")
        )
    out.append(f"# accuracy on {count} held-out renders; agree = same top-1 as torch fp32 cpu")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="also run the CPU paths")
    parser.add_argument("--only", help="run only paths whose label contains this text")
    parser.add_argument("--count", type=int, default=359, help="held-out renders for accuracy")
    parser.add_argument("--seconds", type=float, default=2.0, help="timing per path and batch")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved timing rounds")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cache-dir", type=Path, default=None, help="engine artefact cache")
    args = parser.parse_args(argv)

    print(header(args.threads), flush=True)
    paths = gpu_paths() + (cpu_paths() if args.cpu else [])
    if args.only:
        paths = [path for path in paths if args.only in path.label]
    rows = [Row(path) for path in paths]
    for row in rows:
        start = time.perf_counter()
        try:
            if row.path.preprocess:
                preprocessor(row.path.device)  # its own reason to skip, before the engine's
            row.loaded = load(row.path, args.threads, args.cache_dir)
        except OptlabError as exc:
            row.status, row.reason = "skipped", exc.message
            continue
        except Exception as exc:  # a bug to report, not a reason to stop the other paths
            row.status, row.reason = "FAILED", f"{type(exc).__name__}: {exc}"
            continue
        row.build_s = time.perf_counter() - start
        print(f"# loaded {row.path.label} in {row.build_s:.1f} s", flush=True)
    ready = [row for row in rows if row.status == "ok"]
    if ready:
        held = HeldOut(args.count, args.threads)
        for row in ready:
            try:
                prepare(row, held)
            except Exception as exc:  # report it, keep measuring the others
                row.status, row.reason = "FAILED", f"{type(exc).__name__}: {exc}"
        ready = [row for row in ready if row.status == "ok"]
        rounds = max(1, args.rounds)
        for _ in range(rounds):
            time_round(ready, args.seconds / rounds)
    print(report(rows, args.count))
    if not any(row.status == "ok" and row.path.gpu for row in rows):
        print("nothing GPU could run on this machine (each path above says why)")
    for row in rows:
        if row.loaded is not None:
            row.loaded.close()
    return 1 if any(row.status == "FAILED" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
