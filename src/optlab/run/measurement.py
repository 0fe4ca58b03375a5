"""One measurement: warm up, measure, judge validity, store, under the run lifecycle.

A run row is created RUNNING before the target is built, so a failure anywhere
after that leaves a FAILED row with the error; Ctrl-C or SIGTERM stop the load,
drain what is in flight (bounded), and leave a KILLED row with the partial data.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

from optlab.chain.lineage import Link
from optlab.config.models import OpenLoad, ReplayLoad, ResolvedConfig
from optlab.errors import OptlabError, TargetError
from optlab.metrics.backlog import LoadTimeline
from optlab.metrics.change import percent_change
from optlab.run.protocol import STABILITY_WINDOWS, EffectiveProtocol
from optlab.run.summary import (
    MAX_JSON_DEPTH,
    error_rows,
    json_safe,
    latency_summary,
    resource_rows,
    resource_summary,
    stage_rows,
    window_rows,
)
from optlab.run.validity import RunFacts, Verdict, halves, is_stable, machine_facts, verdict
from optlab.store import RunRecord, Store
from optlab.targets.templates import Secrets

HARNESS_SERIES = ("send_lag", "start_lag")
TICK_S = 0.25
HEARTBEAT_S = 1.0
STORE_RETRY_S = 60.0  # the final write rides out a database restart this long
HOOK_TIMEOUT_S = 60.0  # a target's metrics()/close() after the load, at most
MAX_TARGET_METRICS_BYTES = 1 << 20  # what a target's metrics() may store with a run
FLUSH_S = 5.0  # time series and resource samples reach the database at least this often


class Interrupted(KeyboardInterrupt):
    """SIGTERM, turned into what Ctrl-C raises so both end a run the same way."""


@dataclass(frozen=True)
class RunOptions:
    quick: bool = False
    duration_s: float | None = None
    warmup_s: float | None = None
    chain: bool = False
    repeats: int = 1
    drain_timeout_s: float = 5.0


@dataclass(frozen=True)
class LiveStatus:
    experiment: str
    phase: str
    elapsed_s: float
    planned_s: float
    qps: float | None
    p50_ms: float | None
    p99_ms: float | None
    cpu_pct: float | None
    gpu_pct: float | None
    # The phase's failed requests so far, and how many of them timed out: while every
    # request times out, QPS 0 and no P50 would otherwise be all the live line shows.
    errors: int = 0
    timeouts: int = 0


class Progress(Protocol):
    def update(self, status: LiveStatus) -> None: ...

    def note(self, text: str) -> None: ...


# SIGHUP is what a closed terminal or SSH session sends: by default it kills the process at
# once and the partial run is lost, so it ends a run the way SIGTERM does.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _sigterm_as_interrupt(*, sigint: bool = False) -> Iterator[None]:
    """SIGTERM and SIGHUP raise Interrupted; with `sigint`, Ctrl-C raises KeyboardInterrupt
    again inside a `_shielded()` block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(f"signal {signal.Signals(signum).name}")

    previous = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    if sigint:
        previous[signal.SIGINT] = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)


