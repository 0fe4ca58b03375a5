"""Knob schemas. Each top-level knob is ONE variable; a group knob's fields change together.

The built-in reference target's knobs live here so that every experiment file
is checked against them at load time, long before anything is measured.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class StrictModel(BaseModel):
    """Typos are errors, never silent no-ops; loaded configs are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchingOff(StrictModel):
    mode: Literal["off"] = "off"


class BatchingDynamic(StrictModel):
    """Collect requests until the batch is full or the oldest has waited `max_wait_ms`."""

    mode: Literal["dynamic"]
    max_batch_size: int = Field(8, ge=2, le=1024)
    max_wait_ms: float = Field(10.0, ge=0, le=10_000)


Batching = Annotated[BatchingOff | BatchingDynamic, Field(discriminator="mode")]


class CacheOff(StrictModel):
    mode: Literal["off"] = "off"


class CacheLRU(StrictModel):
    """Memoise responses for repeated inputs (keyed by a hash of the request)."""

    mode: Literal["lru"]
    max_entries: int = Field(1024, ge=1, le=10_000_000)


Cache = Annotated[CacheOff | CacheLRU, Field(discriminator="mode")]


class BuiltinKnobs(StrictModel):
    """Knobs of the built-in reference image classifier."""

    engine: Literal["torch", "onnxruntime", "tensorrt"] = "torch"
    precision: Literal["fp32", "fp16", "bf16", "int8"] = "fp32"
    batching: Batching = BatchingOff()
    preprocess: Literal["python", "numpy", "numpy-pooled"] = "python"
    cache: Cache = CacheOff()
    threads: int = Field(1, ge=1, le=256, description="intra-op threads of the engine")
    device: Literal["cpu", "cuda"] = "cpu"


# Keys whose value selects a variant: when a change gives a new value, the group
# is replaced rather than merged, so fields of the old variant do not leak into it.
DISCRIMINATOR_KEYS = ("mode", "kind")
