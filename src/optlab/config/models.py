"""The experiment file schema (docs/experiment-files.md) as frozen pydantic models."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from optlab.config.knobs import StrictModel
from optlab.config.llm import Prompts, TokenizerFile

# The load modes' models live with their modes (config/modes/); these names stay importable
# from here, where the rest of the file's schema is.
from optlab.config.modes import MAX_CONCURRENCY as MAX_CONCURRENCY
from optlab.config.modes import MAX_RATE as MAX_RATE
from optlab.config.modes import ClosedLoad as ClosedLoad
from optlab.config.modes import Load as Load
from optlab.config.modes import OpenLoad as OpenLoad
from optlab.config.modes import ReplayLoad as ReplayLoad
from optlab.config.remedies import DeclaredRemedy

# module.path:attribute, as in entry points.
REFERENCE_PATTERN = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"


def remedies_field() -> Any:
    return Field(
        default_factory=list,
        description="what `optlab diagnose` changes when a rule fires (docs/experiment-files.md "
        "Remedies)",
    )


class _LeavesOutUnset(StrictModel):
    """A section whose fields added after configs were first stored (`ADDED`) are left out of
    the dump while unset (None, or an empty list), so the stored configs (and hashes) of every
    experiment written before they existed stay what they were."""

    ADDED: ClassVar[tuple[str, ...]] = ()

    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        data: dict[str, Any] = handler(self)
        for key in self.ADDED:
            if data.get(key) in (None, []):
                data.pop(key, None)
        return data


class _DeclaresRemedies(_LeavesOutUnset):
    """A target whose experiment may declare `remedies` (left out while empty). Each subclass
    declares the field (`remedies_field()`) where its documented field order puts it."""

    ADDED = ("remedies",)


class BuiltinTarget(StrictModel):
    """`image-classifier`: the reference pipeline. `synthetic`: a service with a configured
    service-time distribution, the ground truth the tests and benchmarks measure against."""

    kind: Literal["builtin"]
    name: Literal["image-classifier", "synthetic"] = "image-classifier"


class PythonTarget(_DeclaresRemedies):
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
    remedies: list[DeclaredRemedy] = remedies_field()


# An http(s) URL, or one that starts with a `${ENV_VAR}` resolved at run time.
ServiceUrl = Annotated[str, Field(pattern=r"^(https?://|\$\{)")]
# A header name as RFC 9110 allows it (a token); values are free text but never hold a newline.
HEADER_NAME_PATTERN = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"


class _HttpRequest(_DeclaresRemedies):
    """How each request is sent. `url` and header values may hold `${ENV_VAR}` references:
    resolved when the run starts, never stored (the stored config keeps the reference)."""

    url: ServiceUrl = Field(description="where every request is sent")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"] = "POST"
    headers: dict[Annotated[str, Field(pattern=HEADER_NAME_PATTERN)], str] = Field(
        default_factory=dict
    )
    ok_status: list[Annotated[int, Field(ge=100, le=599)]] | None = Field(
        None, description="status codes that count as success; default any 2xx"
    )
    connect_timeout_ms: float = Field(2_000.0, gt=0, le=600_000)
    metrics_url: ServiceUrl | None = Field(
        None,
        description="GET after the measured phase: a JSON object of the service's own "
        "counters (batch sizes, cache hits), stored with the run like a python target's metrics()",
    )
    metrics_reset_url: ServiceUrl | None = Field(
        None,
        description="POST when the measured phase starts, so those counters cover it alone",
    )
    accuracy_url: ServiceUrl | None = Field(
        None,
        description="GET before the load: a JSON object with `top1` and optionally `drop_pts`, "
        "judged against slo.max_accuracy_drop_pts",
    )
    knobs_model: str | None = Field(
        None,
        pattern=REFERENCE_PATTERN,
        description="a pydantic model that validates the knobs; free-form knobs without it",
    )
    code_version: str | None = Field(
        None, description="declared code identity of the service (a version, a commit)"
    )

    remedies: list[DeclaredRemedy] = remedies_field()

    @field_validator("headers")
    @classmethod
    def _single_line_values(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if "\n" in value or "\r" in value:
                raise ValueError(f"header {name!r} holds a line break")
        return headers


class CommandTarget(_HttpRequest):
    """A service optlab starts, measures over HTTP at `url`, and stops.

    `command` and `env` values are templates: `{knobs.batching.max_batch_size}` is replaced by
    that knob's value (a group knob by its compact JSON), `{python}` by the running Python
    interpreter and `${ENV_VAR}` by the environment variable, resolved at run time and never
    stored. `health_url` (default: the service accepts TCP connections on `url`'s port) must
    answer 2xx within `ready_timeout_s`. Stopping sends SIGTERM to the service's process group,
    then SIGKILL after `stop_grace_s`.
    """

    kind: Literal["command"]
    command: list[str] = Field(min_length=1)
    env: dict[Annotated[str, Field(pattern=ENV_NAME_PATTERN)], str] = Field(default_factory=dict)
    cwd: str | None = Field(None, description="working directory; default the experiment's")
    health_url: ServiceUrl | None = None
    ready_timeout_s: float = Field(60.0, gt=0, le=3600)
    stop_grace_s: float = Field(10.0, ge=0, le=600)
    log_tail_lines: int = Field(40, ge=0, le=10_000)


class HttpTarget(_HttpRequest):
    """A service already listening at `url`; optlab cannot see its code, so declare its version."""

    kind: Literal["http"]


class OpenAITarget(_HttpRequest):
    """An OpenAI-compatible endpoint streaming Server-Sent Events (docs/experiment-files.md
    "Streaming LLM targets"): `url` is the API's base (`http://HOST:PORT/v1`), `api` picks
    `/completions` or `/chat/completions`. With `command`, optlab starts the server as it starts
    a command target's (the same fields) and records its environment.

    Every request body is built from the workload's `prompts` and these fields: `model`,
    `max_tokens` (the prompt's output length), `temperature`, `seed`, `ignore_eos` and
    `min_tokens` (servers that honour them keep every answer at its asked length),
    `include_usage` (`stream_options.include_usage`) and `extra_body` (merged last). Tokens are
    counted per event from streamed `usage` where the server streams it per chunk, else by
    `tokenizer` (`words`: whitespace-separated words; `events`: one per event), and each
    request's total is its final `usage` where there is one (the run says which it used).
    """

    kind: Literal["openai"]
    method: Literal["POST"] = "POST"
    api: Literal["completions", "chat"] = "completions"
    model: str = Field(min_length=1, max_length=500)
    temperature: float | None = Field(0.0, ge=0, le=100)
    seed: int | None = Field(None, ge=0)
    ignore_eos: bool = False
    min_tokens: bool = Field(
        False, description="send min_tokens = max_tokens (vLLM, SGLang honour it)"
    )
    include_usage: bool = True
    extra_body: dict[str, Any] = Field(default_factory=dict)
    tokenizer: Literal["words", "events"] | TokenizerFile = Field(
        "words",
        description="how an event's tokens are counted where usage is not streamed per chunk: "
        "words, events, or {file: tokenizer.json} (a Hugging Face fast tokenizer)",
    )
    prometheus_url: ServiceUrl | None = Field(
        None,
        description="the engine's Prometheus metrics (vLLM's, SGLang's /metrics): requests "
        "running and waiting, KV-cache usage, preemptions, prefix-cache hits, read once a "
        "second over the measured phase into the run's llm.server",
    )
    # A server optlab starts (as `kind: command`); none: one already listening at `url`.
    command: list[str] | None = Field(None, min_length=1)
    env: dict[Annotated[str, Field(pattern=ENV_NAME_PATTERN)], str] = Field(default_factory=dict)
    cwd: str | None = Field(None, description="working directory; default the experiment's")
    health_url: ServiceUrl | None = None
    ready_timeout_s: float = Field(60.0, gt=0, le=3600)
    stop_grace_s: float = Field(10.0, ge=0, le=600)
    log_tail_lines: int = Field(40, ge=0, le=10_000)

    @field_validator("extra_body")
    @classmethod
    def _not_the_stream_fields(cls, body: dict[str, Any]) -> dict[str, Any]:
        owned = sorted(body.keys() & {"stream", "prompt", "messages", "max_tokens", "model"})
        if owned:
            raise ValueError(
                f"extra_body sets {', '.join(owned)}, which optlab sets from the target and "
                "the workload's prompts"
            )
        return body


Target = Annotated[
    BuiltinTarget | PythonTarget | CommandTarget | HttpTarget | OpenAITarget,
    Field(discriminator="kind"),
]


class Workload(_LeavesOutUnset):
    ADDED = ("prompts",)

    load: Load
    timeout_ms: float = Field(10_000.0, gt=0, le=600_000)
    seed: int = Field(0, ge=0)
    inputs: dict[str, Any] = Field(
        default_factory=dict, description="passed to the target's inputs(workload)"
    )
    prompts: Prompts | None = Field(None, description="a streaming LLM target's requests")


class HttpInputs(StrictModel):
    """`workload.inputs` of an http or command target: the request bodies, sent round robin.

    At most one source: `files` (a glob under the experiment's folder, each file one body),
    `jsonl` (a file, each non-empty line one JSON body), `template` (one JSON body; `count`
    copies, where a string "{i}" becomes the copy's index, and "{i}" inside a longer string is
    replaced by it), `text` (one body) or `images` (the reference classifier's rendered JPEGs,
    as for the built-in target). None of them: requests without a body (GET).
    """

    files: str | None = Field(None, min_length=1)
    jsonl: str | None = Field(None, min_length=1)
    template: Any = None
    text: str | None = None
    images: dict[str, Any] | None = None
    count: int = Field(1, ge=1, le=1_000_000, description="copies of `template`")
    content_type: str | None = Field(
        None, description="default: from the source (application/json, image/jpeg, ...)"
    )

    @model_validator(mode="after")
    def _one_source(self) -> HttpInputs:
        given = [k for k in ("files", "jsonl", "template", "text", "images") if getattr(self, k)]
        if len(given) > 1:
            raise ValueError(f"give one body source, not {' and '.join(given)}")
        return self


FULL_MIN_DURATION_S = 600.0
FULL_MAX_DURATION_S = 900.0


class Protocol(_LeavesOutUnset):
    """`full`: warm up until stable, then 600-900 s. `quick`: seconds, always provisional."""

    ADDED = ("stability_pct",)

    name: Literal["full", "quick"] = "full"
    warmup_s: float | None = Field(None, ge=0, le=300)
    duration_s: float | None = Field(None, gt=0, le=FULL_MAX_DURATION_S)
    max_error_rate: float = Field(0.001, ge=0, le=1)
    # How far apart the two halves' QPS may be (and the warmup windows) for a stable run;
    # None: the protocol's 10%. A noisy shared machine may need more, a quiet one less.
    stability_pct: float | None = Field(None, gt=0, le=100)


# The file's `slo:` section: the limits a run's verdict and the table judge it against (the
# sweep's single percentile bound is `optlab.config.slo.Slo`).
class SloLimits(_LeavesOutUnset):
    ADDED = ("ttft_ms", "tpot_ms")

    p50_ms: float | None = Field(None, gt=0)
    p95_ms: float | None = Field(None, gt=0)
    p99_ms: float | None = Field(None, gt=0)
    p999_ms: float | None = Field(None, gt=0)
    min_qps: float | None = Field(None, gt=0)
    # A streaming LLM target's request is good when its TTFT and its TPOT are within these
    # (both where both are set): goodput is the share of requests that are.
    ttft_ms: float | None = Field(None, gt=0, description="per request: TTFT at most this")
    tpot_ms: float | None = Field(None, gt=0, description="per request: TPOT at most this")
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
    slo: SloLimits = SloLimits()


class _FileCommon(StrictModel):
    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    hypothesis: str | None = None


class BaselineFile(_FileCommon):
    target: Target
    knobs: dict[str, Any] = Field(default_factory=dict)
    workload: Workload
    protocol: Protocol = Protocol()
    slo: SloLimits = SloLimits()


class StepFile(_FileCommon):
    parent: str = Field(pattern=NAME_PATTERN)
    change: dict[str, Any] = Field(default_factory=dict)
    repeat: bool = Field(False, description="allow an empty change: measure the parent again")
    new_knob: bool = Field(
        False,
        description="the change adds a knob the parent does not have (without it, such a key "
        "is refused as a likely misspelling)",
    )

    @model_validator(mode="after")
    def _not_own_parent(self) -> StepFile:
        if self.parent == self.name:
            raise ValueError(f"experiment {self.name!r} names itself as its parent")
        return self


# Keys a step's `change` may not touch: each defines a new baseline, not a step.
BASELINE_ONLY_KEYS = ("target", "workload", "protocol", "slo")
