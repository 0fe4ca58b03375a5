"""A stored run read as evidence: what the rules of `optlab.diagnose.rules` look at.

Everything here is read from the store (the run, its measured phase's stages, windows and
resource samples, its config and environment) and derived by pure functions, so a rule sees
the same numbers whether the run was measured a second ago or imported from a bundle. A figure
the run could not measure is None, and the rule that needs it says so instead of guessing.
"""

from __future__ import annotations

import socket
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from optlab.config.models import ResolvedConfig
from optlab.config.modes import MODES, LoadCommon, LoadMode, mode_of
from optlab.errors import ConfigError
from optlab.metrics.histogram import LatencyHistogram
from optlab.metrics.stages import is_target_stage
from optlab.metrics.stats import percentile
from optlab.store import RunEvidence, RunRecord, RunSummary, Store
from optlab.store.records import ResourceSample, StageStatsRow, WindowStats
from optlab.targets.kind import TargetKind
from optlab.targets.registry import find_kind, kind_of

__all__ = ["Evidence", "evidence_of", "gather", "percentile"]

MEASURED = "measure"
# Stages that are waiting, not work: a request waiting for an engine instance or a batch.
WAIT_STAGES = frozenset({"queue", "batch", "batch_wait", "wait"})


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


@dataclass(frozen=True)
class Evidence:
    """One run's evidence over its measured phase, with its config read once: the target's
    kind and the load's mode are asked, never the config's raw fields."""

    run: RunRecord
    # The config as the run stored it, parsed; None when it no longer parses (a bundle from
    # another optlab), and then `partial` says so and the rules that need it say what they lack.
    config: ResolvedConfig | None
    stages: dict[str, StageStatsRow] = field(default_factory=dict)  # "total" included
    windows: tuple[WindowStats, ...] = ()
    samples: tuple[ResourceSample, ...] = ()
    cores: int | None = None
    partial: str | None = None  # why the evidence is incomplete; None when complete
    # Why there is nothing to diagnose (a FAILED, CRASHED or KILLED run without a request,
    # a RUNNING run whose process is gone); None when there is.
    no_data: str | None = None
    # Each stage's fastest request over the whole run, warmup included (ms).
    fastest: dict[str, float] = field(default_factory=dict)
    kind: TargetKind | None = None  # the target's kind (optlab.targets.registry)
    mode: LoadMode[Any] | None = None  # the load's mode (optlab.config.modes)
    stored_load: LoadCommon | None = None  # the load's model (also when the config is not)

    # -- the run and its config ------------------------------------------------------------

    @property
    def summary(self) -> RunSummary | None:
        return self.run.summary

    @property
    def recorded(self) -> RunEvidence | None:
        """What the run recorded for diagnosis (None for runs measured before optlab did)."""
        return self.summary.evidence if self.summary is not None else None

    @property
    def knobs(self) -> dict[str, Any]:
        return dict(self.config.knobs) if self.config is not None else {}

    @property
    def load(self) -> LoadCommon | None:
        return self.stored_load

    @property
    def open_loop(self) -> bool:
        """Requests left on a schedule (open loop, ramp, replay): their send lag is recorded and
        judged; a closed loop's clients by the verdict (`clients-held-up`)."""
        return self.mode is not None and self.mode.open_loop

    @property
    def offered_qps(self) -> float | None:
        """The rate the load offered (an open loop's); None where the target or a trace set it."""
        load = self.load
        return self.mode.offered_qps(load) if self.mode is not None and load is not None else None

    @property
    def clients(self) -> int | None:
        """A closed loop's clients; None for a load that sends on a schedule."""
        load = self.load
        return self.mode.clients(load) if self.mode is not None and load is not None else None

    @property
    def in_process(self) -> bool:
        """The target ran inside optlab's process (its CPU is optlab's process CPU)."""
        return self.kind is not None and self.kind.in_process

    @property
    def over_network(self) -> bool:
        """The target is a service measured over the network (not in optlab's process)."""
        return self.kind is not None and not self.kind.in_process

    @property
    def service_unseen(self) -> bool:
        """A service optlab did not start: its process tree is sampled only when it happens
        to listen on this host."""
        return self.over_network and self.kind is not None and not self.kind.starts_service

    # -- latency ---------------------------------------------------------------------------

    @property
    def total(self) -> StageStatsRow | None:
        return self.stages.get("total")

    def work_stages(self) -> dict[str, StageStatsRow]:
        """The target's own stages with requests in them (not the total)."""
        return {
            name: row
            for name, row in self.stages.items()
            if is_target_stage(name) and row.count > 0 and row.mean_ms is not None
        }

    def share(self, stage: str) -> float | None:
        """The stage's mean time as a fraction of the total's mean."""
        row, total = self.stages.get(stage), self.total
        if row is None or total is None or not total.mean_ms or row.mean_ms is None:
            return None
        return row.mean_ms / total.mean_ms

    def top_stage(self, *, waits: bool = True) -> tuple[str, float] | None:
        """The stage that holds the most of a request's time, with its share."""
        shares = {
            name: self.share(name)
            for name in self.work_stages()
            if waits or name not in WAIT_STAGES
        }
        known = {name: s for name, s in shares.items() if s is not None}
        if not known:
            return None
        name = max(known, key=lambda n: known[n])
        return name, known[name]

    def fastest_ms(self, stage: str) -> float | None:
        """The fastest a request went through `stage` in the whole run: the best estimate of
        the stage's own service time. The warmup counts: its first requests find the service
        idle, while under a fair lock every measured request may wait for all the others."""
        row = self.stages.get(stage)
        found = [v for v in (self.fastest.get(stage), row.min_ms if row else None) if v]
        return min(found) if found else None

    def stage_percentile(self, stage: str, q: float) -> float | None:
        """The measured phase's q-th percentile of `stage` (ms), from its stored histogram;
        None when the stage has none."""
        row = self.stages.get(stage)
        if row is None or not row.count or not row.histogram:
            return None
        try:
            value = LatencyHistogram.decode(row.histogram).value_at_percentile_ns(q)
        except (ValueError, TypeError):
            return None
        return value / 1e6 if value is not None else None

    def harness_p99(self, series: str) -> float | None:
        """send_lag / start_lag P99 in ms, from the summary's harness series."""
        if self.summary is None:
            return None
        stats = self.summary.harness_ms.get(series)
        return stats.p99 if stats is not None else None

    # -- resources -------------------------------------------------------------------------

    def mean_of(self, name: str) -> float | None:
        return _mean([getattr(s, name) for s in self.samples])

    def target_cpu_pct(self) -> float | None:
        """CPU of the process that runs the target, percent of one core: optlab's own for an
        in-process target, the service's tree for a service optlab started, None otherwise.

        From the readings taken when the measured phase began and ended (the evidence's user +
        system CPU) where the run has them: the once-a-second sampler is a thread of optlab's
        own, and a target that holds the GIL delays it, so its per-interval figures misread
        (1.7 cores for a process getrusage puts at 1.0). Else the samples' mean."""
        recorded = self.recorded
        usage = None
        if recorded is not None:
            usage = recorded.process if self.in_process else recorded.service
        if usage is not None and usage.cpu_user_pct is not None:
            return usage.cpu_user_pct + (usage.cpu_system_pct or 0.0)
        if self.in_process:
            return self.mean_of("cpu_process_pct")
        return self.mean_of("service_cpu_pct")

    def rss_series(self) -> list[tuple[float, float]]:
        """(t_s, RSS in MiB) of the process tree that runs the target, over the measured
        phase: a started service's when there is one, else optlab's own."""
        name = "rss_bytes" if self.in_process else "service_rss_bytes"
        points = [(s.t_s, getattr(s, name)) for s in self.samples]
        return [(t, v / 2**20) for t, v in points if v is not None]

    def machine_cpu_pct(self) -> float | None:
        """The whole machine, all cores, 0..100."""
        return self.mean_of("cpu_system_pct")

    def gpu_utils(self) -> list[float] | None:
        """Every GPU utilisation reading of the measured phase (the busiest GPU of each
        sample); None when the run had no GPU telemetry."""
        values: list[float] = []
        telemetry = False
        for sample in self.samples:
            if sample.gpus is None:
                continue
            telemetry = True
            utils = [g.util_pct for g in sample.gpus if g.util_pct is not None]
            if utils:
                values.append(max(utils))
        return values if telemetry and values else None

    # -- windows ---------------------------------------------------------------------------

    def window_p99s(self) -> list[float]:
        return [w.p99_ms for w in self.windows if w.p99_ms is not None and w.completed > 0]


