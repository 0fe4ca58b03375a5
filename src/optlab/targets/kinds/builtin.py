"""`kind: builtin` (`name: image-classifier`, the default): the reference image classifier.

Its knobs (`BuiltinKnobs`) and inputs (`ImageInputs`) are checked when the file loads; its code
is the reference workload's files. The classifier itself is imported only when it is built.
What its knobs mean to `optlab diagnose` is here too, next to their model: the knob that
answers each finding (docs/diagnose.md "From a finding to the next step").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from optlab.config.knobs import BuiltinKnobs, ImageInputs
from optlab.config.models import ResolvedConfig, Target, Workload
from optlab.config.source import SourceFile
from optlab.config.validation import config_error
from optlab.targets.base import LoadedTarget, in_process_target
from optlab.targets.identity import reference_identity
from optlab.targets.kind import Remedy, TargetKind
from optlab.targets.templates import Secrets

__all__ = ["KIND", "Builtin", "classifier_engine_busy"]


class Builtin(TargetKind):
    name = "builtin"
    in_process = True
    # Its pipeline's stages are the default order (`TargetKind.stage_order`): the wait for an
    # engine instance or a batch (`queue`, the default batch wait stage too), then the work.

    def knob_model(self, target: Target, paths: Sequence[Path]) -> type[BaseModel] | None:
        return BuiltinKnobs

    def resolve_inputs(self, workload: Workload, source: SourceFile) -> Workload:
        # Checked here, at load, so a typo in the payload spec names its line before any run.
        try:
            inputs = ImageInputs.model_validate(workload.inputs).model_dump(mode="json")
        except ValidationError as exc:
            raise config_error(exc, ImageInputs, source, ("workload", "inputs")) from exc
        return workload.model_copy(update={"inputs": inputs})

    def identity(self, target: Mapping[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
        return reference_identity()

    def build(
        self, config: ResolvedConfig, paths: Sequence[Path], secrets: Secrets
    ) -> LoadedTarget:
        from optlab.reference import pipeline

        # build(knobs) and inputs(workload), like a python target's factory and inputs.
        built = pipeline.build(config.knobs)
        return in_process_target(
            built,
            lambda: pipeline.inputs(config.workload),
            "builtin image-classifier",
            "image-classifier",
        )

    def engine_busy(self, figures: Mapping[str, Any] | None) -> tuple[float, int] | None:
        return classifier_engine_busy(figures)

    def image_payloads(self, workload: Workload) -> list[bytes]:
        """The JPEGs an ImageInputs workload renders: an http or command target's `images`."""
        from optlab.reference import pipeline

        return [sample.jpeg for sample in pipeline.inputs(workload)]

    def remedy(
        self, rule: str, stage: str | None, config: ResolvedConfig, cores: int | None
    ) -> Remedy | None:
        """The one knob of the classifier that answers `rule` firing on `stage`; None where no
        knob does (the finding's advice says what to try)."""
        knobs = config.knobs
        device = knobs.get("device", "cpu")
        if rule in ("cpu-bound", "gil-bound", "gpu-starved") and stage == "preprocess":
            current = knobs.get("preprocess", "python")
            if current in ("python", "numpy"):
                return Remedy(
                    "preprocess",
                    "numpy-pooled",
                    f"preprocess ({current}) is the busiest stage: vectorised numpy into pooled "
                    "buffers does the same work in C and releases the GIL",
                )
            if device == "cuda" and current != "torch":
                return Remedy("preprocess", "torch", "run resize and normalise on the GPU")
            return None
        if rule == "gpu-compute-bound" or (rule == "cpu-bound" and stage == "infer"):
            return _faster_engine(config, knobs, device, cores)
        if rule in ("queueing", "serialised"):
            batching = knobs.get("batching") or {}
            if batching.get("mode", "off") == "off":
                return Remedy(
                    "batching",
                    {"mode": "dynamic", "max_batch_size": 8, "max_wait_ms": 2},
                    "requests queue for an engine that is busy all the time: one pass over a "
                    "batch costs far less than a pass per request",
                )
            instances = int(knobs.get("instances", 1))
            return Remedy(
                "instances",
                instances + 1,
                "the engine is batching already and still busy: another instance serves in "
                "parallel",
            )
        if rule == "under-batching":
            batching = dict(knobs.get("batching") or {})
            wait = float(batching.get("max_wait_ms", 10.0))
            shorter = max(0.5, round(wait / 4, 1))
            if shorter >= wait:
                return None
            return Remedy(
                "batching",
                {**batching, "max_wait_ms": shorter},
                f"batches close on the {wait:g} ms timeout mostly empty: a shorter wait gives "
                "back that latency at this load",
            )
        return None


def classifier_engine_busy(figures: Mapping[str, Any] | None) -> tuple[float, int] | None:
    """The classifier's engine busy time (ms, summed over its engine instances) and its
    instances, from the figures it reports (docs/run-json.md `target`: `infer.busy_ms`,
    `instances`; one instance where it says none), in process or served (`optlab serve`'s
    /metrics); None when they hold no busy time."""
    infer = figures.get("infer") if isinstance(figures, Mapping) else None
    busy = infer.get("busy_ms") if isinstance(infer, Mapping) else None
    if not isinstance(busy, int | float):
        return None
    assert figures is not None
    instances = figures.get("instances")
    return float(busy), instances if isinstance(instances, int) and instances > 0 else 1


def _faster_engine(
    config: ResolvedConfig, knobs: Mapping[str, Any], device: str, cores: int | None
) -> Remedy | None:
    cache = knobs.get("cache") or {}
    if config.workload.inputs.get("repeat_skew") and cache.get("mode", "off") == "off":
        return Remedy(
            "cache",
            {"mode": "lru", "max_entries": 1024},
            "the workload repeats payloads: a response cache skips the engine for them",
        )
    engine, precision = knobs.get("engine", "torch"), knobs.get("precision", "fp32")
    if device == "cuda":
        if precision == "fp32":
            return Remedy("precision", "fp16", "the GPU's fp16 units do the pass faster")
        if engine != "tensorrt":
            return Remedy("engine", "tensorrt", "TensorRT fuses and tunes the graph")
        return None
    if engine == "torch":
        return Remedy(
            "engine",
            "onnxruntime",
            "the engine's pass is the busiest stage: onnxruntime's fused CPU kernels run the "
            "same graph faster than torch eager",
        )
    if precision == "fp32":
        return Remedy("precision", "int8", "int8 kernels cut the CPU pass further")
    threads = int(knobs.get("threads", 1))
    if cores is not None and threads < cores:
        return Remedy(
            "threads",
            threads + 1,
            f"the engine's pass is the limit and it runs on {threads} of {cores} "
            "cores: one more intra-op thread shares the pass",
        )
    return None


KIND = Builtin()
