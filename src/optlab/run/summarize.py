"""What one run measured, judged: the verdict and the `run --json` summary, from what the run
collected (docs/run-json.md).

Pure: `summarize()` reads only its `Collected` input (histograms, windows, resource readings,
errors, what else used the machine, the protocol, what it observed for the evidence section)
and touches no clock, store or thread, so tests call it directly on hand-built inputs.
"""

from __future__ import annotations

import getpass
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optlab.chain.plan import Plan
from optlab.config.modes import Load, mode_of
from optlab.config.protocol import EffectiveProtocol
from optlab.load.hosts import HostReport
from optlab.metrics.change import percent_change
from optlab.metrics.histogram import LatencyHistogram
from optlab.metrics.llm import LlmTally, is_llm_series
from optlab.metrics.resources import ResourceReading
from optlab.metrics.stages import LAG_SERIES, SEND_LAG, START_LAG, TOTAL
from optlab.metrics.windows import SourceTally
from optlab.run.evidence import Observed, run_evidence
from optlab.run.facts import HostFacts
from optlab.run.pace import held_back, host_reasons, littles_law, send_lag_quantile
from optlab.run.summary import (
    MAX_JSON_DEPTH,
    json_safe,
    latency_summary,
    llm_summary,
    resource_summary,
)
from optlab.run.validity import LoadFacts, RunFacts, Verdict, halves, verdict
from optlab.store import LatencyStats, RunFinal, RunRecord, RunSummary
from optlab.targets.templates import Secrets

__all__ = ["Collected", "Summarized", "step_against", "summarize", "who"]


@dataclass(frozen=True)
class Collected:
    """What one run collected, and what it is judged against: the input of `summarize`."""

    run_id: int
    experiment: str
    status: str  # FINISHED, KILLED or FAILED
    protocol: EffectiveProtocol
    load: Load
    # The measured phase's latency histograms by series: "total", the target's stages, and
    # the harness's own send and start lags.
    histograms: Mapping[str, LatencyHistogram]
    completed: int  # successful requests in the measured phase
    failed: int
    measured_s: float
    warmup_s: float = 0.0
    window_qps: Sequence[float] = ()  # the measured phase, window by window
    errors: Mapping[str, tuple[int, str | None]] = field(
        default_factory=dict
    )  # kind: count, example
    error: str | None = None  # why the run failed or stopped
    interrupted: bool = False
    stopped_early: str | None = None  # why the measured phase ended before its time
    stabilised: bool | None = None  # a "stable" warmup: whether it stabilised
    abandoned: int = 0  # requests still in flight after the drain
    readings: Sequence[ResourceReading] = ()
    peak_rss_bytes: int | None = None
    throttled: bool = False
    machine: LoadFacts = field(default_factory=LoadFacts)  # what else used the machine
    in_flight: tuple[int | None, ...] = (None, None, None)  # measured phase: start, end, most
    in_process: bool = True  # the target ran inside optlab's process
    accuracy: Mapping[str, Any] | None = None
    max_accuracy_drop_pts: float | None = None
    target_metrics: Any = None  # what the target's metrics() returned, JSON-safe
    service: Any = None  # what a started service's info returned, JSON-safe
    hook_notes: Sequence[str] = ()
    paired: Mapping[str, Any] | None = None
    parent: RunRecord | None = None  # the parent run this step is checked against
    plan: Plan | None = None
    who: str = "unknown"
    secrets: Secrets = field(default_factory=Secrets)  # every text stored is redacted
    observed: Observed = field(default_factory=Observed)  # for the summary's evidence
    # The latency bound the run is judged against (the config's SLO, or a sweep's), and the
    # request timeout: what the load generator's lag and its clients' pace are weighed by.
    slo_ms: float | None = None
    timeout_ms: float | None = None
    # A streaming target's counts over the measured phase, and the per-request bounds its
    # goodput is judged by (slo.ttft_ms, slo.tpot_ms).
    llm: LlmTally | None = None
    server: dict[str, Any] | None = None  # the engine's metrics (`metrics.server_metrics`)
    goodput_ms: tuple[float | None, float | None] = (None, None)
    # Load sent from several hosts: what each node's generator reported, and each node's own
    # tally of the measured phase (keyed by node name).
    hosts: Sequence[HostReport] = ()
    host_tallies: Mapping[str, SourceTally] = field(default_factory=dict)
    measure_start_ns: int | None = None  # the measured phase's start, perf_counter_ns


@dataclass(frozen=True)
class Summarized:
    verdict: Verdict  # the validity rules on what was measured
    valid: bool  # False also for a run that did not finish
    reasons: list[str]
    summary: RunSummary  # `run --json`'s object (`to_json()`), as stored
    final: RunFinal  # what the final write stores
    errors: dict[str, tuple[int, str | None]]  # by kind, redacted, as stored