def _cores(store: Store, run: RunRecord) -> int | None:
    recorded = run.summary.evidence if run.summary is not None else None
    if recorded is not None and recorded.cores:
        return recorded.cores
    if run.environment_id is None:
        return None
    hardware = store.get_environment(run.environment_id).fingerprint.get("hardware") or {}
    cpu = hardware.get("cpu") or {}
    for key in ("affinity_cores", "logical_cores"):  # the cores the run could use, first
        value = cpu.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _gone(run: RunRecord) -> str | None:
    """Why a RUNNING run is not running any more (its process is gone from this host, or its
    heartbeat went silent elsewhere); None while it may still be running."""
    from optlab.run.runner import STALE_HEARTBEAT_S, process_alive

    if run.hostname == socket.gethostname():
        if not process_alive(run.pid, run.started_at):
            return f"its process (pid {run.pid}) is gone"
        return None
    beat = run.heartbeat_at if run.heartbeat_at.tzinfo else run.heartbeat_at.replace(tzinfo=UTC)
    silent = (datetime.now(UTC) - beat).total_seconds()
    if silent > STALE_HEARTBEAT_S:
        return f"its heartbeat from {run.hostname} has been silent for {silent:.0f} s"
    return None


def _partial(run: RunRecord, gone: str | None) -> str | None:
    if run.status == "RUNNING" and gone is not None:
        return (
            f"the run is marked RUNNING but {gone}: it was abandoned (crashed) and will be "
            "marked CRASHED by the next `optlab run`; only what it measured before is here"
        )
    if run.status == "RUNNING":
        return "the run is still RUNNING: its measurement rows are written when it ends"
    if run.status in ("KILLED", "CRASHED"):
        return f"the run was {run.status}: only what it measured before it stopped is here"
    if run.status == "FAILED":
        return "the run FAILED: " + (run.error_message or "no measurement finished")
    if run.valid is False:
        why = "; ".join(run.reasons[:2]) or "see `optlab log`"
        return f"the run is INVALID ({why}): its figures are not a valid measurement"
    return None


