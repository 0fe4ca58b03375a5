"""The base of the store's typed documents (docs/run-json.md): immutable, and no field the
model does not name."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["Frozen"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
