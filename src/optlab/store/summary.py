"""The run summary: what one measured run came to, typed and versioned.

`RunSummary` is what `optlab run --json` prints (`to_json()`, docs/run-json.md), what a bundle
carries (`to_bundle()`, docs/bundles.md), and what every reader gets as `RunRecord.summary`.
Its spellings are written and parsed here and nowhere else:

- the JSON form (`to_json`, `to_bundle`, `from_json`): every field; `from_json` also reads the
  unversioned form optlab stored and bundled before `schema_version` existed (version 1).
- the stored form (`stored_form`, `from_stored`), kept in `runs.summary_json`: only what the
  database holds nowhere else. The run's id, experiment, status, validity, reasons, counts,
  QPS, protocol and phase lengths are `runs` columns; the latency of each series is its
  measure-phase `stage_stats` row (the stored form lists which rows, in which order, are
  `latency_ms` and which `harness_ms`); the errors by type are `run_errors` rows. Where those
  rows do not reproduce the summary's figures (a run stored before they were written in the
  same transaction), the figures stay in the stored form instead, so no number is lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import Field

# The run's evidence for diagnosis (threads, GC, memory, batching, network, profile,
# neighbours) lives in its own module; its models are part of this document too.
from optlab.store.evidence import (  # noqa: F401 (re-exported)
    BatchingEvidence,
    GcEvidence,
    MemoryTrend,
    Neighbour,
    NetworkEvidence,
    ProcessEvidence,
    ProfileEvidence,
    ProfileFrame,
    RunEvidence,
    ThreadCpu,
)
from optlab.store.frozen import Frozen as _Frozen

__all__ = [
    "SUMMARY_SCHEMA_VERSION",
    "LatencyStats",
    "MeanMax",
    "PairedTag",
    "BatchingEvidence",
    "GcEvidence",
    "GoodputSlo",
    "HostSummary",
    "LlmSummary",
    "MemoryTrend",
    "Neighbour",
    "NetworkEvidence",
    "ParentStep",
    "ProcessEvidence",
    "ProfileEvidence",
    "ProfileFrame",
    "ResourceSummary",
    "RunEvidence",
    "ThreadCpu",
    "RunSummary",
    "from_stored",
    "stored_form",
]

# 1: the unversioned dict (until migration 0006); 2: this model; 3: with `evidence` (what
# `optlab diagnose` reads). Versions 1 and 2 read as 3 without evidence.
SUMMARY_SCHEMA_VERSION: Final = 3

# Fields of the JSON form that `run --json` leaves out when they are None (they are absent
# from a run that has no such thing, not null).
_OPTIONAL = ("accuracy", "target", "service", "paired", "parent", "evidence", "llm", "hosts")
# Fields that only the stored form holds; the rest come from columns and measurement rows.
_STORED = ("notes", "load", "resources", "who", *_OPTIONAL)
# The stage_stats rows of a streaming run's token series (`optlab.metrics.llm` names them).
LLM_ROWS = "llm."
# Run columns, by summary field (`from_stored`'s `facts`).
FACTS = (
    "run_id",
    "experiment",
    "status",
    "valid",
    "provisional",
    "reasons",
    "protocol",
    "requests",
    "errors",
    "qps",
    "warmup_s",
    "duration_s",
)
Sampled = Literal[
    "cpu_process_pct",
    "cpu_system_pct",
    "iowait_pct",
    "rss_bytes",
    "mem_used_bytes",
    "gpu_util_pct",
    "gpu_mem_used_bytes",
    "service_cpu_pct",
    "service_rss_bytes",
]


class LatencyStats(_Frozen):
    """One series over the measured phase, in ms; None where nothing completed."""

    p50: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None
    max: float | None = None
    mean: float | None = None
    count: int = 0


class MeanMax(_Frozen):
    mean: float
    max: float


class ResourceSummary(_Frozen):
    """Resource samples of the measured phase; a metric not readable here is None, never 0.
    `service_*`: the process tree of a service optlab started (None otherwise)."""

    samples: int = 0
    cpu_process_pct: MeanMax | None = None
    cpu_system_pct: MeanMax | None = None
    iowait_pct: MeanMax | None = None
    rss_bytes: MeanMax | None = None
    rss_peak_bytes: int | None = None
    mem_used_bytes: MeanMax | None = None
    gpu_util_pct: MeanMax | None = None
    gpu_mem_used_bytes: MeanMax | None = None
    service_cpu_pct: MeanMax | None = None
    service_rss_bytes: MeanMax | None = None

    def mean_of(self, name: Sampled) -> float | None:
        stat: MeanMax | None = getattr(self, name)
        return None if stat is None else stat.mean

    def max_of(self, name: Sampled) -> float | None:
        stat: MeanMax | None = getattr(self, name)
        return None if stat is None else stat.max


class ParentStep(_Frozen):
    """The run against the parent run it was checked against, as judged when it was measured
    (changes in %). A record of that judgement: the parent's figures as they were then."""

    experiment: str
    run_id: int
    variable: str | None = None
    change: str | None = None
    qps: float | None = None
    qps_change_pct: float | None = None
    p50_ms: float | None = None
    p95_ms: float | None = None
    p99_ms: float | None = None
    p50_change_pct: float | None = None
    p95_change_pct: float | None = None
    p99_change_pct: float | None = None


