"""Every diagnosis rule (`optlab.diagnose.rules.RULES`, docs/diagnose.md "Rules") on constructed
evidence: a table per rule of the runs it fires on, the runs it passes, and the runs it cannot
evaluate, each row asserting the outcome and the evidence it shows (the metric read against its
threshold, or what the run lacks)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal, get_args

import numpy as np
import pytest

from optlab.config.remedies import RuleId
from optlab.diagnose.evidence import Evidence
from optlab.diagnose.findings import Fired, Passed, Unevaluable
from optlab.diagnose.rules import RULES, rule_by_id
from optlab.store.records import GpuSample
from optlab.store.summary import (
    BatchingEvidence,
    GcEvidence,
    LatencyStats,
    LineFit,
    LlmSummary,
    MemoryTrend,
    NetworkEvidence,
    ServerMetrics,
)
from optlab.targets.registry import kind_named
from tests.support.evidence import (
    CLIENTS_HELD_UP,
    GENERATOR_BEHIND,
    OPEN,
    SATURATED,
    SLOW,
    STUCK,
    Run,
)

Outcome = Literal["fired", "passed", "not-evaluated"]
RNG = np.random.default_rng(3)
# A 4 ms lock under 8 clients, handed over unfairly: a quarter go straight through.
HELD = np.concatenate([np.full(600, 4.1), 4.1 * RNG.integers(2, 16, 1800)])
# Most requests at 4 ms, 2% stalled at 100 ms.
STALLED = np.concatenate([np.full(1960, 4.0), np.full(40, 100.0)])
BUILTIN_BATCHING = {"batching": {"mode": "dynamic", "max_batch_size": 8, "max_wait_ms": 10}}
REPLAY = {"mode": "replay", "trace": "trace.jsonl"}
# The classifier's own figures (docs/run-json.md `target`): its engine busy 4.9 s of the 5 s
# measured phase.
ENGINE_BUSY = {"instances": 1, "infer": {"busy_ms": 4900.0}}
SERVED = NetworkEvidence(
    client_p50_ms=10.0, server_p50_ms=4.0, overhead_p50_ms=6.0, overhead_share=0.6
)
NEAR = NetworkEvidence(
    client_p50_ms=4.4, server_p50_ms=4.0, overhead_p50_ms=0.4, overhead_share=0.1
)


def gpus(util: float, throttled: tuple[str, ...] = ()) -> tuple[GpuSample, ...]:
    return (GpuSample(index=0, util_pct=util, throttle_reasons=throttled),)


def no_stages(e: Evidence) -> Evidence:
    return replace(e, stages={}, fastest={})


@dataclass(frozen=True)
class Case:
    rule: str
    name: str
    run: Run
    outcome: Outcome
    # Fired or passed: a metric the outcome shows (None: it shows none); not evaluated: what
    # the run lacks, the start of the sentence.
    shows: str | None
    then: Callable[[Evidence], Evidence] | None = None  # a change the builder cannot make
    # Fired: whether the metric shown is past its threshold (False: the verdict decided, and
    # the metric is shown beside it).
    met: bool = True


CASES: tuple[Case, ...] = (
    # load-generator: an open loop (replay too) on its send lag, a closed loop on its clients.
    Case(
        "load-generator",
        "open loop, the verdict blames the generator",
        Run(load=OPEN, reasons=GENERATOR_BEHIND, send_lag_ms=60.0),
        "fired",
        "send-lag P99",
    ),
    Case(
        "load-generator",
        "replay judged as the open loop it is",
        Run(load=REPLAY, reasons=GENERATOR_BEHIND, send_lag_ms=60.0),
        "fired",
        "send-lag P99",
    ),
    # A closed loop is decided by the verdict's Little's-law reason (clients-held-up); its
    # start lag (recorded 0 on a real closed loop) is no measure of it and is not shown.
    Case(
        "load-generator",
        "closed loop, clients held up",
        Run(reasons=CLIENTS_HELD_UP, in_flight=(4,) * 5, start_lag_ms=3.0),
        "fired",
        "clients held up between calls (the verdict's reason)",
    ),
    Case(
        "load-generator",
        "closed loop, a late start but no verdict reason",
        Run(start_lag_ms=6.0),
        "passed",
        "clients held up between calls (the verdict's reason)",
    ),
    Case(
        "load-generator",
        "closed loop stored without the lag series, judged by its verdict's codes",
        Run(reasons=CLIENTS_HELD_UP, send_lag_ms=None, start_lag_ms=None),
        "fired",
        "clients held up between calls (the verdict's reason)",
    ),
    Case(
        "load-generator",
        "open loop, lag small beside the latency",
        Run(load=OPEN, send_lag_ms=3.0, stage_ms=SLOW),
        "passed",
        "send-lag P99",
    ),
    Case(
        "load-generator",
        "replay, a late start but no verdict reason",
        Run(load=REPLAY, send_lag_ms=0.5, start_lag_ms=6.0),
        "passed",
        "send-lag P99",
    ),
    Case(
        "load-generator",
        "the target saturated",
        Run(load=OPEN, reasons=SATURATED, qps=300.0),
        "passed",
        "target saturated (the verdict's reason)",
    ),
    Case(
        "load-generator",
        "open loop without a send-lag series",
        Run(load=OPEN, send_lag_ms=None),
        "not-evaluated",
        "no send-lag series",
    ),
    Case(
        "load-generator",
        "closed loop without a verdict",
        Run(judged=False),
        "not-evaluated",
        "no verdict to read",
    ),
    # noisy-neighbour
    Case(
        "noisy-neighbour",
        "other processes took most of the machine",
        Run(other_pct=190.0),
        "fired",
        "other processes' CPU (of the machine)",
    ),
    Case("noisy-neighbour", "the hypervisor stole", Run(steal_pct=40.0), "fired", "steal"),
    Case(
        "noisy-neighbour",
        "a quiet machine",
        Run(),
        "passed",
        "other processes' CPU (of the machine)",
    ),
    Case(
        "noisy-neighbour",
        "no readings",
        Run(other_pct=None, steal_pct=None),
        "not-evaluated",
        "no readings of other processes",
    ),
    # errors
    Case(
        "errors",
        "a tenth failed",
        Run(requests=1800, errors=200, errors_by_type={"ValueError": 200}),
        "fired",
        "error rate",
    ),
    Case("errors", "clients stuck in a call", Run(reasons=STUCK), "fired", None),
    Case("errors", "none failed", Run(), "passed", "error rate"),
    Case(
        "errors",
        "no request counts",
        Run(requests=None, errors=None),
        "not-evaluated",
        "the run has no request counts",
    ),
    Case(
        "errors",
        "no request finished",
        Run(requests=0, errors=0),
        "not-evaluated",
        "no request finished",
    ),
    # saturated (never unevaluated: a run without a verdict or windows is not saturated)
    Case(
        "saturated",
        "the verdict's reason",
        Run(load=OPEN, reasons=SATURATED, qps=300.0, in_flight=(0, 50, 100, 150, 200)),
        "fired",
        "completed / offered rate",
    ),
    Case(
        "saturated",
        "judged before the rule: rate and backlog",
        Run(load=OPEN, qps=300.0, in_flight=(0, 50, 100, 150, 200)),
        "fired",
        "completed / offered rate",
    ),
    Case("saturated", "an open loop that kept up", Run(load=OPEN), "passed", "target saturated"),
    Case("saturated", "a closed loop", Run(), "passed", None),
    # gc-churn
    Case(
        "gc-churn",
        "a fifth of the time collecting",
        Run(
            gc=GcEvidence(collections=450, pause_total_ms=950.0, pause_max_ms=324.0, share_pct=19.0)
        ),
        "fired",
        "GC pauses (share of wall time)",
    ),
    Case(
        "gc-churn",
        "short rare pauses",
        Run(gc=GcEvidence(collections=3, pause_total_ms=2.0, pause_max_ms=1.0, share_pct=0.1)),
        "passed",
        "GC pauses (share of wall time)",
    ),
    Case(
        "gc-churn", "a service (the GC recorded is optlab's)", Run(kind="command"), "passed", None
    ),
    Case(
        "gc-churn",
        "no pauses recorded",
        Run(),
        "not-evaluated",
        "no garbage-collector pauses recorded",
    ),
    # memory-leak
    Case(
        "memory-leak",
        "RSS grows with every request",
        Run(
            recorded={"memory": MemoryTrend(mib_per_1k_requests=10.0, r2=0.97, samples=10)},
            rss_mib=tuple(100.0 + 2 * t for t in range(10)),
        ),
        "fired",
        "RSS slope",
    ),
    Case(
        "memory-leak",
        "a flat RSS",
        Run(recorded={"memory": MemoryTrend(mib_per_1k_requests=0.01, r2=0.1, samples=10)}),
        "passed",
        "RSS slope",
    ),
    Case(
        "memory-leak", "no trend recorded", Run(), "not-evaluated", "no RSS-against-requests trend"
    ),
    # io-wait
    Case(
        "io-wait",
        "the CPUs wait on I/O",
        Run(iowait_pct=30.0),
        "fired",
        "I/O wait (of the machine)",
    ),
    Case("io-wait", "no I/O wait", Run(), "passed", "I/O wait (of the machine)"),
    Case("io-wait", "no readings", Run(iowait_pct=None), "not-evaluated", "no I/O-wait readings"),
    # gpu-compute-bound
    Case(
        "gpu-compute-bound",
        "the GPU busy",
        Run(gpus=gpus(95.0)),
        "fired",
        "GPU utilisation (median sample)",
    ),
    Case(
        "gpu-compute-bound",
        "the GPU idles",
        Run(gpus=gpus(40.0)),
        "passed",
        "GPU utilisation (median sample)",
    ),
    Case(
        "gpu-compute-bound",
        "no telemetry",
        Run(),
        "not-evaluated",
        "no GPU evidence: the run had no GPU telemetry",
    ),
    Case(
        "gpu-compute-bound",
        "a GPU target without readings",
        Run(kind="builtin", knobs={"device": "cuda"}),
        "not-evaluated",
        "no GPU evidence: NVML gave no readings",
    ),
    # gpu-starved
    Case(
        "gpu-starved",
        "the GPU idles while the host is full",
        Run(gpus=gpus(30.0), cpu_pct=190.0),
        "fired",
        "GPU utilisation P95",
    ),
    Case(
        "gpu-starved",
        "the GPU busy",
        Run(gpus=gpus(95.0), cpu_pct=190.0),
        "passed",
        "GPU utilisation P95",
    ),
    Case("gpu-starved", "no telemetry", Run(), "not-evaluated", "no GPU evidence"),
    # gpu-throttled
    Case(
        "gpu-throttled",
        "clocks lowered all run",
        Run(gpus=gpus(90.0, ("sw_power_cap",))),
        "fired",
        "samples with GPU clocks lowered",
    ),
    Case(
        "gpu-throttled",
        "full clocks",
        Run(gpus=gpus(90.0)),
        "passed",
        "samples with GPU clocks lowered",
    ),
    Case("gpu-throttled", "no telemetry", Run(), "not-evaluated", "no GPU evidence"),
    # cpu-bound
    Case(
        "cpu-bound",
        "in process, the machine full of the stage's work",
        Run(cpu_pct=190.0),
        "fired",
        "target CPU (of the machine)",
    ),
    Case(
        "cpu-bound",
        "a service without stages on a full machine",
        Run(kind="command", cpu_pct=150.0, machine_pct=97.0),
        "fired",
        "machine CPU",
        then=lambda e: replace(
            e, stages={"total": e.stages["total"]}, fastest={"total": e.fastest["total"]}
        ),
    ),
    Case(
        "cpu-bound",
        "a batching classifier whose engine is busy all the time (its own figures)",
        Run(kind="builtin", knobs=BUILTIN_BATCHING, target_figures=ENGINE_BUSY),
        "fired",
        "engine busy (per instance)",
    ),
    Case("cpu-bound", "CPU to spare", Run(), "passed", "target CPU (of the machine)"),
    Case(
        "cpu-bound",
        "no CPU readings",
        Run(cpu_pct=None),
        "not-evaluated",
        "no CPU samples in the measured phase",
    ),
    Case(
        "cpu-bound",
        "an http service optlab did not start",
        Run(kind="http", cpu_pct=None),
        "not-evaluated",
        "no CPU figures for a service optlab did not start",
    ),
    Case(
        "cpu-bound",
        "in process without stages",
        Run(cpu_pct=190.0),
        "not-evaluated",
        "no stage timings",
        then=no_stages,
    ),
    # gil-bound
    Case(
        "gil-bound",
        "one core of two with requests waiting",
        Run(kind="command", cpu_pct=100.0, machine_pct=55.0),
        "fired",
        "target CPU (cores)",
        then=lambda e: replace(
            e, stages={"total": e.stages["total"]}, fastest={"total": e.fastest["total"]}
        ),
    ),
    Case("gil-bound", "a third of a core", Run(), "passed", "target CPU (cores)"),
    Case("gil-bound", "one core only", Run(cores=1), "passed", "cores"),
    Case("gil-bound", "no CPU readings", Run(cpu_pct=None), "not-evaluated", "no CPU samples"),
    # serialised
    Case(
        "serialised",
        "a lock handed over unfairly",
        Run(stage_ms=HELD, qps=231.0, cpu_pct=7.0),
        "fired",
        "infer: throughput x fastest time",
    ),
    Case(
        "serialised",
        "a pool of one",
        Run(
            stage_ms=3.5 * (8 + np.random.default_rng(6).normal(0, 0.5, 1500)).clip(2),
            qps=280.0,
            cpu_pct=104.0,
            fastest_ms=3.5,
            threads=(("pool-of-one_0", 98.0), ("optlab-load-1", 1.0)),
        ),
        "fired",
        "busiest thread (pool-of-one_0): share of the target's CPU",
    ),
    Case("serialised", "parallel requests", Run(), "passed", "requests in flight"),
    Case("serialised", "no throughput", Run(qps=None), "not-evaluated", "no throughput"),
    Case("serialised", "no stages", Run(), "not-evaluated", "no stage timings", then=no_stages),
    # queueing
    Case(
        "queueing",
        "a long wait for a busy engine",
        Run(more_stages={"queue": np.full(2000, 30.0)}),
        "fired",
        "queue share of latency",
    ),
    Case(
        "queueing",
        "a short wait",
        Run(more_stages={"queue": np.full(2000, 0.5)}),
        "passed",
        "queue share of latency",
    ),
    Case("queueing", "no wait stage", Run(), "passed", None),
    Case(
        "queueing",
        "a wait with no throughput to weigh the work behind it",
        Run(qps=None, more_stages={"queue": np.full(2000, 30.0)}),
        "not-evaluated",
        "no stage timings behind the wait",
    ),
    # under-batching
    Case(
        "under-batching",
        "batches leave mostly empty after a long wait",
        Run(
            more_stages={"queue": np.full(2000, 9.0)},
            recorded={
                "batching": BatchingEvidence(
                    mean_batch=1.5, max_batch=8, fill_ratio=0.1875, wait_ms_mean=9.0
                )
            },
        ),
        "fired",
        "batch fill (mean / max)",
    ),
    Case(
        "under-batching",
        "full batches",
        Run(
            more_stages={"queue": np.full(2000, 9.0)},
            recorded={
                "batching": BatchingEvidence(
                    mean_batch=7.5, max_batch=8, fill_ratio=0.94, wait_ms_mean=9.0
                )
            },
        ),
        "passed",
        "batch fill (mean / max)",
    ),
    Case("under-batching", "no batching", Run(), "passed", None),
    Case(
        "under-batching",
        "batching on, no figures",
        Run(kind="builtin", knobs=BUILTIN_BATCHING),
        "not-evaluated",
        "no batching figures recorded",
    ),
    Case(
        "under-batching",
        "figures without a fill",
        Run(recorded={"batching": BatchingEvidence(mean_batch=1.5)}),
        "not-evaluated",
        "the batcher reported no fill ratio",
    ),
    # tail-stalls
    Case(
        "tail-stalls", "fast requests, a few stalled", Run(stage_ms=STALLED), "fired", "P99 / P50"
    ),
    Case("tail-stalls", "a steady latency", Run(), "passed", "P99 / P50"),
    Case(
        "tail-stalls",
        "no end-to-end latency",
        Run(),
        "not-evaluated",
        "no end-to-end latency",
        then=no_stages,
    ),
    # network
    Case(
        "network",
        "most of a request outside the server",
        Run(kind="http", recorded={"network": SERVED}),
        "fired",
        "network + HTTP (share of latency)",
    ),
    Case(
        "network",
        "a near server",
        Run(kind="http", recorded={"network": NEAR}),
        "passed",
        "network + HTTP (share of latency)",
    ),
    Case("network", "in process: no network", Run(), "passed", None),
    Case(
        "network",
        "a server without Server-Timing",
        Run(kind="command"),
        "not-evaluated",
        "the server sends no Server-Timing total",
    ),
    # a streaming LLM target's (its run's llm section)
    Case(
        "llm-client-bound",
        "requests held back 300 ms of a 400 ms TTFT",
        Run(),
        "fired",
        "client wait P99 / TTFT P99",
        then=lambda e: with_llm(e, ttft=(60.0, 400.0), sent=(20.0, 100.0), wait=(40.0, 300.0)),
    ),
    Case(
        "llm-client-bound",
        "sent on time",
        Run(),
        "passed",
        "client wait P99 / TTFT P99",
        then=lambda e: with_llm(e, ttft=(60.0, 100.0), sent=(60.0, 100.0), wait=(0.1, 0.5)),
    ),
    Case("llm-client-bound", "another kind: nothing to check", Run(), "passed", None),
    Case(
        "llm-client-bound",
        "streamed, no figures",
        Run(),
        "not-evaluated",
        "no TTFT or ITL figures",
        then=lambda e: replace(e, kind=kind_named("openai")),
    ),
    Case(
        "llm-queue-bound",
        "the first token 12 steps in",
        Run(),
        "fired",
        "TTFT P50 from the send / ITL P50",
        then=lambda e: with_llm(e, ttft=(240.0, 300.0), sent=(240.0, 300.0), itl=20.0),
    ),
    Case(
        "llm-queue-bound",
        "admitted at once",
        Run(),
        "passed",
        "TTFT P50 from the send / ITL P50",
        then=lambda e: with_llm(e, ttft=(30.0, 40.0), sent=(30.0, 40.0), itl=20.0),
    ),
    Case("llm-queue-bound", "another kind: nothing to check", Run(), "passed", None),
    Case(
        "llm-queue-bound",
        "streamed, no figures",
        Run(),
        "not-evaluated",
        "no TTFT or ITL figures",
        then=lambda e: replace(e, kind=kind_named("openai")),
    ),
    Case(
        "llm-prefill-bound",
        "0.5 ms per input token, most of TTFT",
        Run(),
        "fired",
        "prompt's share of TTFT from the send",
        then=lambda e: with_fits(e, prefill=fit(slope=0.5, intercept=10.0, r2=0.9, x=(64, 512))),
    ),
    Case(
        "llm-prefill-bound",
        "a steep line through noise",
        Run(),
        "passed",
        "R² of the line",
        then=lambda e: with_fits(e, prefill=fit(slope=0.5, intercept=10.0, r2=0.1, x=(64, 512))),
    ),
    Case(
        "llm-prefill-bound",
        "the prompt a small part of TTFT",
        Run(),
        "passed",
        "prompt's share of TTFT from the send",
        then=lambda e: with_fits(e, prefill=fit(slope=0.01, intercept=50.0, r2=0.9, x=(64, 512))),
    ),
    Case("llm-prefill-bound", "another kind: nothing to check", Run(), "passed", None),
    Case(
        "llm-prefill-bound",
        "every prompt the same length",
        Run(),
        "not-evaluated",
        "TTFT cannot be related to the prompt's length",
        then=lambda e: with_fits(e),
    ),
    Case(
        "llm-decode-bound",
        "1 ms per running sequence on a 2 ms step",
        Run(),
        "fired",
        "running sequences' share of ITL",
        then=lambda e: with_fits(e, decode=fit(slope=1.0, intercept=2.0, r2=0.8, x=(1, 12))),
    ),
    Case(
        "llm-decode-bound",
        "a flat decode step",
        Run(),
        "passed",
        "running sequences' share of ITL",
        then=lambda e: with_fits(e, decode=fit(slope=0.01, intercept=20.0, r2=0.5, x=(1, 12))),
    ),
    Case("llm-decode-bound", "another kind: nothing to check", Run(), "passed", None),
    Case(
        "llm-decode-bound",
        "closed loop: the running count hardly varied",
        Run(),
        "not-evaluated",
        "the streams decoding beside a request hardly varied",
        then=lambda e: with_fits(e, decode=fit(slope=1.0, intercept=2.0, r2=0.8, x=(7.6, 8.0))),
    ),
    Case(
        "llm-kv-cache-bound",
        "the cache 98% full at its peak",
        Run(),
        "fired",
        "KV-cache usage max",
        then=lambda e: with_server(e, ServerMetrics(samples=30, kv_cache_usage_max=0.98)),
    ),
    Case(
        "llm-kv-cache-bound",
        "sequences preempted",
        Run(),
        "fired",
        "preemptions",
        then=lambda e: with_server(
            e, ServerMetrics(samples=30, kv_cache_usage_max=0.9, preemptions=12.0)
        ),
    ),
    Case(
        "llm-kv-cache-bound",
        "half full, nothing preempted",
        Run(),
        "passed",
        "KV-cache usage max",
        then=lambda e: with_server(
            e, ServerMetrics(samples=30, kv_cache_usage_max=0.5, preemptions=0.0)
        ),
    ),
    Case("llm-kv-cache-bound", "another kind: nothing to check", Run(), "passed", None),
    Case(
        "llm-kv-cache-bound",
        "streamed, the engine's metrics not read",
        Run(),
        "not-evaluated",
        "no KV-cache figures",
        then=lambda e: replace(e, kind=kind_named("openai")),
    ),
)


def with_server(e: Evidence, server: ServerMetrics) -> Evidence:
    """The run as a streaming target's whose engine's metrics were read."""
    summary = e.run.summary
    assert summary is not None
    llm = LlmSummary(requests=100, server=server)
    return replace(
        e,
        kind=kind_named("openai"),
        run=replace(e.run, summary=summary.model_copy(update={"llm": llm})),
    )


def fit(*, slope: float, intercept: float, r2: float, x: tuple[float, float]) -> LineFit:
    """A line over 200 requests whose x spread evenly over `x`."""
    mean = (x[0] + x[1]) / 2
    return LineFit(
        requests=200,
        slope=slope,
        intercept=intercept,
        r2=r2,
        x_min=x[0],
        x_mean=mean,
        x_max=x[1],
        y_mean=intercept + slope * mean,
    )


def with_fits(
    e: Evidence, *, prefill: LineFit | None = None, decode: LineFit | None = None
) -> Evidence:
    """The run as a streaming target's with its TTFT-by-input and ITL-by-running lines."""
    summary = e.run.summary
    assert summary is not None
    llm = LlmSummary(requests=200, ttft_by_input=prefill, itl_by_running=decode)
    return replace(
        e,
        kind=kind_named("openai"),
        run=replace(e.run, summary=summary.model_copy(update={"llm": llm})),
    )


