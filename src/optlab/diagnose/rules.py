"""The catalogue of diagnosis rules: the method's symptom table as code (docs/diagnose.md).

Each rule has an id, the resource it blames, the symptom it reads, parameters with defaults
and the evidence it needs. `Rule.check` returns a `Fired` finding (bottleneck stage, confidence,
the numbers against their thresholds), `Passed` (evaluated, nothing wrong), or `Unevaluable`
(the run lacks the evidence: the rule says which, it never guesses).

How a request's time is read. A stage's *occupancy* is throughput x its mean time: how many
requests are in it on average (Little's law). Stages that are waits (`queue`: waiting for an
engine instance or a batch) are symptoms, not causes: a long queue means the thing behind it is
busy, and the rules look for what that is. A resource whose occupancy is ~1 per unit (one
engine instance busy all the time, one thread at 100% of a core, one lock held all the time)
serialises the service however much load arrives.

Confidence is 0..1: how far past its thresholds the evidence is, scaled by how much the rule can
explain (a rule that invalidates the measurement itself, such as a late load generator or a
noisy neighbour, ranks first when it fires: nothing else in the run can be trusted until it is
fixed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from optlab.diagnose.checks import (
    check_batching,
    check_cpu,
    check_gil,
    check_io,
    check_lock,
    check_memory,
    check_network,
    check_queueing,
    check_stalls,
)
from optlab.diagnose.evidence import Evidence
from optlab.diagnose.findings import Outcome, Params, Passed, Resource
from optlab.diagnose.gpu_checks import check_gpu_compute, check_gpu_starved, check_gpu_throttled
from optlab.diagnose.llm_checks import (
    check_llm_client,
    check_llm_decode,
    check_llm_kv_cache,
    check_llm_prefill,
    check_llm_queue,
)
from optlab.diagnose.pace_checks import (
    check_errors,
    check_gc,
    check_generator,
    check_neighbour,
    check_saturated,
)

__all__ = ["RULES", "Rule", "rule_by_id"]


@dataclass(frozen=True)
class Rule:
    id: str
    resource: Resource
    title: str
    symptom: str  # the row of the method's symptom table this rule reads
    reads: tuple[str, ...]  # the evidence it needs
    params: Mapping[str, float] = field(default_factory=dict)
    # Measurement rules: when they fire the run's other figures are suspect, so they rank first.
    invalidates: bool = False
    # Rules whose finding this one's explains more precisely: dropped when both fire.
    subsumes: tuple[str, ...] = ()
    # A rule every run's evidence should decide: while it cannot be evaluated, a run where
    # nothing fired is not called healthy (undecided).
    core: bool = False
    check_fn: Callable[[Evidence, Params], Outcome] = field(default=lambda e, p: Passed())

    def check(self, evidence: Evidence, overrides: Params | None = None) -> Outcome:
        params = {**self.params, **(overrides or {})}
        return self.check_fn(evidence, params)


RULES: tuple[Rule, ...] = (
    Rule(
        "load-generator",
        "generator",
        "load generator bound",
        "send lag: the generator could not keep the schedule",
        ("send_lag", "verdict"),
        {"send_lag_p99_ms": 2.0, "latency_share": 0.1},
        invalidates=True,
        core=True,
        check_fn=check_generator,
    ),
    Rule(
        "noisy-neighbour",
        "neighbour",
        "noisy neighbour",
        "other processes (or the hypervisor) took the CPU",
        ("neighbour_cpu_pct", "steal_pct"),
        {"machine_pct": 20.0, "steal_pct": 10.0},
        invalidates=True,
        # Other work that took the CPU also makes the generator late and stalls requests
        # while it runs: the lag and the tail are its doing until it is gone.
        subsumes=("load-generator", "tail-stalls"),
        core=True,
        check_fn=check_neighbour,
    ),
    Rule(
        "errors",
        "errors",
        "errors or overload",
        "requests failed",
        ("requests", "errors"),
        {"error_rate": 0.01},
        invalidates=True,
        core=True,
        check_fn=check_errors,
    ),
    Rule(
        "saturated",
        "queue",
        "target saturated",
        "the offered rate is more than the target completes: requests queue for it",
        ("load", "requests", "windows"),
        {},
        core=True,
        check_fn=check_saturated,
    ),
    Rule(
        "gc-churn",
        "memory",
        "garbage-collection churn (gc)",
        "the garbage collector's pauses take a share of the time or stall requests",
        ("gc", "stages"),
        {"share_pct": 5.0, "pause_max_ms": 50.0},
        # GC pauses stop every thread of the process: the tail is theirs, and the one core
        # the collector holds is not the target's GIL. (The generator rule itself passes when
        # the pauses explain its late sends.)
        subsumes=("tail-stalls", "gil-bound"),
        check_fn=check_gc,
    ),
    Rule(
        "memory-leak",
        "memory",
        "memory leak",
        "memory that only grows is a leak",
        ("memory",),
        {"mib_per_1k": 0.5, "r2": 0.8, "growth_mib": 16.0, "late_share": 0.5},
        check_fn=check_memory,
    ),
    Rule(
        "io-wait",
        "io",
        "I/O wait",
        "I/O wait is data loading",
        ("iowait_pct", "stages"),
        {"iowait_pct": 5.0},
        check_fn=check_io,
    ),
    Rule(
        "gpu-compute-bound",
        "gpu",
        "GPU compute-bound",
        "GPU busy and latency high: the model itself (FP16, INT8, TensorRT)",
        ("gpus", "stages"),
        {"util_pct": 85.0},
        check_fn=check_gpu_compute,
    ),
    Rule(
        "gpu-starved",
        "cpu",
        "GPU starved by the CPU",
        "GPU utilisation low while the CPU is saturated: preprocessing starves the model",
        ("gpus", "cpu_process_pct", "stages"),
        {"util_p95_pct": 70.0, "cpu_pct": 85.0},
        subsumes=("cpu-bound", "gil-bound"),
        check_fn=check_gpu_starved,
    ),
    Rule(
        "gpu-throttled",
        "gpu",
        "GPU clocks lowered",
        "the GPU ran below its clocks",
        ("gpus",),
        {"share_pct": 20.0},
        check_fn=check_gpu_throttled,
    ),
    Rule(
        "cpu-bound",
        "cpu",
        "CPU-bound stage",
        "CPU saturated in one stage",
        ("cpu_process_pct", "threads", "stages"),
        {"machine_pct": 85.0, "thread_pct": 85.0, "work_share": 0.5},
        subsumes=("tail-stalls",),
        core=True,
        check_fn=check_cpu,
    ),
    Rule(
        "gil-bound",
        "gil",
        "GIL-bound",
        "one core's worth of CPU on a multi-core machine with work waiting",
        ("cpu_process_pct", "threads", "in_flight", "profile"),
        {"low_cores": 0.65, "high_cores": 1.3, "work_share": 0.8},
        subsumes=("tail-stalls",),
        core=True,
        check_fn=check_gil,
    ),
    Rule(
        "serialised",
        "lock",
        "serialised on a lock",
        "throughput ~ 1 / service time with idle CPU",
        ("stages", "in_flight", "cpu_process_pct"),
        {
            "parallel_low": 0.6,
            "parallel_high": 1.4,
            "inflation": 2.0,
            "in_flight": 2.0,
            "idle_cores": 0.6,
            "worker_share": 0.6,
        },
        subsumes=("gil-bound", "cpu-bound"),
        core=True,
        check_fn=check_lock,
    ),
    Rule(
        "queueing",
        "queue",
        "queueing for the engine",
        "a long queue means concurrency or batching",
        ("stages", "target.infer"),
        {"wait_share_pct": 50.0, "busy": 0.8},
        check_fn=check_queueing,
    ),
    Rule(
        "under-batching",
        "queue",
        "under-batching",
        "batches leave mostly empty after a long wait",
        ("batch_fill", "batch_wait"),
        {"fill": 0.5, "wait_share_pct": 30.0},
        check_fn=check_batching,
    ),
    Rule(
        "tail-stalls",
        "stall",
        "tail stalls",
        "P99 far above P50: stalls, GC or contention",
        ("stages", "windows", "gc"),
        {"tail_ratio": 4.0, "p50_over_min": 1.6},
        core=True,
        check_fn=check_stalls,
    ),
    Rule(
        "network",
        "network",
        "network and HTTP cost",
        "the client's time far above the server's own",
        ("network",),
        {"share_pct": 40.0},
        check_fn=check_network,
    ),
    Rule(
        "llm-client-bound",
        "generator",
        "streaming client holds requests back",
        "TTFT from the intended send well above TTFT from the send: the client waited",
        ("llm",),
        {"share": 0.2},
        check_fn=check_llm_client,
    ),
    Rule(
        "llm-queue-bound",
        "queue",
        "queue-bound TTFT",
        "TTFT many decode steps long: requests wait for a sequence slot before their prefill",
        ("llm",),
        {"steps": 4.0},
        check_fn=check_llm_queue,
    ),
    Rule(
        "llm-prefill-bound",
        "queue",
        "prefill-bound TTFT",
        "TTFT grows with the prompt's tokens: the prefill sets the first token",
        ("llm",),
        {"share": 0.5, "r2": 0.3},
        # The prompt's prefill explains a first token many decode steps in.
        subsumes=("llm-queue-bound",),
        check_fn=check_llm_prefill,
    ),
    Rule(
        "llm-decode-bound",
        "queue",
        "decode-bound ITL",
        "ITL grows with the sequences decoding together: the batch sets the decode step",
        ("llm",),
        {"share": 0.5, "r2": 0.3, "spread": 1.0},
        check_fn=check_llm_decode,
    ),
    Rule(
        "llm-kv-cache-bound",
        "memory",
        "KV cache full",
        "the engine's own KV-cache usage near 1, or sequences preempted",
        ("llm",),
        {"usage": 0.95},
        check_fn=check_llm_kv_cache,
    ),
)


def rule_by_id(rule_id: str) -> Rule | None:
    return next((r for r in RULES if r.id == rule_id), None)