class PairedTag(_Frozen):
    """`run --paired`: which session, which pair, and which side of it this run was."""

    session: str
    index: int
    role: Literal["parent", "step"]


class GoodputSlo(_Frozen):
    """The per-request bounds a streaming run's goodput is judged by (the config's slo)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None


class ServerMetrics(_Frozen):
    """The serving engine's own gauges and counters over the measured phase, from its
    Prometheus text sampled once a second (`target.prometheus_url`): each gauge's mean and
    maximum, each counter's increase; null where the engine does not export it."""

    samples: int
    running_mean: float | None = None
    running_max: float | None = None
    waiting_mean: float | None = None
    waiting_max: float | None = None
    kv_cache_usage_mean: float | None = None  # 0..1: the share of the KV cache held
    kv_cache_usage_max: float | None = None
    preemptions: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hit_rate: float | None = None


class LineFit(_Frozen):
    """A least-squares line y = intercept + slope × x over a run's requests (docs/run-json.md
    "llm"): `r2` is the share of y's variance it explains; x's range and mean, y's mean."""

    requests: int
    slope: float
    intercept: float
    r2: float
    x_min: float
    x_mean: float
    x_max: float
    y_mean: float

    @property
    def share_at_mean(self) -> float:
        """The line's part at the mean x, slope × x̄ / ȳ (0 where ȳ is not positive or the
        slope falls): how much of the mean y the x explains."""
        return max(0.0, self.slope * self.x_mean / self.y_mean) if self.y_mean > 0 else 0.0


class LlmSummary(_Frozen):
    """A streaming LLM target's figures over the measured phase (docs/run-json.md "llm"),
    each named by its definition: `itl_ms` is the per-event gap (vLLM's, SGLang's), beside
    the per-token split and the per-request mean; `tpot_ms` is (E2E − TTFT)/(tokens − 1) per
    request, beside its token-weighted form; TTFT from the intended send (open loop) with
    the send's own (`ttft_sent_ms`) and the client's wait between them."""

    ttft_ms: LatencyStats | None = None
    itl_ms: LatencyStats | None = None
    tpot_ms: LatencyStats | None = None
    e2e_ms: LatencyStats | None = None
    output_tokens: int = 0
    output_tokens_per_s: float | None = None
    tokens_per_event: float | None = None
    goodput: float | None = None  # share of requests within every bound of goodput_slo
    # its 99% interval: the wider of Wilson's and batch means over consecutive requests
    goodput_interval: tuple[float, float] | None = None
    goodput_slo: GoodputSlo | None = None
    ttft_sent_ms: LatencyStats | None = None
    client_wait_ms: LatencyStats | None = None
    itl_token_split_ms: LatencyStats | None = None
    itl_request_mean_ms: LatencyStats | None = None
    tpot_token_weighted_ms: LatencyStats | None = None
    requests: int = 0
    requests_per_s: float | None = None
    input_tokens: int = 0
    total_tokens_per_s: float | None = None
    token_counts: Literal["usage", "words", "events", "tokenizer"] | None = None
    totals_from_usage: int = 0  # requests whose length is the server's own usage count
    # Streams that ended whole after a finish_reason but without `[DONE]` (counted complete).
    streams_without_done: int = 0
    server: ServerMetrics | None = None  # the engine's own view (`target.prometheus_url`)
    # TTFT from the send (ms) against the prompt's tokens: prefill's cost per input token.
    ttft_by_input: LineFit | None = None
    # Each request's median per-token ITL (ms) against the mean number of sequences decoding
    # beside it (itself included): a decode step's cost per running sequence.
    itl_by_running: LineFit | None = None


