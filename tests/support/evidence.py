"""One builder of a diagnose `Evidence` (docs/diagnose.md "How a run is read"): what a stored run
holds, in the few numbers each case sets, for the unit lane's rule tables and verdict cases.

`Run(...).evidence()` is what `optlab.diagnose.evidence.gather` would read back from a store
holding that run: its record and summary, the measured phase's stages (with the histograms optlab
stores), windows and resource samples, and its config as stored (a dict, parsed the way gather
parses it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from optlab.diagnose.evidence import Evidence, evidence_of
from optlab.metrics.histogram import LatencyHistogram
from optlab.run.validity import RunFacts, verdict
from optlab.store import RunEvidence, RunRecord, RunSummary
from optlab.store.reasons import Reason, ReasonCode
from optlab.store.records import GpuSample, ResourceSample, StageStatsRow, WindowStats
from optlab.store.summary import GcEvidence, LatencyStats, ProcessEvidence, ThreadCpu
from optlab.targets.registry import find_kind

__all__ = [
    "CLIENTS_HELD_UP",
    "GENERATOR_BEHIND",
    "NOW",
    "OPEN",
    "SATURATED",
    "SLOW",
    "STUCK",
    "UNSTABLE",
    "Run",
    "facts",
    "reasons",
    "record_of",
    "stage_row",
]

NOW = datetime(2026, 1, 1, tzinfo=UTC)
OPEN: dict[str, Any] = {"mode": "open", "rate": 400.0, "arrival": "poisson"}
SLOW = np.random.default_rng(1).normal(245.0, 20.0, 1500).clip(150)  # P50 ~245 ms


def stage_row(stage: str, samples_ms: np.ndarray[Any, Any]) -> StageStatsRow:
    """A stage's measured row from its requests' times, with the histogram optlab stores."""
    histogram = LatencyHistogram()
    histogram.record_array((samples_ms * 1e6).astype(np.int64))
    return StageStatsRow(
        stage=stage,
        phase="measure",
        count=len(samples_ms),
        histogram=histogram.encode(),
        min_ms=float(samples_ms.min()),
        mean_ms=float(samples_ms.mean()),
        stddev_ms=float(samples_ms.std()),
        p50_ms=float(np.percentile(samples_ms, 50)),
        p90_ms=float(np.percentile(samples_ms, 90)),
        p95_ms=float(np.percentile(samples_ms, 95)),
        p99_ms=float(np.percentile(samples_ms, 99)),
        max_ms=float(samples_ms.max()),
    )


def _target(kind: str) -> dict[str, Any]:
    if kind == "python":
        return {"kind": "python", "factory": "m:build"}
    if kind == "builtin":
        return {"kind": "builtin", "name": "image-classifier"}
    if kind == "synthetic":
        return {"kind": "builtin", "name": "synthetic"}
    if kind == "http":
        return {"kind": "http", "url": "http://127.0.0.1:1/"}
    return {"kind": kind, "url": "http://127.0.0.1:1/", "command": ["serve"]}


@dataclass
class Run:
    """What a stored run holds, in the few numbers each case sets."""

    kind: str = "python"  # python, builtin (the classifier), synthetic, http, command
    target: dict[str, Any] | None = None  # the stored target; default: the kind's plainest
    knobs: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)  # workload.inputs
    load: dict[str, Any] = field(default_factory=lambda: {"mode": "closed", "concurrency": 8})
    stage_ms: np.ndarray[Any, Any] = field(
        default_factory=lambda: np.random.default_rng(0).normal(4.0, 0.2, 2000).clip(3.5)
    )
    stage: str = "infer"  # the name of the stage `stage_ms` times
    # Other stages (a wait stage "queue", "preprocess"): added to the total, request by request.
    more_stages: dict[str, np.ndarray[Any, Any]] = field(default_factory=dict)
    qps: float | None = 400.0
    status: str = "FINISHED"
    requests: int | None = 2000
    errors: int | None = 0
    reasons: tuple[Reason, ...] = ()  # the verdict's own, codes and texts
    judged: bool = True  # False: the run has no verdict (valid is None: RUNNING, FAILED)
    cpu_pct: float | None = 30.0  # the target's, % of one core
    threads: tuple[tuple[str, float], ...] = ()
    other_pct: float | None = 5.0  # other processes, % of one core
    steal_pct: float | None = 0.0
    send_lag_ms: float | None = 0.2  # None: no send-lag series recorded
    start_lag_ms: float | None = 0.1
    in_flight: tuple[int, ...] = (8, 8, 8, 8, 8)
    gc: GcEvidence | None = None
    errors_by_type: dict[str, int] = field(default_factory=dict)
    fastest_ms: float | None = None  # the whole run's, warmup included; else the stage's
    machine_pct: float | None = 50.0  # every core, 0..100
    iowait_pct: float | None = 0.0
    gpus: tuple[GpuSample, ...] | None = None  # every sample's GPUs; None: no telemetry
    rss_mib: tuple[float, ...] | None = None  # one sample a second; else none recorded
    recorded: dict[str, Any] = field(default_factory=dict)  # RunEvidence fields to set
    target_figures: dict[str, Any] | None = None  # the summary's `target` (its metrics())
    protocol: dict[str, Any] = field(default_factory=dict)  # the run's stored protocol
    cores: int = 2

    @property
    def in_process(self) -> bool:
        """Whether the target's kind runs it in optlab's process (the registry says)."""
        kind = find_kind(self.target if self.target is not None else _target(self.kind))
        return kind is not None and kind.in_process

    def config(self) -> dict[str, Any]:
        """The config as the store holds it."""
        workload: dict[str, Any] = {"load": self.load}
        if self.inputs:
            workload["inputs"] = self.inputs
        target = self.target if self.target is not None else _target(self.kind)
        return {"target": target, "knobs": self.knobs, "workload": workload}

    def evidence(self) -> Evidence:
        usage = ProcessEvidence(
            cpu_user_pct=self.cpu_pct,
            cpu_system_pct=None if self.cpu_pct is None else 0.0,
            threads=tuple(ThreadCpu(name=n, cpu_pct=c) for n, c in self.threads),
        )
        recorded = RunEvidence(
            cores=self.cores,
            process=usage if self.in_process else ProcessEvidence(cpu_user_pct=10.0),
            service=None if self.in_process else usage,
            neighbour_cpu_pct=self.other_pct,
            steal_pct=self.steal_pct,
            gc=self.gc,
            in_flight_mean=float(sum(self.in_flight)) / len(self.in_flight),
        ).model_copy(update=self.recorded)
        total = self.stage_ms + 0.05
        for times in self.more_stages.values():
            total = total + np.resize(times, len(total))
        lags = {}
        if self.send_lag_ms is not None:
            lags["send_lag"] = LatencyStats(p99=self.send_lag_ms, count=1)
        if self.start_lag_ms is not None:
            lags["start_lag"] = LatencyStats(p99=self.start_lag_ms, count=1)
        valid = not self.reasons if self.judged else None
        document: dict[str, Any] = {
            "run_id": 1,
            "experiment": "case",
            "status": self.status,
            "valid": valid,
            "provisional": True,
            "reasons": [r.text for r in self.reasons],
            "protocol": "quick",
            "load": self.load["mode"],
            "requests": self.requests,
            "errors": self.errors,
            "errors_by_type": self.errors_by_type,
            "qps": self.qps,
            "warmup_s": 1.0,
            "duration_s": 5.0,
            "harness_ms": {k: v.model_dump() for k, v in lags.items()},
            "evidence": recorded.model_dump(),
        }
        if self.target_figures is not None:
            document["target"] = self.target_figures
        summary = RunSummary.model_validate(document)
        run = record_of(summary, tuple(r.code for r in self.reasons), self.protocol)
        rss = self.rss_mib or ()
        samples = tuple(
            ResourceSample(
                phase="measure",
                t_s=float(t),
                cpu_process_pct=self.cpu_pct,
                cpu_system_pct=self.machine_pct,
                iowait_pct=self.iowait_pct,
                steal_pct=self.steal_pct,
                other_cpu_pct=self.other_pct,
                rss_bytes=int(rss[t] * 2**20) if t < len(rss) else None,
                gpus=self.gpus,
            )
            for t in range(max(5, len(rss)))
        )
        windows = tuple(
            WindowStats(
                phase="measure",
                t_s=t,
                completed=int(self.qps or 0),
                errors=0,
                qps=self.qps or 0.0,
                in_flight=n,
            )
            for t, n in enumerate(self.in_flight)
        )
        stages = {
            self.stage: stage_row(self.stage, self.stage_ms),
            "total": stage_row("total", total),
        }
        fastest = {
            self.stage: self.fastest_ms or float(self.stage_ms.min()),
            "total": (self.fastest_ms or float(self.stage_ms.min())) + 0.05,
        }
        for name, times in self.more_stages.items():
            stages[name] = stage_row(name, times)
            fastest[name] = float(times.min())
        return evidence_of(
            run,
            self.config(),
            stages=stages,
            windows=windows,
            samples=samples,
            cores=self.cores,
            fastest=fastest,
        )


def record_of(
    summary: RunSummary, codes: tuple[ReasonCode, ...] = (), protocol: dict[str, Any] | None = None
) -> RunRecord:
    """The stored run record around `summary` (its status, verdict, counts and durations), with
    the verdict's reason `codes` and the run's stored `protocol`."""
    return RunRecord(
        id=summary.run_id,
        uid="u",
        experiment=summary.experiment,
        config_id=1,
        config_hash="h",
        environment_id=None,
        status=summary.status,
        protocol_name=summary.protocol,
        protocol=protocol or {},
        provisional=summary.provisional,
        repeat=False,
        code_identity={},
        git_commit=None,
        git_dirty=None,
        hostname="elsewhere",
        pid=1,
        started_at=NOW,
        heartbeat_at=NOW,
        finished_at=NOW,
        warmup_s=summary.warmup_s,
        duration_s=summary.duration_s,
        valid=summary.valid,
        reasons=summary.reasons,
        reason_codes=codes,
        requests=summary.requests,
        errors=summary.errors,
        qps=summary.qps,
        summary=summary,
        error_message=None,
    )


def facts(**changes: Any) -> RunFacts:
    """A run's facts as the verdict reads them: a calm 5 s open loop at 400/s, changed."""
    base: dict[str, Any] = {
        "requested_s": 5.0,
        "measured_s": 5.0,
        "completed": 2000,
        "errors": 0,
        "max_error_rate": 0.001,
        "send_lag_p99_ms": 0.2,
        "max_send_lag_p99_ms": 2.0,
        "start_lag_p99_ms": 0.1,
        "total_p50_ms": 4.0,
        "first_half_qps": 400.0,
        "second_half_qps": 400.0,
        "stability_tolerance": 0.1,
        "throttled": False,
        "interrupted": False,
        "open_loop": True,
        "intended_qps": 400.0,
        "completed_qps": 400.0,
        "in_process": True,
    }
    return RunFacts(**{**base, **changes})


