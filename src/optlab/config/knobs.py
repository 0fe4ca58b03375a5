"""Knob schemas. Each top-level knob is ONE variable; a group knob's fields change together.

The built-in reference target's knobs live here so that every experiment file
is checked against them at load time, long before anything is measured.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class StrictModel(BaseModel):
    """Typos are errors, never silent no-ops; loaded configs are immutable; NaN and infinity
    are never settings (NaN passes every bound check, and stored JSON cannot hold either)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class BatchingOff(StrictModel):
    mode: Literal["off"] = "off"


class BatchingDynamic(StrictModel):
    """Collect requests until the batch is full or the oldest has waited `max_wait_ms`."""

    mode: Literal["dynamic"]
    max_batch_size: int = Field(
        8,
        ge=1,
        le=1024,
        description="1: each request is a batch of its own, through the batcher (its cost "
        "without batching's gain; a sweep's baseline)",
    )
    max_wait_ms: float = Field(10.0, ge=0, le=10_000)
    max_queue: int = Field(
        1024,
        ge=1,
        le=1_000_000,
        description="requests waiting for a batch; more are rejected at once (Overloaded)",
    )


Batching = Annotated[BatchingOff | BatchingDynamic, Field(discriminator="mode")]


class CacheOff(StrictModel):
    mode: Literal["off"] = "off"


class CacheLRU(StrictModel):
    """Memoise responses for repeated inputs (keyed by a hash of the request content)."""

    mode: Literal["lru"]
    max_entries: int = Field(1024, ge=1, le=10_000_000)
    ttl_s: float | None = Field(None, gt=0, description="entries expire this long after stored")


Cache = Annotated[CacheOff | CacheLRU, Field(discriminator="mode")]


class BuiltinKnobs(StrictModel):
    """Knobs of the built-in reference image classifier."""

    engine: Literal["torch", "onnxruntime", "tensorrt"] = "torch"
    precision: Literal["fp32", "fp16", "bf16", "int8"] = "fp32"
    batching: Batching = BatchingOff()
    # `torch` runs resize and normalise on the configured device (the cuda variant).
    preprocess: Literal["python", "numpy", "numpy-pooled", "torch"] = "python"
    cache: Cache = CacheOff()
    threads: int = Field(1, ge=1, le=256, description="intra-op threads of the engine")
    instances: int = Field(1, ge=1, le=64, description="model instances serving in parallel")
    device: Literal["cpu", "cuda"] = "cpu"


# Keys whose value selects a variant: when a change gives a new value, the group
# is replaced rather than merged, so fields of the old variant do not leak into it.
DISCRIMINATOR_KEYS = ("mode", "kind")


class ImageInputs(StrictModel):
    """`workload.inputs` of the reference image classifier: which payloads the clients send.

    The load generator cycles through the `count` payloads in order, so a payload recurs every
    `count` requests: a response cache holding fewer entries than that never hits on a plain
    cycle (LRU on a cyclic pattern), one holding more hits every payload after the first pass.
    `repeat_skew` models real repetition instead: payload popularity follows a Zipf law.
    Renders and order follow `workload.seed`: equal seeds give byte-identical payloads.
    """

    split: Literal["holdout", "train"] = Field(
        "holdout", description="digits the payloads show; the model never trained on holdout"
    )
    count: int = Field(359, ge=1, le=100_000, description="distinct payloads in the request pool")
    size: int | tuple[int, int] = Field(
        256, description="image side in pixels, or [low, high] for a spread of sizes"
    )
    repeat_skew: float | None = Field(
        None, gt=0, le=10, description="Zipf exponent of request popularity (1.1 is typical)"
    )

    @field_validator("size")
    @classmethod
    def _sides_in_range(cls, value: int | tuple[int, int]) -> int | tuple[int, int]:
        sides = (value,) if isinstance(value, int) else value
        for side in sides:
            if not 32 <= side <= 2048:
                raise ValueError(f"image side {side} is outside 32..2048 pixels")
        if not isinstance(value, int) and value[0] > value[1]:
            raise ValueError(f"size range {list(value)} is empty: give [low, high], low <= high")
        return value