class NodeNeighbour(_Frozen):
    """A process on a load node that used its CPU while the node sent."""

    pid: int
    name: str
    cpu_pct: float  # of one core, over the node's part of the run


class HostSummary(_Frozen):
    """One node of a load sent from several hosts (docs/run-json.md "hosts"): its clock
    against the coordinator's (offset within +-bound, from the exchange with the smallest
    round trip), its own figures over the measured phase, and its verdict."""

    node: str
    node_id: str  # Ray's (`ray status`, `ray list nodes`)
    host: str
    ip: str
    workers: int
    offset_ms: float
    offset_bound_ms: float
    round_trip_ms: float
    # The offset measured again once the load stopped, minus the first: how far the node's
    # clock drifted from the coordinator's over the run, within +-drift_bound_ms. None: not
    # measured (a lost node, or a run stored before it was).
    drift_ms: float | None = None
    drift_bound_ms: float | None = None
    requests: int
    errors: int
    qps: float | None
    p99_ms: float | None
    send_lag_p99_ms: float | None
    first_send_lag_ms: float | None  # actual - intended send of the node's first request
    client_cpu_us_per_request: float | None  # its workers' CPU over every request they sent
    worker_nice: int = 0  # the niceness its workers' sending processes ran at
    # The node's CPUs (all cores, 0..100) sampled ~2/s while it sent: mean, highest, stolen.
    node_cpu_pct: float | None = None
    node_cpu_max_pct: float | None = None
    steal_pct: float | None = None
    # Its busiest other processes while it sent: {"pid", "name", "cpu_pct" (of one core)}.
    neighbours: tuple[NodeNeighbour, ...] = ()
    # Its mean in flight against its rate x mean latency, relative (Little's law; about 0
    # when its requests were in flight from their intended send; negative: held back).
    littles_law_gap: float | None = None
    lost_at_s: float | None = None
    valid: bool
    reasons: tuple[str, ...] = ()