def reasons(word: str, **changes: Any) -> tuple[Reason, ...]:
    """The verdict's own INVALID reasons for these facts, with their codes; one of them names
    `word` (diagnose matches the codes, never the words)."""
    said = verdict(facts(**changes)).coded
    assert any(word in r.text for r in said), said
    return said


# The verdict's reasons for each kind of INVALID run, with the numbers that make it.
GENERATOR_BEHIND = reasons(
    "load generator",
    send_lag_p99_ms=60.0,
    total_p99_ms=8.0,
    send_lag_p99_low_ms=60.0,
    in_flight_max=3,
    in_flight_limit=1000,
)
CLIENTS_HELD_UP = reasons(
    "load generator",
    open_loop=False,
    clients=8,
    total_mean_ms=4.0,
    total_max_ms=6.0,
    timeout_ms=1000.0,
    completed=5000,
    measured_s=5.0,
)
SATURATED = reasons(
    "saturated",
    intended_qps=400.0,
    completed_qps=300.0,
    in_flight_start=0,
    in_flight_end=200,
    in_flight_max=200,
    send_lag_p99_ms=40.0,
)
STUCK = reasons("stuck in a call", open_loop=False, stuck_clients=3, clients=8)
UNSTABLE = reasons(
    "unstable",
    open_loop=False,
    first_half_qps=401.0,
    second_half_qps=251.0,
    measured_s=10.0,
    requested_s=10.0,
)
