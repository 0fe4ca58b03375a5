"""One measurement: warm up, measure, judge validity, store, under the run lifecycle.

A run row is created RUNNING before the target is built, so a failure anywhere after that
leaves a FAILED row with the error; Ctrl-C, SIGTERM or SIGHUP stop the load, drain what is in
flight (bounded), and leave a KILLED row with the partial data.

Three parts, composed here: the phase loop and its signals (`optlab.run.phases`, with the
target's hooks in `optlab.run.hooks`), the recorder that flushes and writes
(`optlab.run.recorder`), and the pure verdict and summary (`optlab.run.summarize`).
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optlab.chain.lineage import Link
from optlab.config.models import ResolvedConfig
from optlab.config.modes import mode_of
from optlab.config.protocol import EffectiveProtocol
from optlab.errors import OptlabError
from optlab.load.base import LoadGenerator, StopReport
from optlab.load.hosts import RayLoadGenerator
from optlab.metrics.backlog import LoadTimeline
from optlab.metrics.server_metrics import summarize as summarize_server
from optlab.run.evidence import Observed
from optlab.run.hooks import TargetHooks
from optlab.run.phases import Interrupted, PhaseLoop, shielded, stop_signals
from optlab.run.progress import GuardedProgress, LiveStatus, Progress
from optlab.run.recorder import Recorder, RunEnd, retryable, store_retry_s
from optlab.run.select import generator_for
from optlab.run.server_poll import server_notes
from optlab.run.summarize import Collected, Summarized, step_against, summarize, who
from optlab.run.summary import error_rows, resource_rows, stage_rows, window_rows
from optlab.run.validity import Verdict, machine_facts, plainly_saturated
from optlab.store import RunRecord, RunSummary, Store
from optlab.targets.base import LoadedTarget
from optlab.targets.registry import kind_of, load_target
from optlab.targets.templates import Secrets

# Callers import these from here: the live output, the signal, the store's retry rule, a
# step's change against its parent.
__all__ = [
    "GuardedProgress",
    "Interrupted",
    "LiveStatus",
    "Measured",
    "Progress",
    "RunOptions",
    "measure",
    "retryable",
    "step_against",
    "store_retry_s",
]


@dataclass(frozen=True)
class RunOptions:
    quick: bool = False
    duration_s: float | None = None
    warmup_s: float | None = None
    chain: bool = False
    repeats: int = 1
    drain_timeout_s: float = 5.0
    # A sweep's open-loop level ends early once it is plainly saturated (validity.py).
    stop_when_saturated: bool = False
    # `optlab run --profile`: py-spy samples the target's process over the measured phase.
    profile: bool = False
    # The latency bound the load generator's send lag is weighed against (a sweep's SLO);
    # unset, the config's slo (p99_ms, else the tightest other percentile's bound).
    slo_ms: float | None = None
    # A quick run's cap while it measures until its P99's queries (unset: the protocol's).
    max_duration_s: float | None = None


@dataclass(frozen=True)
class Measured:
    """One measured run as it ended."""

    status: str  # FINISHED, KILLED or FAILED
    verdict: Verdict  # the validity rules on what was measured
    summary: RunSummary  # `run --json`'s object (`to_json()`), as stored
    warmup_s: float
    stabilised: bool | None  # a "stable" warmup: whether it stabilised
    pending: Path | None  # the bundle that keeps a run the database refused
    unstored: str | None  # why the run is neither stored nor pending


# Samples from other hosts (`workload.load.hosts`) arrive a take and a round trip after they
# ended: a window waits this long (not 0.25 s) for them before it closes.
REMOTE_GRACE_S = 1.0


@dataclass
class _Outcome:
    """How the load ended: what the stored run's status and error will say."""

    status: str = "FINISHED"
    error: str | None = None
    interrupted: bool = False
    report: StopReport | None = None
    generator: LoadGenerator | None = None


def measure(
    store: Store,
    link: Link,
    config: ResolvedConfig,
    protocol: EffectiveProtocol,
    run_id: int,
    progress: Progress,
    options: RunOptions,
    paths: list[Path],
    *,
    parent_run: RunRecord | None = None,
    paired: Mapping[str, Any] | None = None,
) -> Measured:
    """Measure the RUNNING run `run_id` of `link` and store it (or keep it pending).

    `paired` (`--paired`: {"session", "index", "role"}) is stored in the summary so the table
    can match each step run with the parent run measured just before it.
    """
    run = _Run(store, link, config, protocol, run_id, progress, options)
    return run.execute(paths, parent_run, paired)