class RunSummary(_Frozen):
    """What one run came to. Field order is `run --json`'s key order."""

    schema_version: Literal[3] = SUMMARY_SCHEMA_VERSION
    run_id: int
    experiment: str
    status: str
    valid: bool | None
    provisional: bool
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    protocol: str
    load: str
    requests: int | None
    errors: int | None
    errors_by_type: dict[str, int] = Field(default_factory=dict)
    qps: float | None
    warmup_s: float | None
    duration_s: float | None
    # The target's series ("total" first, then its own stages), and the harness's own
    # lateness (send_lag, start_lag), which is never part of a latency.
    latency_ms: dict[str, LatencyStats] = Field(default_factory=dict)
    harness_ms: dict[str, LatencyStats] = Field(default_factory=dict)
    resources: ResourceSummary = Field(default_factory=ResourceSummary)
    who: str | None = None  # user@host; absent from runs measured before it was recorded
    # What the target reported about itself, as it reported it (JSON-safe).
    accuracy: dict[str, Any] | None = None
    target: Any = None
    service: Any = None
    paired: PairedTag | None = None
    parent: ParentStep | None = None
    evidence: RunEvidence | None = None  # absent from runs measured before it was recorded
    llm: LlmSummary | None = None  # a streaming LLM target's figures
    hosts: tuple[HostSummary, ...] | None = None  # load sent from several hosts, per node

    # -- what readers need, without digging ---------------------------------------------

    @property
    def total(self) -> LatencyStats:
        """End-to-end latency (empty when nothing completed)."""
        return self.latency_ms.get("total") or LatencyStats()

    @property
    def stages(self) -> dict[str, LatencyStats]:
        """The target's own stages: every latency series but the total."""
        return {name: stats for name, stats in self.latency_ms.items() if name != "total"}

    @property
    def accuracy_top1(self) -> Any:
        return self.accuracy.get("top1") if self.accuracy else None

    def target_figure(self, section: str, key: str) -> Any:
        """A figure the target reported, e.g. ("batching", "mean_batch_size"); None when it
        reported no such thing."""
        found = self.target.get(section) if isinstance(self.target, dict) else None
        return found.get(key) if isinstance(found, dict) else None

    # -- the JSON form ---------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """The summary as `optlab run --json` prints it (docs/run-json.md): no schema_version,
        and the optional sections only when the run has them."""
        value = self.model_dump(mode="json", exclude={"schema_version"})
        for key in _OPTIONAL:
            if value[key] is None:
                del value[key]
        return value

    def to_bundle(self) -> dict[str, Any]:
        """Every field, schema_version included: what a run bundle carries."""
        return self.model_dump(mode="json")

    @classmethod
    def from_json(cls, value: Any) -> RunSummary:
        """A summary from its JSON form, versioned or from before versions (version 1, the
        same fields). Raises ValueError for anything else."""
        if not isinstance(value, dict):
            raise ValueError(f"a run summary is a JSON object, not {type(value).__name__}")
        version = value.get("schema_version", 1)
        if version not in (1, 2, SUMMARY_SCHEMA_VERSION):
            raise ValueError(
                f"run summary schema_version {version!r}: this optlab reads versions 1 to "
                f"{SUMMARY_SCHEMA_VERSION}"
            )
        return cls.model_validate({**value, "schema_version": SUMMARY_SCHEMA_VERSION})


# -- the stored form ------------------------------------------------------------------------


def stored_form(
    summary: RunSummary,
    latency: Mapping[str, LatencyStats],
    errors_by_type: Mapping[str, int],
) -> dict[str, Any]:
    """What `runs.summary_json` holds for `summary`, given the run's measure-phase series
    (`latency`, by name, from its stage_stats rows) and its error counts by type (its
    run_errors rows), both as they are stored with it."""
    value = summary.model_dump(mode="json", include=set(_STORED))
    for key in _OPTIONAL:
        if value[key] is None:
            del value[key]
    value["schema_version"] = SUMMARY_SCHEMA_VERSION
    series = {**summary.latency_ms, **summary.harness_ms}
    overlap = summary.latency_ms.keys() & summary.harness_ms.keys()
    # A streaming run's token series are rows too (their histograms); its `llm` section,
    # stored whole, holds their figures.
    rows = {name: stats for name, stats in latency.items() if not name.startswith(LLM_ROWS)}
    if series == rows and not overlap:
        value["latency_stages"] = list(summary.latency_ms)
        value["harness_stages"] = list(summary.harness_ms)
    else:
        dumped = summary.model_dump(mode="json", include={"latency_ms", "harness_ms"})
        value |= dumped
    if summary.errors_by_type != dict(errors_by_type):
        value["errors_by_type"] = dict(summary.errors_by_type)
    return value


def from_stored(
    stored: Mapping[str, Any],
    facts: Mapping[str, Any],
    latency: Mapping[str, LatencyStats],
    errors_by_type: Mapping[str, int],
) -> RunSummary:
    """The summary of a stored run: `stored` (its `summary_json`), `facts` (its columns, by
    the summary field names in FACTS), and its measure-phase `latency` and `errors_by_type`
    (as for `stored_form`)."""
    if "schema_version" not in stored:  # the unversioned form, complete in itself
        return RunSummary.from_json(dict(stored))
    body = {
        key: value
        for key, value in stored.items()
        if key not in ("schema_version", "latency_stages", "harness_stages")
    }
    for field, names in (("latency_ms", "latency_stages"), ("harness_ms", "harness_stages")):
        if field not in body:
            body[field] = {name: latency[name] for name in stored.get(names, ()) if name in latency}
    body.setdefault("errors_by_type", dict(errors_by_type))
    columns = {key: facts[key] for key in FACTS}  # KeyError: a caller left a column out
    return RunSummary.from_json({**body, **columns, "schema_version": stored["schema_version"]})
