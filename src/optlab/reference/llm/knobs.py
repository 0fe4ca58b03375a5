"""The reference LLM server's knobs (docs/reference-llm.md), each one variable of an experiment:
an experiment names this model as its target's `knobs_model`, and the server validates its
command line against it too.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["BatchingOff", "BatchingOn", "LlmKnobs"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchingOff(_Strict):
    """One sequence at a time: a request waits until the one before it has finished."""

    mode: Literal["off"]


class BatchingOn(_Strict):
    """`static`: up to `max_num_seqs` sequences admitted together, decoded together, and no
    newcomer until all of them have finished. `continuous`: a newcomer joins the running
    batch at the next step, while fewer than `max_num_seqs` run."""

    mode: Literal["static", "continuous"]
    max_num_seqs: int = Field(8, ge=1, le=256)


class LlmKnobs(_Strict):
    kv_cache: bool = Field(
        True, description="keep each sequence's keys and values; false: recompute every token"
    )
    batching: Annotated[BatchingOff | BatchingOn, Field(discriminator="mode")] = BatchingOff(
        mode="off"
    )
    prefix_cache: bool = Field(
        False, description="reuse the keys and values of prompt blocks (16 tokens) seen before"
    )
    chunked_prefill: int = Field(
        0,
        ge=0,
        le=4096,
        description="prompt tokens per engine step (running sequences decode between chunks); "
        "0: a whole prompt in one step",
    )
    precision: Literal["fp32", "bf16", "int8"] = Field(
        "fp32", description="int8: dynamic quantisation of the linear layers"
    )
    threads: int = Field(1, ge=1, le=256, description="torch's intra-op threads")

    @model_validator(mode="after")
    def _cache_needed(self) -> LlmKnobs:
        if not self.kv_cache:
            needs = [
                name
                for name, on in (
                    ("prefix_cache", self.prefix_cache),
                    ("chunked_prefill", self.chunked_prefill),
                )
                if on
            ]
            if needs:
                raise ValueError(
                    f"{' and '.join(needs)} need kv_cache: true (they keep or fill a KV cache)"
                )
        return self

    @property
    def slots(self) -> int:
        """Sequences that can run at once (each holds a KV-cache slot)."""
        return 1 if isinstance(self.batching, BatchingOff) else self.batching.max_num_seqs
