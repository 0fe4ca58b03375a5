"""Inference engines for the reference image classifier: torch (eager), onnxruntime (exported
ONNX, int8 by static quantisation) and TensorRT (plans built from the same ONNX).

Importing this package is cheap: torch, onnxruntime and tensorrt are imported only when
`load_engine` builds an engine that needs them.

    engine = load_engine("onnxruntime", "int8", "cpu", threads=2)
    logits = engine.infer(batch)      # float32 N x 3 x 64 x 64 -> float32 N x 10
    engine.description                # what actually runs, and where its artefact is cached
    engine.close()
"""

from optlab.reference.engines.base import (
    ENGINES,
    PRECISIONS,
    Engine,
    EngineError,
    EngineUnavailableError,
    UnsupportedPrecisionError,
    cache_root,
    load_engine,
)

__all__ = [
    "ENGINES",
    "PRECISIONS",
    "Engine",
    "EngineError",
    "EngineUnavailableError",
    "UnsupportedPrecisionError",
    "cache_root",
    "load_engine",
]