@contextmanager
def _shielded() -> Iterator[None]:
    """While the partial run is written, a second Ctrl-C must not leave it half-stored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, *STOP_SIGNALS)
    }
    try:
        yield
    finally:
        for signum, handler_before in previous.items():
            signal.signal(signum, handler_before)


class GuardedProgress:
    """A Progress whose output failing never fails the measurement.

    `optlab run X | head -2`, a CI log pipe that closed, or a terminal that went away
    (EIO after SIGHUP) make every later write raise; the measurement goes on silently.
    """

    def __init__(self, inner: Progress) -> None:
        self.inner = inner
        self.broken: OSError | None = None

    def update(self, status: LiveStatus) -> None:
        self._write(self.inner.update, status)

    def note(self, text: str) -> None:
        self._write(self.inner.note, text)

    def _write(self, write: Callable[[Any], None], value: Any) -> None:
        if self.broken is None:
            try:
                write(value)
            except OSError as exc:
                self.broken = exc


class _Heartbeat:
    """Beats for the whole run from its own thread, also while the target builds (a model
    may take minutes to load) or checks its accuracy, so no other optlab takes the run for
    dead. A store that refuses a beat is retried at the next one: the run goes on."""

    def __init__(self, store: Store, run_id: int, every_s: float = HEARTBEAT_S) -> None:
        self._store, self._run_id, self._every_s = store, run_id, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="optlab-heartbeat", daemon=True)
        self.failures = 0

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self._store.heartbeat(self._run_id)
            except Exception:  # an outage: the final write retries; a beat is only a sign
                self.failures += 1


@dataclass(frozen=True)
class _RunEnd:
    """Everything the final write stores: the run's final fields (`Store.finish_run`'s
    keywords) and every one of its measurements."""

    final: dict[str, Any]
    stage_stats: list[Any]
    windows: list[Any]
    samples: list[Any]
    errors: list[Any]


class _Flusher:
    """Writes a run's windows and resource samples every FLUSH_S from its own thread, so a
    live run shows its data and a crash keeps it.

    Never on the measurement's loop: a database that is locked or restarting can make one
    write wait for tens of seconds, and the loop must go on timing the load. A write the
    store refuses is kept and retried at the next flush; the final write stores the whole
    run anyway (`_Measurement._persist`).
    """

    def __init__(
        self, store: Store, run_id: int, progress: Progress, name: str, load: LoadTimeline
    ) -> None:
        self._store, self._run_id, self._progress, self._name = store, run_id, progress, name
        self._load = load
        self._lock = threading.Lock()
        self._windows: list[Any] = []
        self._readings: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="optlab-flush", daemon=True)
        self.failure: str | None = None  # the store's last refusal, while it lasts

    def __enter__(self) -> _Flusher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def offer(self, windows: list[Any], readings: list[Any]) -> None:
        with self._lock:
            self._windows += windows
            self._readings += readings

    def close(self) -> None:
        """Stop flushing; returns once a write under way has ended."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(FLUSH_S):
            self._flush()

    def _flush(self) -> None:
        with self._lock:
            windows, self._windows = self._windows, []
            readings, self._readings = self._readings, []
        try:
            if windows:
                self._store.add_windows(self._run_id, window_rows(windows, self._load))
                windows = []
            if readings:
                self._store.add_resource_samples(self._run_id, resource_rows(readings))
        except Exception as exc:
            with self._lock:  # kept, in order, for the next flush
                self._windows[:0] = windows
                self._readings[:0] = readings
            if self.failure is None:
                self._progress.note(
                    f"{self._name}: the database refused a write ({_first_line(exc)}); the "
                    "measurement goes on and its data is kept until the database is back"
                )
            self.failure = _first_line(exc)
            return
        if self.failure is not None:
            self._progress.note(f"{self._name}: the database is back; pending data written")
            self.failure = None