def summarize(c: Collected) -> Summarized:
    """The verdict on a run and its summary."""
    redact = c.secrets.redact
    error = redact(c.error) if c.error is not None else None
    errors = {
        redact(kind): (count, None if example is None else redact(example))
        for kind, (count, example) in c.errors.items()
    }
    facts = run_facts(c)
    judged = verdict(facts)
    littles = {host.node: _node_little(c, host) for host in c.hosts}
    notes = [redact(note) for note in [*judged.notes, *c.hook_notes, *_host_notes(c, littles)]]
    if c.stabilised is False:
        # The longest warm-up: the protocol's, or the load's own least when that is longer.
        longest = max(c.protocol.warmup_max_s, mode_of(c.load).min_warmup_s(c.load))
        notes.append(f"warmup did not stabilise within {longest:g} s; measured anyway")
    if c.abandoned:
        notes.append(f"{c.abandoned} requests were still in flight after the drain")
    if c.llm is not None and c.llm.without_done:
        notes.append(
            f"{c.llm.without_done} of {c.llm.requests} streams ended without [DONE] (whole, "
            "after a finish_reason): each ends at its last bytes"
        )
    valid = judged.valid if c.status == "FINISHED" else False
    reasons = list(judged.reasons)
    codes = list(judged.codes)
    if c.status == "FAILED":
        reasons.insert(0, "the run failed: " + (error or "").splitlines()[0])
        codes.insert(0, "failed")
    qps = c.completed / max(c.measured_s, 1e-9) if c.measured_s > 0 else None
    summary = _summary(c, valid, reasons, notes, errors, qps, facts, littles)
    final = RunFinal(
        status=c.status,
        valid=valid,
        reasons=tuple(reasons),
        reason_codes=tuple(codes),
        requests=c.completed,
        errors=c.failed,
        qps=qps,
        warmup_s=c.warmup_s,
        duration_s=c.measured_s,
        summary=summary,
        error_message=error,
    )
    return Summarized(judged, valid, reasons, summary, final, errors)


def run_facts(c: Collected) -> RunFacts:
    """What the validity rules judge, from what the run collected."""
    stages, harness = _split(c.histograms)
    total = stages.get(TOTAL)
    total_s = total.summary_ms() if total is not None else {}
    lag, start = harness.get(SEND_LAG), harness.get(START_LAG)
    lag_s = lag.summary_ms() if lag is not None and lag.count else {}
    lag_low = None
    if lag is not None and lag.count:
        low_ns = lag.value_at_percentile_ns(send_lag_quantile(lag.count))
        lag_low = None if low_ns is None else low_ns / 1e6
    start_s = start.summary_ms() if start is not None and start.count else {}
    first, second = halves(c.window_qps)
    load, p = c.load, c.protocol
    mode = mode_of(load)
    open_loop = mode.open_loop
    measured = max(c.measured_s, 1e-9)
    answered = c.completed + c.failed
    return RunFacts(
        requested_s=p.duration_s,
        measured_s=c.measured_s,
        completed=c.completed,
        errors=c.failed,
        max_error_rate=p.max_error_rate,
        send_lag_p99_ms=_num(lag_s.get("p99")) if open_loop else None,
        send_lag_p99_low_ms=lag_low if open_loop else None,
        max_send_lag_p99_ms=p.max_send_lag_p99_ms,
        total_p99_ms=_num(total_s.get("p99")),
        total_mean_ms=_num(total_s.get("mean")),
        total_max_ms=_num(total_s.get("max")),
        slo_ms=c.slo_ms,
        timeout_ms=c.timeout_ms,
        start_lag_p99_ms=_num(start_s.get("p99")),
        total_p50_ms=_num(total_s.get("p50")),
        first_half_qps=first,
        second_half_qps=second,
        stability_tolerance=p.stability_tolerance,
        stability_fixed=p.stability_fixed,
        window_qps=tuple(c.window_qps),
        throttled=c.throttled,
        interrupted=c.interrupted,
        stopped_early=c.stopped_early,
        open_loop=open_loop,
        accuracy_drop_pts=_num((c.accuracy or {}).get("drop_pts")),
        max_accuracy_drop_pts=c.max_accuracy_drop_pts,
        stuck_clients=0 if open_loop else c.abandoned,
        clients=mode.clients(load),
        # Who set the pace and what else used the machine.
        intended_qps=mode.offered_qps(load),
        completed_qps=answered / measured if measured > 0 else None,
        in_flight_start=c.in_flight[0],
        in_flight_end=c.in_flight[1],
        in_flight_max=c.in_flight[2],
        in_flight_limit=mode.in_flight_limit(load) * load.generators,
        in_process=c.in_process,
        load=c.machine,
        hosts=tuple(_host_facts(c, h) for h in c.hosts),
    )