def _no_data(
    run: RunRecord,
    gone: str | None,
    stages: dict[str, StageStatsRow],
    windows: Sequence[WindowStats],
) -> str | None:
    # The run's totals are written when it ends; a run that never ended has its windows.
    finished = (run.requests or 0) + (run.errors or 0)
    total = stages.get("total")
    if finished == 0 and total is not None:
        finished = total.count
    if finished == 0:
        finished = sum(w.completed + w.errors for w in windows)
    if run.status == "RUNNING" and gone is None:
        return None
    if run.status == "FAILED" and not finished:
        return "the run FAILED before any request finished: " + (
            run.error_message or "see `optlab log`"
        )
    if run.status in ("CRASHED", "KILLED", "RUNNING") and not finished:
        state = "abandoned (its process is gone)" if run.status == "RUNNING" else run.status
        return f"the run was {state} before any request of the measured phase finished"
    if run.status in ("FINISHED", "FAILED") and not finished:
        return "no request of the measured phase finished"
    return None


def evidence_of(run: RunRecord, stored: Mapping[str, Any], **rest: Any) -> Evidence:
    """The evidence of `run` with its config as stored (a dict) parsed once, its kind and its
    load's mode found, and `rest` (stages, windows, samples, cores, partial, no_data, fastest)
    as gather reads them. A config that no longer parses makes the evidence partial, its kind
    and load still read where they parse on their own; it never raises."""
    try:
        config = ResolvedConfig.model_validate(stored)
        kind = kind_of(config.target)
    except (ValidationError, ConfigError) as exc:
        first = exc.errors()[0] if isinstance(exc, ValidationError) else None
        where = ".".join(str(p) for p in first["loc"]) if first else ""
        what = f"{where}: {first['msg']}" if first else str(exc)
        why = (
            f"its stored config no longer parses ({what}): the rules that read the target or "
            "the load say what they lack"
        )
        earlier = rest.pop("partial", None)
        found, mode, parsed = _parts(stored)
        return Evidence(
            run=run,
            config=None,
            partial=f"{earlier}; {why}" if earlier else why,
            kind=found,
            mode=mode,
            stored_load=parsed,
            **rest,
        )
    load = config.workload.load
    return Evidence(run=run, config=config, kind=kind, mode=mode_of(load), stored_load=load, **rest)


def _parts(stored: Mapping[str, Any]) -> tuple[TargetKind | None, LoadMode[Any] | None, Any]:
    """The target's kind, the load's mode and its model, each where it parses on its own."""
    target, workload = stored.get("target"), stored.get("workload")
    kind = find_kind(target) if isinstance(target, Mapping) else None
    raw = workload.get("load") if isinstance(workload, Mapping) else None
    mode = MODES.get(raw.get("mode")) if isinstance(raw, Mapping) else None  # type: ignore[arg-type]
    if mode is None:
        return kind, None, None
    try:
        return kind, mode, mode.model.model_validate(raw)
    except ValidationError:
        return kind, mode, None


def gather(store: Store, run_id: int) -> Evidence:
    """The evidence of run `run_id` (NotFoundError when there is no such run)."""
    run = store.get_run(run_id)
    config = store.get_config(run.config_id).config
    rows = store.get_stage_stats(run_id)  # every phase: the warmup's fastest counts too
    stages = {row.stage: row for row in rows if row.phase == MEASURED}
    fastest: dict[str, float] = {}
    for row in rows:
        if row.min_ms is not None and row.count > 0:
            fastest[row.stage] = min(fastest.get(row.stage, row.min_ms), row.min_ms)
    gone = _gone(run) if run.status == "RUNNING" else None
    windows = tuple(store.get_windows(run_id, MEASURED))
    return evidence_of(
        run,
        config,
        stages=stages,
        windows=windows,
        samples=tuple(store.get_resource_samples(run_id, MEASURED)),
        cores=_cores(store, run),
        partial=_partial(run, gone),
        no_data=_no_data(run, gone, stages, windows),
        fastest=fastest,
    )