class _Measurement:
    """One run of one experiment, from RUNNING to a terminal status."""

    def __init__(
        self,
        store: Store,
        link: Link,
        config: ResolvedConfig,
        protocol: EffectiveProtocol,
        run_id: int,
        progress: Progress,
        options: RunOptions,
        parent_run: RunRecord | None,
        paired: dict[str, Any] | None = None,
    ) -> None:
        from optlab.metrics.log import Collector
        from optlab.metrics.resources import ResourceSampler

        self.store, self.link, self.config = store, link, config
        self.protocol, self.run_id, self.progress, self.options = (
            protocol,
            run_id,
            progress,
            options,
        )
        self.parent_run = parent_run
        # `--paired`: {"session", "index", "role"}, stored in the summary so the table can
        # match each step run with the parent run measured just before it.
        self.paired = paired
        self.collector = Collector()
        self.sampler = ResourceSampler()
        self.readings: list[Any] = []
        # What the generator sent and had in flight, tick by tick: each window's offered load.
        self.load = LoadTimeline()
        self.flusher = _Flusher(store, run_id, progress, link.name, self.load)
        self.warmup_s = 0.0
        self.measured_s = 0.0
        self.stabilised: bool | None = None
        self.last_window: Any = None
        self.generator: Any = None
        self.target: Any = None
        self.accuracy: dict[str, Any] | None = None
        self.target_metrics: dict[str, Any] | None = None
        self.service: dict[str, Any] | None = None
        # `${ENV_VAR}` values resolved for this run: every text stored about it is redacted.
        self.secrets = Secrets()
        self.hook_notes: list[str] = []  # values a target returned that JSON cannot hold
        self.snapshot: Any = None  # the run as first stored (optlab.store.bundle.RunBundle)
        self.pending_path: Path | None = None
        self.unstored: str | None = None  # why the run is neither stored nor pending

    # -- the loop -------------------------------------------------------------------------
    def _set_phase(self, phase: str) -> None:
        now = time.perf_counter_ns()
        self.collector.set_phase(phase, now)
        self.load.set_phase(phase, now)
        self._mark_load(now)

    def _mark_load(self, now_ns: int | None = None) -> None:
        generator = self.generator
        if generator is not None:
            now = time.perf_counter_ns() if now_ns is None else now_ns
            self.load.mark(now, generator.issued, generator.in_flight)

    def _tick(self, phase: str, started: float, planned: float) -> float:
        # Never sleep past the planned end: a 5 s measurement should measure 5 s, not 5.2.
        time.sleep(max(0.0, min(TICK_S, planned - (time.monotonic() - started))))
        self.collector.drain()
        self._mark_load()
        if self.generator is not None and self.generator.failure is not None:
            raise RuntimeError(f"a load generator failed: {self.generator.failure!r}")
        if self.target is not None and self.target.check is not None:
            self.target.check()  # a service that died fails the run, with its log tail
        now = time.monotonic()
        windows = self.collector.take_new_windows()
        readings = self.sampler.take()
        self.readings += readings
        self.flusher.offer(windows, readings)
        last = next((w for w in reversed(windows) if w.phase == phase), None)
        if last is not None:
            self.last_window = last
        shown = self.last_window if self.last_window and self.last_window.phase == phase else None
        cpu = next((r.cpu_process_pct for r in reversed(self.readings)), None)
        gpus = self.readings[-1].gpus if self.readings else None
        gpu = gpus[0].util_pct if gpus else None
        self.progress.update(
            LiveStatus(
                self.link.name,
                phase,
                now - started,
                planned,
                shown.qps if shown else None,
                shown.p50_ms if shown else None,
                shown.p99_ms if shown else None,
                cpu,
                gpu,
                errors=self.collector.totals(phase)[1],
                timeouts=self.collector.error_counts(phase).get("timeout", (0, None))[0],
            )
        )
        return now - started

    def _warm_up(self) -> None:
        p = self.protocol
        started = time.monotonic()
        while True:
            elapsed = self._tick("warmup", started, p.warmup_max_s)
            self.warmup_s = elapsed
            if p.warmup == "fixed" and elapsed >= p.warmup_s:
                return
            if p.warmup == "stable" and elapsed >= p.warmup_s and self._stable():
                self.stabilised = True
                return
            if elapsed >= p.warmup_max_s:
                self.stabilised = False if p.warmup == "stable" else None
                return

    def _stable(self) -> bool:
        per_group = int(self.protocol.stability_window_s)
        windows = self.collector.windows("warmup")
        usable = len(windows) // per_group * per_group
        start = len(windows) - usable
        groups = [windows[i : i + per_group] for i in range(start, len(windows), per_group)]
        qps = [sum(w.qps for w in g) / len(g) for g in groups]
        p50s = [[w.p50_ms for w in g if w.p50_ms is not None] for g in groups]
        p50 = [sum(v) / len(v) if v else None for v in p50s]
        return is_stable(qps, p50, STABILITY_WINDOWS, self.protocol.stability_tolerance)

    def _measure(self) -> None:
        if self.target is not None and self.target.reset_metrics is not None:
            self.target.reset_metrics()  # the target's own counters cover the measured phase
        started = time.monotonic()
        self._set_phase("measure")
        self.sampler.set_phase("measure")
        try:
            while self.measured_s < self.protocol.duration_s:
                self.measured_s = self._tick("measure", started, self.protocol.duration_s)
        finally:
            self.measured_s = time.monotonic() - started
            self._set_phase("drain")
            self.sampler.set_phase("drain")

    def execute(self, paths: list[Path]) -> tuple[str, Verdict, dict[str, Any]]:
        # What the run row holds now (the database has just accepted it), so a run whose
        # final write the database refuses can still be saved whole as a pending bundle.
        self.snapshot = self.store.export_run(self.run_id)
        with _Heartbeat(self.store, self.run_id), self.flusher:
            return self._execute(paths)

    def _execute(self, paths: list[Path]) -> tuple[str, Verdict, dict[str, Any]]:
        from optlab.run.select import generator_for
        from optlab.targets.base import load_target

        status, error, interrupted, report = "FINISHED", None, False, None
        target = None
        generator = None
        try:
            with _sigterm_as_interrupt():
                target = self.target = load_target(self.config, paths, self.secrets)
                if target.accuracy is not None:
                    # Before the load, not during it: it would steal the engine's cores.
                    self.progress.note(f"{self.link.name}: checking held-out accuracy")
                    self.accuracy = _checked_accuracy(
                        json_safe(target.accuracy(), "accuracy", self.hook_notes)
                    )
                generator = generator_for(target, self.config.workload, paths[0])
                self._set_phase("warmup")
                self.sampler.set_phase("warmup")
                if target.service_pid is not None:
                    self.sampler.track_service(target.service_pid)
                self.sampler.start()
                self.generator = generator
                generator.start(self.collector)
                self._warm_up()
                self._measure()
        except KeyboardInterrupt as exc:
            status, interrupted = "KILLED", True
            error = f"interrupted ({exc or 'Ctrl-C'}) after {self.measured_s:.1f} s measured"
        except BaseException as exc:  # SystemExit from user code too: stored, not lost
            status = "FAILED"
            error = _failure_text(exc)
        with _shielded():  # bounded: the drain has its timeout, the rest is in memory
            if generator is not None:
                report = generator.stop(self.options.drain_timeout_s)
                if report.failure is not None and status == "FINISHED":
                    # A worker died of something other than a target error: numbers are partial.
                    status = "FAILED"
                    error = f"a load generator failed: {report.failure!r}"
            self.collector.finish()
            self.sampler.stop()
            self.readings += self.sampler.take()
        # The target's own hooks, each with a time limit and open to Ctrl-C/SIGTERM: a close()
        # that hangs must not hold the measured run hostage, nor make optlab deaf to signals.
        with _sigterm_as_interrupt():
            if target is not None:
                if target.metrics is not None:
                    metrics = self._hook("metrics()", target.metrics)
                    self.target_metrics = _capped(
                        json_safe(metrics, "target", self.hook_notes), "target", self.hook_notes
                    )
                self._hook("close()", target.close)
                if target.service_info is not None:
                    self.service = json_safe(
                        self._hook("service info", target.service_info),
                        "service",
                        self.hook_notes,
                    )
            # The final write stores every window and sample; a flush still under way must
            # end first, or its rows would land after (and beside) the final ones.
            try:
                self.flusher.close()
            except KeyboardInterrupt:
                self.hook_notes.append("interrupted while a flush was under way")
        with _shielded():  # the verdict and summary are quick; only the retries take Ctrl-C
            return self._store(status, error, interrupted, report)

    def _hook(self, what: str, call: Callable[[], Any]) -> Any:
        """Call a target hook after the load, in a thread of its own, for at most
        HOOK_TIMEOUT_S: whatever it raises (even SystemExit or KeyboardInterrupt), a hang,
        or a Ctrl-C while it runs is noted, and the run is stored all the same."""
        outcome: dict[str, Any] = {}

        def body() -> None:
            try:
                outcome["value"] = call()
            except BaseException as exc:  # noted below, never lost with the run
                outcome["error"] = exc

        thread = threading.Thread(target=body, name="optlab-target-hook", daemon=True)
        thread.start()
        try:
            thread.join(HOOK_TIMEOUT_S)
        except KeyboardInterrupt:
            return self._hook_note(f"target {what} was interrupted; the run is stored without it")
        if thread.is_alive():
            return self._hook_note(
                f"target {what} did not return within {HOOK_TIMEOUT_S:g} s; the run is stored "
                "without it"
            )
        exc = outcome.get("error")
        if exc is not None:
            return self._hook_note(f"target {what} raised {type(exc).__name__}: {exc}")
        return outcome.get("value")

    def _hook_note(self, text: str) -> None:
        text = self.secrets.redact(text)
        self.hook_notes.append(text)  # stored with the run, not only printed
        self.progress.note(f"{self.link.name}: {text}")

    def _store(
        self, status: str, error: str | None, interrupted: bool, report: Any
    ) -> tuple[str, Verdict, dict[str, Any]]:
        c = self.collector
        stages_stored = [
            row for phase in ("warmup", "measure") for row in stage_rows(phase, c.histograms(phase))
        ]
        redact = self.secrets.redact
        if error is not None:
            error = redact(error)
        errors = {
            redact(kind): (count, None if example is None else redact(example))
            for kind, (count, example) in c.error_counts("measure").items()
        }
        ok, failed = c.totals("measure")
        histograms = c.histograms("measure")
        stages = {k: v for k, v in histograms.items() if k not in HARNESS_SERIES}
        harness = {k: v for k, v in histograms.items() if k in HARNESS_SERIES}
        total = stages.get("total")
        total_s = total.summary_ms() if total is not None else {}
        lag = harness.get("send_lag")
        start = harness.get("start_lag")
        lag_s = lag.summary_ms() if lag is not None and lag.count else {}
        start_s = start.summary_ms() if start is not None and start.count else {}
        measured = max(self.measured_s, 1e-9)
        first, second = halves([w.qps for w in c.windows("measure")])
        load = self.config.workload.load
        open_loop = isinstance(load, OpenLoad | ReplayLoad)
        facts = RunFacts(
            requested_s=self.protocol.duration_s,
            measured_s=self.measured_s,
            completed=ok,
            errors=failed,
            max_error_rate=self.protocol.max_error_rate,
            send_lag_p99_ms=_num(lag_s.get("p99")) if open_loop else None,
            max_send_lag_p99_ms=self.protocol.max_send_lag_p99_ms,
            start_lag_p99_ms=_num(start_s.get("p99")),
            total_p50_ms=_num(total_s.get("p50")),
            first_half_qps=first,
            second_half_qps=second,
            stability_tolerance=self.protocol.stability_tolerance,
            throttled=self.sampler.thermal_throttling_seen(),
            interrupted=interrupted,
            open_loop=open_loop,
            accuracy_drop_pts=_num((self.accuracy or {}).get("drop_pts")),
            max_accuracy_drop_pts=self.config.slo.max_accuracy_drop_pts,
            stuck_clients=0 if open_loop or report is None else report.abandoned,
            clients=None if open_loop else getattr(load, "concurrency", None),
            **self._load_facts(ok + failed, measured),
        )
        judged = verdict(facts)
        notes = [redact(note) for note in [*judged.notes, *self.hook_notes]]
        if self.stabilised is False:
            notes.append(
                f"warmup did not stabilise within {self.protocol.warmup_max_s:g} s; measured anyway"
            )
        if report is not None and report.abandoned:
            notes.append(f"{report.abandoned} requests were still in flight after the drain")
        valid = judged.valid if status == "FINISHED" else False
        reasons = list(judged.reasons)
        if status == "FAILED":
            reasons.insert(0, "the run failed: " + (error or "").splitlines()[0])
        qps = ok / measured if self.measured_s > 0 else None
        summary: dict[str, Any] = {
            "run_id": self.run_id,
            "experiment": self.link.name,
            "status": status,
            "valid": valid,
            "provisional": self.protocol.provisional,
            "reasons": reasons,
            "notes": notes,
            "protocol": self.protocol.name,
            "load": load.mode,
            "requests": ok,
            "errors": failed,
            "errors_by_type": {k: v[0] for k, v in errors.items()},
            "qps": qps,
            "warmup_s": round(self.warmup_s, 3),
            "duration_s": round(self.measured_s, 3),
            "latency_ms": latency_summary(stages),
            "harness_ms": latency_summary(harness),
            "resources": resource_summary(self.readings, self.sampler.peak_rss_bytes()),
            "who": _who(),
        }
        if self.accuracy is not None:
            summary["accuracy"] = self.accuracy
        if self.target_metrics is not None:
            summary["target"] = self.secrets.redact_any(self.target_metrics)
        if self.service is not None:
            summary["service"] = self.service
        if self.paired is not None:
            summary["paired"] = dict(self.paired)
        if self.parent_run is not None:
            summary["parent"] = step_against(self.parent_run, summary, self.link.plan)
        # A last net: nothing that strict JSON rejects reaches the store or `run --json`.
        late_notes: list[str] = []
        # (deeper than the hooks' own pass, which already cut what a target nested too deep)
        summary = json_safe(summary, "summary", late_notes, max_depth=MAX_JSON_DEPTH + 4)
        summary["notes"] += late_notes
        final = {
            "status": status,
            "valid": valid,
            "reasons": reasons,
            "requests": ok,
            "errors": failed,
            "qps": qps,
            "summary": summary,
            "warmup_s": self.warmup_s,
            "duration_s": self.measured_s,
            "error_message": error,
        }
        self.pending_path = self._persist(final, stages_stored, error_rows(errors))
        return status, judged, summary

    def _load_facts(self, answered: int, measured_s: float) -> dict[str, Any]:
        """What the verdict needs to say who set the pace and what else used the machine."""
        from optlab.load.generator import in_flight_limit

        load = self.config.workload.load
        start = self.load.phase_start("measure")
        end = self.load.phase_start("drain")
        in_flight: tuple[int | None, ...] = (None, None, None)
        if start is not None and end is not None:
            in_flight = self.load.in_flight_over(start, end)
        return {
            "intended_qps": load.rate if isinstance(load, OpenLoad) else None,
            "completed_qps": answered / measured_s if measured_s > 0 else None,
            "in_flight_start": in_flight[0],
            "in_flight_end": in_flight[1],
            "in_flight_max": in_flight[2],
            "in_flight_limit": in_flight_limit(load) * load.processes,
            "in_process": self.config.target.kind in ("builtin", "python"),
            "load": machine_facts(
                [r for r in self.readings if r.phase == "measure"],
                self.sampler.neighbours(),
                self._concurrent_runs(),
            ),
        }

    def _concurrent_runs(self) -> list[str]:
        """Other optlab runs on this host whose measurement overlapped this one's."""
        try:
            others = self.store.overlapping_runs(self.run_id)
        except Exception:  # the store is down: the verdict goes on without this fact
            return []
        return [f"run {run.id} {run.experiment}" for run in others]

    def _persist(self, final: dict[str, Any], stages: list[Any], errors: list[Any]) -> Path | None:
        """Store the run in one transaction, retrying through an outage; if the database
        still refuses, save the whole run as a pending bundle (returned) that the next
        optlab command opening this database stores. Never loses the measurement."""
        # The whole run, not only what the 5 s flushes left pending: the store replaces the
        # run's measurements in the same transaction, so a retry after a failed attempt
        # (or after flushes a restart may have lost) stores exactly this.
        windows = window_rows(
            [*self.collector.windows("warmup"), *self.collector.windows("measure")], self.load
        )
        end = _RunEnd(final, stages, windows, resource_rows(self.readings), errors)
        failure = self._write_final(end)
        if failure is None:
            return None
        with _shielded():  # the pending bundle is the run's last copy: write it whole
            return self._save_pending(end, failure)

    def _write_final(self, end: _RunEnd) -> BaseException | None:
        """The final write, retried through an outage; None once stored, else why not.
        Ctrl-C or SIGTERM while it retries stops the retries (the run is then kept as a
        pending bundle at once)."""
        deadline = time.monotonic() + store_retry_s()
        delay, told = 0.5, False
        with _sigterm_as_interrupt(sigint=True):
            while True:
                try:
                    self.store.complete_run(
                        self.run_id,
                        stage_stats=end.stage_stats,
                        windows=end.windows,
                        samples=end.samples,
                        run_errors=end.errors,
                        **end.final,
                    )
                    return None
                except KeyboardInterrupt as exc:
                    self.progress.note(f"{self.link.name}: interrupted while storing the run")
                    return exc
                except Exception as exc:
                    if not retryable(exc) or time.monotonic() + delay > deadline:
                        return exc
                    if not told:
                        told = True
                        self.progress.note(
                            f"{self.link.name}: the database refused the run's final write "
                            f"({_first_line(exc)}); retrying for up to "
                            f"{max(deadline - time.monotonic(), 0):.0f} s (Ctrl-C keeps the "
                            "run on disk at once)"
                        )
                try:
                    time.sleep(delay)
                except KeyboardInterrupt as interrupt:
                    return interrupt
                delay = min(delay * 2, 5.0)

    def _save_pending(self, end: _RunEnd, failure: BaseException) -> Path | None:
        from optlab.store.pending import PENDING_DIR, save_pending

        bundle = self.snapshot.completed(
            final=end.final,
            stage_stats=end.stage_stats,
            windows=end.windows,
            samples=end.samples,
            errors=end.errors,
        )
        try:
            path = save_pending(bundle, self.store.url)
        except OptlabError as exc:
            # Nowhere to keep it: say so, and let the summary (printed next) be what is left.
            self.unstored = (
                f"run {self.run_id} was measured but neither the database "
                f"({_first_line(failure)}) nor any folder would keep it: {exc.message}"
            )
            self.progress.note(f"{self.link.name}: {self.unstored}")
            return None
        here = path.parent == Path.cwd() / PENDING_DIR
        self.progress.note(
            f"{self.link.name}: run {self.run_id} was measured but the database refused it "
            f"({_first_line(failure)}); saved whole in {path}. The next optlab command that "
            f"opens {self.store.url}{' from this folder' if here else ''} stores it (or run "
            f"`optlab import {path}`)"
        )
        return path