class _Run:
    """The phase loop, the target's hooks and the recorder of one run, wired together."""

    def __init__(
        self,
        store: Store,
        link: Link,
        config: ResolvedConfig,
        protocol: EffectiveProtocol,
        run_id: int,
        progress: Progress,
        options: RunOptions,
    ) -> None:
        self.link, self.config, self.protocol, self.run_id = link, config, protocol, run_id
        self.options = options
        timeline = LoadTimeline()
        self.recorder = Recorder(store, run_id, link.name, progress, timeline)
        load = config.workload.load
        mode = mode_of(load)
        self.loop = PhaseLoop(
            link.name,
            protocol,
            progress,
            timeline,
            self.recorder.offer,
            min_warmup_s=mode.min_warmup_s(load),
            close_grace_s=REMOTE_GRACE_S if load.hosts is not None else 0.25,
        )
        # `${ENV_VAR}` values resolved for this run: every text stored about it is redacted.
        self.secrets = Secrets()
        self.hooks = TargetHooks(link.name, self.secrets, progress)
        self.loop.profile = options.profile
        offered = mode.offered_qps(load)
        if options.stop_when_saturated and offered is not None:
            rate, limit = offered, mode.in_flight_limit(load)
            self.loop.early_stop = lambda: plainly_saturated(self._in_flight_now(), rate, limit)

    def execute(
        self, paths: list[Path], parent: RunRecord | None, paired: Mapping[str, Any] | None
    ) -> Measured:
        with self.recorder.recording():
            target, outcome = self._load(paths)
            # The target's own hooks, each with a time limit and open to Ctrl-C/SIGTERM: a
            # close() that hangs must not hold the measured run hostage, nor make optlab deaf
            # to signals.
            with stop_signals():
                if target is not None:
                    self.hooks.after_load(target)
                try:
                    self.recorder.stop_flushing()
                except KeyboardInterrupt:
                    self.hooks.notes.append("interrupted while a flush was under way")
            with shielded():  # the verdict and summary are quick; only the retries take Ctrl-C
                done = summarize(self._collected(outcome, parent, paired))
                self.recorder.store(self._end(done))
        loop = self.loop
        return Measured(
            outcome.status,
            done.verdict,
            done.summary,
            loop.warmup_s,
            loop.stabilised,
            self.recorder.pending,
            self.recorder.unstored,
        )

    def _load(self, paths: list[Path]) -> tuple[LoadedTarget | None, _Outcome]:
        """Build the target, run the phases and stop the load, however that ends."""
        outcome = _Outcome()
        target: LoadedTarget | None = None
        generator: LoadGenerator | None = None
        try:
            with stop_signals():
                target = load_target(self.config, paths, self.secrets)
                self.hooks.check_accuracy(target)
                generator = outcome.generator = generator_for(
                    target, self.config.workload, paths[0]
                )
                self.loop.start(target, generator)
                self.loop.run()
        except KeyboardInterrupt as exc:
            outcome.status, outcome.interrupted = "KILLED", True
            outcome.error = (
                f"interrupted ({exc or 'Ctrl-C'}) after {self.loop.measured_s:.1f} s measured"
            )
        except BaseException as exc:  # SystemExit from user code too: stored, not lost
            outcome.status, outcome.error = "FAILED", failure_text(exc)
        with shielded():  # bounded: the drain has its timeout, the rest is in memory
            report = outcome.report = self.loop.stop(generator, self.options.drain_timeout_s)
            if report is not None and report.failure is not None and outcome.status == "FINISHED":
                # A worker died of something other than a target error: numbers are partial.
                outcome.status = "FAILED"
                outcome.error = f"a load generator failed: {report.failure!r}"
        return target, outcome

    def _collected(
        self, outcome: _Outcome, parent: RunRecord | None, paired: Mapping[str, Any] | None
    ) -> Collected:
        loop, collector, hooks = self.loop, self.loop.collector, self.hooks
        completed, failed = collector.totals("measure")
        return Collected(
            run_id=self.run_id,
            experiment=self.link.name,
            status=outcome.status,
            protocol=self.protocol,
            load=self.config.workload.load,
            histograms=collector.histograms("measure"),
            completed=completed,
            failed=failed,
            measured_s=loop.measured_s,
            warmup_s=loop.warmup_s,
            window_qps=[w.qps for w in collector.windows("measure")],
            errors=collector.error_counts("measure"),
            error=outcome.error,
            interrupted=outcome.interrupted,
            stopped_early=loop.stopped_early,
            stabilised=loop.stabilised,
            abandoned=outcome.report.abandoned if outcome.report is not None else 0,
            readings=loop.readings,
            peak_rss_bytes=loop.sampler.peak_rss_bytes(),
            throttled=loop.sampler.thermal_throttling_seen(),
            machine=machine_facts(
                [r for r in loop.readings if r.phase == "measure"],
                loop.sampler.neighbours(),
                self.recorder.concurrent_runs(),
                loop.sampler.neighbour_halves(),
            ),
            in_flight=self._in_flight(),
            in_process=kind_of(self.config.target).in_process,
            accuracy=hooks.accuracy,
            max_accuracy_drop_pts=self.config.slo.max_accuracy_drop_pts,
            target_metrics=hooks.metrics,
            service=hooks.service,
            hook_notes=[
                *hooks.notes,
                *([loop.profile_note] if loop.profile_note else []),
                *server_notes(loop.server_poll),
            ],
            paired=paired,
            parent=parent,
            plan=self.link.plan,
            who=who(),
            secrets=self.secrets,
            observed=self._observed(),
            slo_ms=self.options.slo_ms if self.options.slo_ms is not None else _slo_ms(self.config),
            timeout_ms=self.config.workload.timeout_ms,
            llm=collector.llm_tally("measure"),
            server=summarize_server(loop.server_poll.samples) if loop.server_poll else None,
            goodput_ms=(self.config.slo.ttft_ms, self.config.slo.tpot_ms),
            hosts=(
                outcome.generator.reports()
                if isinstance(outcome.generator, RayLoadGenerator)
                else ()
            ),
            host_tallies=collector.source_tallies("measure"),
            measure_start_ns=loop.load.phase_start("measure"),
        )

    def _observed(self) -> Observed:
        """What the evidence section is made of, over the measured phase."""
        loop, timeline = self.loop, self.loop.load
        sampler, windows = loop.sampler, loop.collector.windows("measure")
        start_ns = timeline.phase_start("measure")
        measure_start_s = None
        if start_ns is not None and sampler.started_ns is not None:
            measure_start_s = (start_ns - sampler.started_ns) / 1e9
        target = loop.target
        return Observed(
            cores=_cores(),
            process=sampler.usage("process"),
            service=sampler.usage("service"),
            neighbours=sampler.neighbours(),
            started_service=target is not None and target.service_pid is not None,
            gc_pauses_ns=loop.gc.pauses_ns() if start_ns is not None else None,
            windows=windows,
            window_s=loop.collector.window_s,
            window_in_flight=[timeline.window(w.phase, w.t_s, w.span_s)[1] for w in windows],
            measure_start_s=measure_start_s,
            tree_rss=sampler.tree_rss(),
            profile=loop.profiled,
            batch_wait_stage=kind_of(self.config.target).batch_wait_stage,
            batch_figures=kind_of(self.config.target).batch_figures,
        )

    def _in_flight_now(self) -> list[int]:
        """The measured phase's in-flight count once a second, so far."""
        start = self.loop.load.phase_start("measure")
        return [] if start is None else self.loop.load.in_flight_every(start, 1_000_000_000)

    def _in_flight(self) -> tuple[int | None, ...]:
        """Requests in flight over the measured phase: at its start, at its end, at most."""
        timeline = self.loop.load
        start, end = timeline.phase_start("measure"), timeline.phase_start("drain")
        if start is None or end is None:
            return (None, None, None)
        return timeline.in_flight_over(start, end)

    def _end(self, done: Summarized) -> RunEnd:
        """The whole run as the final write stores it."""
        collector, loop = self.loop.collector, self.loop
        phases = ("warmup", "measure")
        return RunEnd(
            done.final,
            [row for phase in phases for row in stage_rows(phase, collector.histograms(phase))],
            window_rows([w for phase in phases for w in collector.windows(phase)], loop.load),
            resource_rows(loop.readings),
            error_rows(done.errors),
        )


def _slo_ms(config: ResolvedConfig) -> float | None:
    """The config's latency bound at P99, else at the nearest percentile it gives."""
    slo = config.slo
    return next(
        (v for v in (slo.p99_ms, slo.p999_ms, slo.p95_ms, slo.p50_ms) if v is not None), None
    )


def _cores() -> int | None:
    """The CPUs this process may run on (its affinity, which a container or taskset narrows)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count()


def failure_text(exc: BaseException) -> str:
    """What a failed run stores as its error: the user's message, or the exception and
    the last frames of its traceback."""
    if isinstance(exc, OptlabError):
        return f"{exc.message}\nhint: {exc.hint}" if exc.hint else exc.message
    if isinstance(exc, SystemExit):
        return (
            f"the target called sys.exit({exc.code!r}) (SystemExit); optlab stored the run "
            "as FAILED instead of exiting\n" + "".join(traceback.format_tb(exc.__traceback__)[-3:])
        )
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return text + "\n" + "".join(traceback.format_tb(exc.__traceback__)[-3:])