def _p99_ms(histogram: LatencyHistogram) -> float | None:
    value = histogram.value_at_percentile_ns(99.0) if histogram.count else None
    return None if value is None else value / 1e6


def _host_facts(c: Collected, host: HostReport) -> HostFacts:
    tally = c.host_tallies.get(host.node) or SourceTally()
    workers = max(1, c.load.generators)
    low = None
    if tally.send_lag.count:
        low_ns = tally.send_lag.value_at_percentile_ns(send_lag_quantile(tally.send_lag.count))
        low = None if low_ns is None else low_ns / 1e6
    return HostFacts(
        node=host.node,
        host=host.host,
        share=host.workers / workers,
        completed=tally.ok,
        errors=tally.errors,
        send_lag_p99_ms=_p99_ms(tally.send_lag),
        send_lag_p99_low_ms=low,
        lost=host.lost,
        lost_at_s=host.lost_at_s,
        node_cpu_pct=host.node_cpu_pct,
        steal_pct=host.steal_pct,
        neighbours=host.neighbours,
    )


def _node_little(c: Collected, host: HostReport) -> tuple[float, float, float] | None:
    """Little's law over the node's measured seconds: its last in-flight count each second
    against its own rate x mean latency (`optlab.run.pace.littles_law`)."""
    tally = c.host_tallies.get(host.node)
    if tally is None or c.measure_start_ns is None or c.measured_s <= 0:
        return None
    samples = host.timeline.in_flight_every(c.measure_start_ns, 1_000_000_000)
    mean_ns = tally.total.mean_ns()
    return littles_law(
        samples[: int(c.measured_s)],
        tally.ok / c.measured_s,
        None if mean_ns is None else mean_ns / 1e6,
    )


Little = tuple[float, float, float] | None  # `optlab.run.pace.littles_law`'s answer


def _host_notes(c: Collected, littles: Mapping[str, Little]) -> list[str]:
    """What to know of the nodes without invalidating the run."""
    notes = []
    for host in c.hosts:
        gap = littles[host.node]
        if held_back(gap):
            assert gap is not None
            notes.append(
                f"{host.node} ({host.host}): Little's law is off by {gap[0]:+.0%} (its mean in "
                "flight against its rate x mean latency): its workers held requests back "
                "between their intended and actual sends"
            )
        if host.worker_nice > 0:
            notes.append(
                f"{host.node} ({host.host}): its workers sent at nice {host.worker_nice} "
                "(Ray's default for workers; optlab may not lower it there): on a busy node "
                "they come after every other process. Start its `ray start` with "
                "RAY_worker_niceness=0 (docs/hosts.md)"
            )
    return notes


def _rounded(gap: Little) -> float | None:
    return None if gap is None else round(gap[0], 4)


def _host_summaries(
    c: Collected, facts: RunFacts, littles: Mapping[str, Little]
) -> list[dict[str, Any]]:
    """Each node's figures and verdict (docs/run-json.md "hosts")."""
    out = []
    for host, judged in zip(c.hosts, facts.hosts, strict=True):
        tally = c.host_tallies.get(host.node) or SourceTally()
        reasons = [r.text for r in host_reasons(facts, judged)]
        sent = host.issued
        out.append(
            {
                "node": host.node,
                "node_id": host.node_id,
                "host": host.host,
                "ip": host.ip,
                "workers": host.workers,
                "offset_ms": round(host.offset_ms, 4),
                "offset_bound_ms": round(host.offset_bound_ms, 4),
                "round_trip_ms": round(host.round_trip_ms, 4),
                "drift_ms": None if host.drift_ms is None else round(host.drift_ms, 4),
                "drift_bound_ms": (
                    None if host.drift_bound_ms is None else round(host.drift_bound_ms, 4)
                ),
                "requests": tally.ok,
                "errors": tally.errors,
                "qps": tally.ok / c.measured_s if c.measured_s > 0 else None,
                "p99_ms": _p99_ms(tally.total),
                "send_lag_p99_ms": _p99_ms(tally.send_lag),
                "first_send_lag_ms": host.first_send_lag_ms,
                "client_cpu_us_per_request": (
                    host.cpu_s * 1e6 / sent if host.cpu_s is not None and sent else None
                ),
                "worker_nice": host.worker_nice,
                "node_cpu_pct": host.node_cpu_pct,
                "node_cpu_max_pct": host.node_cpu_max_pct,
                "steal_pct": host.steal_pct,
                "neighbours": list(host.neighbours),
                "littles_law_gap": _rounded(littles[host.node]),
                "lost_at_s": host.lost_at_s,
                "valid": not reasons,
                "reasons": reasons,
            }
        )
    return out