def with_llm(
    e: Evidence,
    *,
    ttft: tuple[float, float],
    sent: tuple[float, float],
    wait: tuple[float, float] = (0.0, 0.0),
    itl: float = 20.0,
) -> Evidence:
    """The run as a streaming target's: its llm section's (P50, P99) figures."""

    def stats(p50: float, p99: float) -> LatencyStats:
        return LatencyStats(p50=p50, p95=p99, p99=p99, p999=p99, max=p99, mean=p50, count=100)

    llm = LlmSummary(
        ttft_ms=stats(*ttft),
        ttft_sent_ms=stats(*sent),
        client_wait_ms=stats(*wait),
        itl_ms=stats(itl, 2 * itl),
        requests=100,
    )
    summary = e.run.summary
    assert summary is not None
    return replace(e, run=replace(e.run, summary=summary.model_copy(update={"llm": llm})))


@pytest.mark.parametrize("case", CASES, ids=[f"{c.rule}: {c.name}" for c in CASES])
def test_each_rule_on_its_table(case: Case) -> None:
    rule = rule_by_id(case.rule)
    assert rule is not None, case.rule
    evidence = case.run.evidence()
    if case.then is not None:
        evidence = case.then(evidence)
    outcome = rule.check(evidence)
    if case.outcome == "not-evaluated":
        assert isinstance(outcome, Unevaluable), outcome
        assert case.shows is not None and outcome.missing.startswith(case.shows), outcome
        return
    kind = Fired if case.outcome == "fired" else Passed
    assert isinstance(outcome, kind), outcome
    shown = [m.metric for m in outcome.evidence]
    if case.shows is None:
        assert shown == [], shown
        return
    assert case.shows in shown, shown
    measure = next(m for m in outcome.evidence if m.metric == case.shows)
    if case.outcome == "fired":
        assert measure.met is case.met, measure.describe()  # past its threshold: it fired


def test_every_rule_has_a_table_and_every_outcome_it_can_give() -> None:
    by_rule: dict[str, set[str]] = {}
    for case in CASES:
        by_rule.setdefault(case.rule, set()).add(case.outcome)
    assert set(by_rule) == {rule.id for rule in RULES}
    # A run that lacks what it reads is simply not saturated: no unevaluated outcome exists.
    for rule in RULES:
        wanted = {"fired", "passed"} if rule.id == "saturated" else set(get_args(Outcome))
        assert by_rule[rule.id] == wanted, (rule.id, by_rule[rule.id])


def test_the_rule_ids_a_file_may_name_are_the_catalogue() -> None:
    assert get_args(RuleId) == tuple(rule.id for rule in RULES)
