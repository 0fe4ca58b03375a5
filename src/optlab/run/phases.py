"""The phase loop of one measurement: warm up, measure, stop; and the signals that end it.

Every tick drains the collector, notes what the generator had sent and had in flight, checks
that the load generator and a started service are alive, hands the new windows and resource
readings to the recorder, and shows the live status. Ctrl-C, SIGTERM and SIGHUP end a run the
same way: the load stops, what is in flight drains (bounded), and the partial run is stored.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from optlab.config.protocol import STABILITY_WINDOWS, EffectiveProtocol
from optlab.load.base import LoadGenerator, StopReport
from optlab.metrics.backlog import LoadTimeline
from optlab.metrics.gcpause import GcPauses
from optlab.metrics.log import Collector, Window
from optlab.metrics.profile import Profile, Profiler, ProfilerError
from optlab.metrics.resources import ResourceReading, ResourceSampler
from optlab.run.progress import LiveStatus, Progress
from optlab.run.server_poll import ServerPoller
from optlab.run.validity import is_stable
from optlab.targets.base import LoadedTarget

__all__ = ["STOP_SIGNALS", "Interrupted", "PhaseLoop", "shielded", "stop_signals"]

TICK_S = 0.25

# SIGHUP is what a closed terminal or SSH session sends: by default it kills the process at
# once and the partial run is lost, so it ends a run the way SIGTERM does.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)

Offer = Callable[[Sequence[Window], Sequence[ResourceReading]], None]

# py-spy stops by itself this long after the measured phase should have ended: the cap that
# holds when optlab itself is killed outright and cannot stop it.
PROFILE_SLACK_S = 60.0


class Interrupted(KeyboardInterrupt):
    """SIGTERM, turned into what Ctrl-C raises so both end a run the same way."""


@contextmanager
def stop_signals(*, sigint: bool = False) -> Iterator[None]:
    """SIGTERM and SIGHUP raise Interrupted; with `sigint`, Ctrl-C raises KeyboardInterrupt
    again inside a `shielded()` block."""
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
def shielded() -> Iterator[None]:
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


class PhaseLoop:
    """Warmup (fixed, or until stable), the measured phase, then the drain.

    After the loop, `warmup_s`, `measured_s` and `stabilised` say how it went, `collector`
    holds every request, `readings` every resource sample, `load` what was offered and `gc`
    the garbage collector's pauses while it was measured.
    """

    def __init__(
        self,
        name: str,
        protocol: EffectiveProtocol,
        progress: Progress,
        load: LoadTimeline,
        offer: Offer,
        *,
        min_warmup_s: float = 0.0,
        close_grace_s: float = 0.25,
    ) -> None:
        self.name, self.protocol, self.progress = name, protocol, progress
        # The load's own shortest warm-up (`LoadMode.min_warmup_s`): a load that reaches its
        # rate only after a while is measured from then on, whatever the protocol asks.
        self.min_warmup_s = min_warmup_s
        self.collector = Collector(close_grace_s=close_grace_s)
        self.sampler = ResourceSampler()
        self.gc = GcPauses()  # the measured phase's garbage-collector pauses in this process
        self.readings: list[ResourceReading] = []
        # What the generator sent and had in flight, tick by tick: each window's offered load.
        self.load = load
        self._offer = offer
        self.warmup_s = 0.0
        self.measured_s = 0.0
        self.stabilised: bool | None = None
        self.target: LoadedTarget | None = None
        self.generator: LoadGenerator | None = None
        self._last_window: Window | None = None
        # Asked every tick of the measured phase: a reason to stop now, or None.
        self.early_stop: Callable[[], str | None] | None = None
        self.stopped_early: str | None = None
        # `optlab run --profile`: py-spy samples the target's process over the measured phase.
        self.profile = False
        self.profiled: Profile | None = None
        self.server_poll: ServerPoller | None = None  # the engine's metrics, when it has them
        self.profile_note: str | None = None  # why there is no profile, when one was asked for

    def start(self, target: LoadedTarget, generator: LoadGenerator) -> None:
        """Enter the warmup and start the load."""
        self.target = target
        self.set_phase("warmup")
        self.sampler.set_phase("warmup")
        if target.service_pid is not None:
            self.sampler.track_service(target.service_pid)
        self.sampler.start()
        self.generator = generator
        generator.start(self.collector)

    def run(self) -> None:
        """Warm up, then measure; returns when the measured phase has ended (the drain
        phase has begun), also when it is interrupted."""
        self._warm_up()
        self._measure()

    def stop(self, generator: LoadGenerator | None, drain_timeout_s: float) -> StopReport | None:
        """Stop the load and drain it (bounded), close the collector and the sampler."""
        report = generator.stop(drain_timeout_s) if generator is not None else None
        self.collector.finish()
        self.sampler.stop()
        self.readings += self.sampler.take()
        return report

    def set_phase(self, phase: str) -> None:
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
        self._offer(windows, readings)
        last = next((w for w in reversed(windows) if w.phase == phase), None)
        if last is not None:
            self._last_window = last
        self.progress.update(self._status(phase, now - started, planned))
        return now - started

    def _status(self, phase: str, elapsed_s: float, planned_s: float) -> LiveStatus:
        last = self._last_window
        shown = last if last and last.phase == phase else None
        cpu = next((r.cpu_process_pct for r in reversed(self.readings)), None)
        gpus = self.readings[-1].gpus if self.readings else None
        gpu = gpus[0].util_pct if gpus else None
        return LiveStatus(
            self.name,
            phase,
            elapsed_s,
            planned_s,
            shown.qps if shown else None,
            shown.p50_ms if shown else None,
            shown.p99_ms if shown else None,
            cpu,
            gpu,
            errors=self.collector.totals(phase)[1],
            timeouts=self.collector.error_counts(phase).get("timeout", (0, None))[0],
        )

    def _warm_up(self) -> None:
        p = self.protocol
        # The protocol's bounds, raised to the load's own minimum (none for most modes).
        least = max(p.warmup_s, self.min_warmup_s)
        most = max(p.warmup_max_s, self.min_warmup_s)
        started = time.monotonic()
        while True:
            elapsed = self._tick("warmup", started, most)
            self.warmup_s = elapsed
            if p.warmup == "fixed" and elapsed >= least:
                return
            if p.warmup == "stable" and elapsed >= least and self._stable():
                self.stabilised = True
                return
            if elapsed >= most:
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

    @contextmanager
    def _profiling(self) -> Iterator[None]:
        """py-spy on the target's process (a started service's, else optlab's own) while the
        block runs; a profiler that cannot attach leaves a note, never a failed run."""
        if not self.profile or self.target is None:
            yield
            return
        pid = self.target.service_pid or os.getpid()
        longest = self.protocol.max_duration_s or self.protocol.duration_s
        profiler = Profiler(pid, max_s=longest + PROFILE_SLACK_S)
        try:
            profiler.start()
        except ProfilerError as exc:
            self.profile_note = f"no profile: {exc.message}"
            yield
            return
        try:
            yield
        finally:
            self.profiled = profiler.stop()

    @contextmanager
    def _server_polling(self) -> Iterator[None]:
        """The target's engine metrics (`target.prometheus_url`) read once a second while the
        block runs."""
        read = self.target.server_metrics if self.target is not None else None
        if read is None:
            yield
            return
        poller = ServerPoller(read)
        poller.start()
        try:
            yield
        finally:
            poller.stop()
            self.server_poll = poller

    def _short_of_queries(self) -> bool:
        """A protocol that measures until a P99 is supported: too few answers yet, and time."""
        p = self.protocol
        return (
            p.min_queries > 0
            and p.max_duration_s is not None
            and self.measured_s < p.max_duration_s
            and self.collector.totals("measure")[0] < p.min_queries
        )

    def _planned_s(self) -> float:
        p = self.protocol
        if self.measured_s < p.duration_s or p.max_duration_s is None:
            return p.duration_s
        return p.max_duration_s

    def _measure(self) -> None:
        if self.target is not None and self.target.reset_metrics is not None:
            self.target.reset_metrics()  # the target's own counters cover the measured phase
        # The garbage collector is timed over the measured phase only, and let go of however
        # the phase ends (Ctrl-C, a failed target).
        with self.gc.recording(), self._profiling(), self._server_polling():
            started = time.monotonic()
            self.set_phase("measure")
            self.sampler.set_phase("measure")
            middle: float | None = self.protocol.duration_s / 2  # who came or went halfway
            try:
                while self.measured_s < self.protocol.duration_s or self._short_of_queries():
                    planned = self._planned_s()
                    self.measured_s = self._tick("measure", started, planned)
                    if middle is not None and self.measured_s >= middle:
                        self.sampler.mark_middle()
                        middle = None
                    if self.early_stop is not None and self.measured_s < planned:
                        self.stopped_early = self.early_stop()
                        if self.stopped_early is not None:
                            note = f"[{self.name}] stopping early: {self.stopped_early}"
                            self.progress.note(note)
                            break
            finally:
                self.measured_s = time.monotonic() - started
                self.set_phase("drain")
                self.sampler.set_phase("drain")