def _summary(
    c: Collected,
    valid: bool,
    reasons: list[str],
    notes: list[str],
    errors: Mapping[str, tuple[int, str | None]],
    qps: float | None,
    facts: RunFacts,
    littles: Mapping[str, Little],
) -> RunSummary:
    stages, harness, llm_series = _split_all(c.histograms)
    summary: dict[str, Any] = {
        "run_id": c.run_id,
        "experiment": c.experiment,
        "status": c.status,
        "valid": valid,
        "provisional": c.protocol.provisional,
        "reasons": reasons,
        "notes": notes,
        "protocol": c.protocol.name,
        "load": c.load.mode,
        "requests": c.completed,
        "errors": c.failed,
        "errors_by_type": {k: v[0] for k, v in errors.items()},
        "qps": qps,
        "warmup_s": round(c.warmup_s, 3),
        "duration_s": round(c.measured_s, 3),
        "latency_ms": latency_summary(stages),
        "harness_ms": latency_summary(harness),
        "resources": resource_summary(c.readings, c.peak_rss_bytes),
        "who": c.who,
    }
    if c.llm is not None:
        summary["llm"] = llm_summary(llm_series, c.llm, c.measured_s, c.goodput_ms, c.server)
    if c.accuracy is not None:
        summary["accuracy"] = c.accuracy
    if c.target_metrics is not None:
        summary["target"] = c.secrets.redact_any(c.target_metrics)
    if c.service is not None:
        summary["service"] = c.service
    if c.paired is not None:
        summary["paired"] = dict(c.paired)
    if c.parent is not None:
        summary["parent"] = step_against(c.parent, summary, c.plan)
    if c.hosts:
        summary["hosts"] = _host_summaries(c, facts, littles)
    # A last net: nothing that strict JSON rejects reaches the store or `run --json`.
    late_notes: list[str] = []
    # (deeper than the hooks' own pass, which already cut what a target nested too deep)
    safe: dict[str, Any] = json_safe(summary, "summary", late_notes, max_depth=MAX_JSON_DEPTH + 4)
    safe["notes"] += late_notes
    measured = RunSummary.from_json(safe)
    # The evidence reads the summary's series and the target's figures as the summary has them.
    evidence = run_evidence(
        c.observed,
        c.readings,
        measured_s=c.measured_s,
        in_flight_max=c.in_flight[2],
        in_process=c.in_process,
        summary=measured,
    )
    return measured.model_copy(update={"evidence": evidence})


def _split(
    histograms: Mapping[str, LatencyHistogram],
) -> tuple[dict[str, LatencyHistogram], dict[str, LatencyHistogram]]:
    """The latency series (total and the target's stages) apart from the harness's lags."""
    stages, harness, _ = _split_all(histograms)
    return stages, harness


def _split_all(
    histograms: Mapping[str, LatencyHistogram],
) -> tuple[dict[str, LatencyHistogram], dict[str, LatencyHistogram], dict[str, LatencyHistogram]]:
    """The latency series, the harness's lags, and a streaming target's token series."""
    llm = {k: v for k, v in histograms.items() if is_llm_series(k)}
    stages = {k: v for k, v in histograms.items() if k not in LAG_SERIES and k not in llm}
    harness = {k: v for k, v in histograms.items() if k in LAG_SERIES}
    return stages, harness, llm


def step_against(
    parent: RunRecord, summary: Mapping[str, Any], plan: Plan | None
) -> dict[str, Any]:
    """This run's change against the parent run it was checked against (relative, in %)."""
    total = parent.summary.total if parent.summary is not None else LatencyStats()
    before = {"p50": total.p50, "p95": total.p95, "p99": total.p99}
    after = summary.get("latency_ms", {}).get(TOTAL, {})

    def change(old: float | None, new: float | None) -> float | None:
        pct = percent_change(old, new)
        return None if pct is None else round(pct, 2)

    variable = plan.variable if plan is not None else None
    return {
        "experiment": parent.experiment,
        "run_id": parent.id,
        "variable": variable.name if variable is not None else None,
        "change": variable.describe() if variable is not None else None,
        "qps": parent.qps,
        "qps_change_pct": change(parent.qps, summary.get("qps")),
        **{f"{k}_ms": before.get(k) for k in ("p50", "p95", "p99")},
        **{f"{k}_change_pct": change(before.get(k), after.get(k)) for k in ("p50", "p95", "p99")},
    }


def who() -> str:
    """user@host of whoever ran the measurement, for the audit."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _num(value: Any) -> float | None:
    return None if value is None else float(value)
