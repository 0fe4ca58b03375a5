"""The experiment file schema (DESIGN.md section 7) as frozen pydantic models."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from optlab.config.knobs import StrictModel

# module.path:attribute, as in entry points.
REFERENCE_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
BUILTIN_TARGETS = ("image-classifier", "synthetic")


class BuiltinTarget(StrictModel):
    """`image-classifier`: the reference pipeline. `synthetic`: a service with a configured
    service-time distribution, the ground truth the tests and benchmarks measure against."""

    kind: Literal["builtin"]
    name: Literal["image-classifier", "synthetic"] = "image-classifier"


class PythonTarget(StrictModel):
    """`factory(knobs)` returns a callable(request) -> response; `inputs(workload)` the requests."""

    kind: Literal["python"]
    factory: str = Field(pattern=REFERENCE_PATTERN)
    inputs: str | None = Field(None, pattern=REFERENCE_PATTERN)
    knobs_model: str | None = Field(
        None,
        pattern=REFERENCE_PATTERN,
        description="a pydantic model that validates the knobs; free-form knobs without it",
    )
    code_version: str | None = Field(
        None, description="declared code identity; replaces the hash of the module sources"
    )


class CommandTarget(StrictModel):
    """A service started by a command; knobs reach it as arguments or environment variables."""

    kind: Literal["command"]
    command: list[str] = Field(min_length=1)
    url: str = Field(pattern=r"^https?://")
    knobs_as: Literal["args", "env"] = "env"
    ready_timeout_s: float = Field(60.0, gt=0, le=3600)
    code_version: str | None = None


class HttpTarget(StrictModel):
    """A service already listening at `url`; optlab cannot see its code, so declare its version."""

    kind: Literal["http"]
    url: str = Field(pattern=r"^https?://")
    code_version: str | None = None


Target = Annotated[
    BuiltinTarget | PythonTarget | CommandTarget | HttpTarget, Field(discriminator="kind")
]


class ClosedLoad(StrictModel):
    """N clients, each sending its next request as soon as the last one returns."""

    mode: Literal["closed"]
    concurrency: int = Field(ge=1, le=4096)


class OpenLoad(StrictModel):
    """Requests at a fixed rate whatever the service does; latency from the intended send time."""

    mode: Literal["open"]
    rate: float = Field(gt=0, le=1_000_000, description="requests per second")
    arrival: Literal["constant", "poisson"] = "poisson"
    max_in_flight: int = Field(
        512,
        ge=1,
        le=100_000,
        description="threads available to the open loop; when all are busy, requests leave "
        "late and the generator reports that it fell behind",
    )


class ReplayLoad(StrictModel):
    mode: Literal["replay"]
    trace: str = Field(min_length=1, description="JSONL or CSV of send offsets and request ids")
    time_scale: float = Field(1.0, gt=0, le=1000)


Load = Annotated[ClosedLoad | OpenLoad | ReplayLoad, Field(discriminator="mode")]


class Workload(StrictModel):
    load: Load
    timeout_ms: float = Field(10_000.0, gt=0, le=600_000)
    seed: int = Field(0, ge=0)
    inputs: dict[str, Any] = Field(
        default_factory=dict, description="passed to the target's inputs(workload)"
    )


FULL_MIN_DURATION_S = 600.0
FULL_MAX_DURATION_S = 900.0


class Protocol(StrictModel):
    """`full`: warm up until stable, then 600-900 s. `quick`: seconds, always provisional."""

    name: Literal["full", "quick"] = "full"
    warmup_s: float | None = Field(None, ge=0, le=300)
    duration_s: float | None = Field(None, gt=0, le=FULL_MAX_DURATION_S)
    max_error_rate: float = Field(0.001, ge=0, le=1)

    @property
    def provisional(self) -> bool:
        """Quick runs, and full runs shortened under 600 s, are never stacked with full runs."""
        if self.name == "quick":
            return True
        return self.duration_s is not None and self.duration_s < FULL_MIN_DURATION_S


class Slo(StrictModel):
    p50_ms: float | None = Field(None, gt=0)
    p95_ms: float | None = Field(None, gt=0)
    p99_ms: float | None = Field(None, gt=0)
    p999_ms: float | None = Field(None, gt=0)
    min_qps: float | None = Field(None, gt=0)
    max_accuracy_drop_pts: float | None = Field(
        1.0,
        ge=0,
        le=100,
        description="held-out top-1 points a run may lose against the fp32 reference model "
        "before its verdict flags it (targets that report accuracy only)",
    )


class ResolvedConfig(StrictModel):
    """The full config a run measures: what is hashed, stored and diffed."""

    target: Target
    knobs: dict[str, Any]
    workload: Workload
    protocol: Protocol = Protocol()
    slo: Slo = Slo()


class _FileCommon(StrictModel):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    hypothesis: str | None = None


class BaselineFile(_FileCommon):
    target: Target
    knobs: dict[str, Any] = Field(default_factory=dict)
    workload: Workload
    protocol: Protocol = Protocol()
    slo: Slo = Slo()


class StepFile(_FileCommon):
    parent: str = Field(pattern=NAME_PATTERN)
    change: dict[str, Any] = Field(default_factory=dict)
    repeat: bool = Field(False, description="allow an empty change: measure the parent again")

    @model_validator(mode="after")
    def _not_own_parent(self) -> StepFile:
        if self.parent == self.name:
            raise ValueError(f"experiment {self.name!r} names itself as its parent")
        return self


# Keys a step's `change` may not touch: each defines a new baseline, not a step.
BASELINE_ONLY_KEYS = ("target", "workload", "protocol", "slo")