def _who() -> str:
    """user@host of whoever ran the measurement, for the audit."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _checked_accuracy(report: Any) -> dict[str, Any]:
    top1 = report.get("top1") if isinstance(report, dict) else None
    if not isinstance(top1, int | float) or isinstance(top1, bool):
        raise TargetError(
            f"the target's accuracy() returned {report!r}",
            hint="return a dict with `top1` (a fraction) and optionally `drop_pts` (points lost "
            "against a reference), `n` and `agreement`",
        )
    checked: dict[str, Any] = report
    return checked


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def step_against(parent: RunRecord, summary: dict[str, Any], plan: Any) -> dict[str, Any]:
    """This run's change against the parent run it was checked against (relative, in %)."""
    before = (parent.summary or {}).get("latency_ms", {}).get("total", {})
    after = summary.get("latency_ms", {}).get("total", {})

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


def _capped(value: Any, where: str, notes: list[str]) -> Any:
    """A JSON value no bigger than MAX_TARGET_METRICS_BYTES: a target that returns 50 MB from
    metrics() would make every later `optlab log` and table read it."""
    import json

    size = len(json.dumps(value, default=str))
    if size <= MAX_TARGET_METRICS_BYTES:
        return value
    notes.append(
        f"{where} was {size / 2**20:.1f} MiB of JSON, over the "
        f"{MAX_TARGET_METRICS_BYTES / 2**20:g} MiB limit: only its keys are stored"
    )
    return {"keys": sorted(map(str, value))[:100]} if isinstance(value, dict) else None


def store_retry_s() -> float:
    """How long the final write retries through a store outage before saving a pending
    bundle: OPTLAB_STORE_RETRY_S, default 60 s."""
    raw = os.environ.get("OPTLAB_STORE_RETRY_S")
    try:
        return max(0.0, float(raw)) if raw else STORE_RETRY_S
    except ValueError:
        return STORE_RETRY_S


def retryable(exc: BaseException) -> bool:
    """A store failure that may pass: a server restarting, a lock, a full disk."""
    from sqlalchemy.exc import OperationalError

    from optlab.errors import StoreUnavailable

    return isinstance(exc, StoreUnavailable | OperationalError)


def _first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _failure_text(exc: BaseException) -> str:
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
