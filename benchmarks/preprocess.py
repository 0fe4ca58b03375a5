"""What one request's preprocess costs in each variant of the `preprocess` knob.

Held-out renders at 128, 256 and 512 px go through `data.decode_reference` (the canonical
preprocess: full decode, PIL resize, numpy normalise) and through every variant of
`optlab.reference.classifier.preprocess`; each call is timed on its own with `perf_counter_ns`.
Each variant runs over all the payloads in a block, a few untimed calls first, and the order of
the blocks rotates from pass to pass, so a burst of load from elsewhere on the machine is spread
over the variants. (Interleaving the variants call by call instead made whichever ran after
``python`` look 40-100% slower: the naive variant's 0.5-1.5 MiB of short-lived floats evict the
decoder's working set.) Printed per size and variant: median and P99 per image, and the
median's ratio to the reference's, measured in the same run.

Allocations: a separate pass of a few calls (``--traced``; the figure is the same call after
call, and tracemalloc slows ``python`` 30x) gives the peak traced memory above the baseline
during one call, median over the calls. tracemalloc sees Python objects and numpy's buffers;
PIL's image memory and torch's CPU allocator are C allocations it does not see, so the torch
figure counts only what goes through numpy. About 64 KiB of every figure is PIL's `tobytes`,
which encodes into a 64 KiB chunk (ImageFile.MAXBLOCK) before trimming it.

torch runs on the CPU with one intra-op thread (``--torch-threads``): preprocess runs on each
request's own thread, and numpy and PIL use one core per call too.

Goals: ``python`` (the naive baseline) costs 3-10 ms per 256 px image, slow but not absurd;
``numpy-pooled`` allocates less per call than ``numpy``. A measurement, not a test: PASS/MISS is
printed and the exit status is 0 either way.

Run: ``PYTHONPATH=src python benchmarks/preprocess.py [--smoke]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from provenance import source_hashes

from optlab.reference.classifier.data import MODEL_SIDE, decode_reference, requests
from optlab.reference.classifier.preprocess import VARIANTS, make_preprocessor

REFERENCE = "reference"
SIZES = (128, 256, 512)
GOAL_SIZE = 256
PYTHON_GOAL_MS = (3.0, 10.0)
WARMUP_CALLS = 5


@dataclass(frozen=True)
class Figure:
    size: int
    variant: str
    median_ms: float
    p99_ms: float
    peak_kib: float


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile: with a few hundred samples, P99 is one of the slowest few."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100.0 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def reference(jpeg: bytes) -> Any:
    return decode_reference(jpeg, MODEL_SIDE)


def timed(
    functions: dict[str, Callable[[bytes], Any]], payloads: list[bytes], passes: int
) -> dict[str, list[float]]:
    """Milliseconds per call. Each pass runs every variant over all payloads in a block, after
    a few untimed calls; the order of the blocks rotates from pass to pass."""
    clock = time.perf_counter_ns
    names = list(functions)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(passes):
        for name in names[turn % len(names) :] + names[: turn % len(names)]:
            function = functions[name]
            for payload in payloads[:WARMUP_CALLS]:
                function(payload)
            for payload in payloads:
                start = clock()
                function(payload)
                samples[name].append((clock() - start) / 1e6)
    return samples


def traced_peak_kib(function: Callable[[bytes], Any], payloads: list[bytes]) -> float:
    """Median over calls of the traced peak above what was live before the call."""
    function(payloads[0])  # lazy set-up (per-thread buffers, torch constants) is not per call
    peaks = []
    tracemalloc.start()
    try:
        for payload in payloads:
            before, _ = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            result = function(payload)
            _, peak = tracemalloc.get_traced_memory()
            del result
            peaks.append((peak - before) / 1024)
    finally:
        tracemalloc.stop()
    return statistics.median(peaks)


def code_id() -> str:
    return source_hashes("reference/classifier/preprocess.py", "reference/classifier/data.py")


def versions(torch_threads: int) -> str:
    import numpy
    import PIL
    import torch

    return (
        f"numpy {numpy.__version__}, Pillow {PIL.__version__}, torch {torch.__version__} "
        f"({torch_threads} intra-op thread{'s' if torch_threads != 1 else ''})"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="20 images, one pass: seconds")
    parser.add_argument("--images", type=int, default=100, help="distinct renders per size")
    parser.add_argument("--passes", type=int, default=3, help="timed passes over them")
    parser.add_argument("--traced", type=int, default=5, help="calls under tracemalloc")
    parser.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args(argv)
    images, passes, traced = (20, 1, 3) if args.smoke else (args.images, args.passes, args.traced)

    import torch

    torch.set_num_threads(args.torch_threads)
    functions: dict[str, Callable[[bytes], Any]] = {REFERENCE: reference}
    functions.update((variant, make_preprocessor(variant)) for variant in VARIANTS)
    load1, _, _ = os.getloadavg()
    print(
        f"# preprocess: Python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
        f"{load1:.2f}; code: {code_id()}; {versions(args.torch_threads)}; output "
        f"3x{MODEL_SIDE}x{MODEL_SIDE} float32; {images * passes} timed calls per variant and "
        f"size ({images} held-out renders x {passes} passes, in rotating blocks)"
    )
    figures: dict[tuple[int, str], Figure] = {}
    for size in SIZES:
        payloads = [s.jpeg for s in requests(split="holdout", count=images, size=size, seed=5)]
        samples = timed(functions, payloads, passes)
        base = statistics.median(samples[REFERENCE])
        for name, function in functions.items():
            figure = Figure(
                size=size,
                variant=name,
                median_ms=statistics.median(samples[name]),
                p99_ms=percentile(samples[name], 99.0),
                peak_kib=traced_peak_kib(function, payloads[:traced]),
            )
            figures[(size, name)] = figure
            print(
                f"{size:4d} px  {name:<13} median {figure.median_ms:7.3f} ms  "
                f"P99 {figure.p99_ms:7.3f} ms  (ratio {figure.median_ms / base:6.2f})  "
                f"traced peak {figure.peak_kib:7.1f} KiB/call"
            )

    print("# goals")
    python = figures[(GOAL_SIZE, "python")]
    low, high = PYTHON_GOAL_MS
    verdict = "PASS" if low <= python.median_ms <= high else "MISS"
    print(
        f"python at {GOAL_SIZE} px costs {low:g}-{high:g} ms per image (the naive baseline, not "
        f"absurdly slow): median {python.median_ms:.2f} ms {verdict}"
    )
    fresh, pooled = figures[(GOAL_SIZE, "numpy")], figures[(GOAL_SIZE, "numpy-pooled")]
    verdict = "PASS" if pooled.peak_kib < fresh.peak_kib else "MISS"
    print(
        f"numpy-pooled allocates less per call than numpy ({GOAL_SIZE} px, traced peak): "
        f"{pooled.peak_kib:.1f} KiB against {fresh.peak_kib:.1f} KiB {verdict}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
