"""Writing one run while it is measured and when it ends, so that no measurement is lost.

While the load runs, a heartbeat thread keeps the run from being taken for dead and a flush
thread writes its windows and resource samples every few seconds (a live run shows its data,
a crash keeps it). At the end, one transaction stores the whole run, retried through a
database outage; a database that still refuses it leaves the run whole in a pending bundle
that the next optlab command opening the database stores.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.exc import OperationalError

from optlab.errors import OptlabError, StoreUnavailable
from optlab.metrics.backlog import LoadTimeline
from optlab.metrics.log import Window
from optlab.metrics.resources import ResourceReading
from optlab.run.phases import shielded, stop_signals
from optlab.run.progress import Progress
from optlab.run.summary import resource_rows, window_rows
from optlab.store import (
    ResourceSample,
    RunErrorCount,
    RunFinal,
    StageStatsRow,
    Store,
    WindowStats,
)
from optlab.store.bundle import RunBundle
from optlab.store.pending import PENDING_DIR, save_pending

__all__ = ["FLUSH_S", "Recorder", "RunEnd", "first_line", "retryable", "store_retry_s"]

HEARTBEAT_S = 1.0
STORE_RETRY_S = 60.0  # the final write rides out a database restart this long
FLUSH_S = 5.0  # time series and resource samples reach the database at least this often


@dataclass(frozen=True)
class RunEnd:
    """Everything the final write stores: the run's final fields and every one of its
    measurements."""

    final: RunFinal
    stage_stats: list[StageStatsRow]
    windows: list[WindowStats]
    samples: list[ResourceSample]
    errors: list[RunErrorCount]


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


class _Flusher:
    """Writes a run's windows and resource samples every FLUSH_S from its own thread.

    Never on the measurement's loop: a database that is locked or restarting can make one
    write wait for tens of seconds, and the loop must go on timing the load. A write the
    store refuses is kept and retried at the next flush; the final write stores the whole
    run anyway (`Recorder.store`).
    """

    def __init__(
        self, store: Store, run_id: int, progress: Progress, name: str, load: LoadTimeline
    ) -> None:
        self._store, self._run_id, self._progress, self._name = store, run_id, progress, name
        self._load = load
        self._lock = threading.Lock()
        self._windows: list[Window] = []
        self._readings: list[ResourceReading] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="optlab-flush", daemon=True)
        self.failure: str | None = None  # the store's last refusal, while it lasts

    def __enter__(self) -> _Flusher:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def offer(self, windows: Sequence[Window], readings: Sequence[ResourceReading]) -> None:
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
                    f"{self._name}: the database refused a write ({first_line(exc)}); the "
                    "measurement goes on and its data is kept until the database is back"
                )
            self.failure = first_line(exc)
            return
        if self.failure is not None:
            self._progress.note(f"{self._name}: the database is back; pending data written")
            self.failure = None


class Recorder:
    """Writes one run, from RUNNING to its final write (or its pending bundle).

    `recording()` holds the heartbeat and the flushes for as long as the run is measured;
    `offer()` hands the flusher what each tick collected; `store()` writes the whole run.
    After `store()`, `pending` is the bundle that keeps a run the database refused, and
    `unstored` says why a run is neither stored nor pending.
    """

    def __init__(
        self, store: Store, run_id: int, name: str, progress: Progress, load: LoadTimeline
    ) -> None:
        self._store, self._run_id, self._name, self._progress = store, run_id, name, progress
        self._flusher = _Flusher(store, run_id, progress, name, load)
        self._snapshot: RunBundle | None = None  # the run as first stored
        self.pending: Path | None = None
        self.unstored: str | None = None

    @contextmanager
    def recording(self) -> Iterator[None]:
        # What the run row holds now (the database has just accepted it), so a run whose
        # final write the database refuses can still be saved whole as a pending bundle.
        self._snapshot = self._store.export_run(self._run_id)
        with _Heartbeat(self._store, self._run_id), self._flusher:
            yield

    def offer(self, windows: Sequence[Window], readings: Sequence[ResourceReading]) -> None:
        self._flusher.offer(windows, readings)

    def stop_flushing(self) -> None:
        """End the flushes; returns once a flush under way has ended (the final write
        stores every window and sample, and a late flush would land beside them)."""
        self._flusher.close()

    def concurrent_runs(self) -> list[str]:
        """Other optlab runs on this host whose measurement overlapped this one's."""
        try:
            others = self._store.overlapping_runs(self._run_id)
        except Exception:  # the store is down: the verdict goes on without this fact
            return []
        return [f"run {run.id} {run.experiment}" for run in others]

    def store(self, end: RunEnd) -> Path | None:
        """Store the run in one transaction, retrying through an outage; if the database
        still refuses, save the whole run as a pending bundle (returned, and `pending`) that
        the next optlab command opening this database stores. Never loses the measurement.

        `end` holds the whole run, not only what the flushes left pending: the store
        replaces the run's measurements in the same transaction, so a retry after a failed
        attempt (or after flushes a restart may have lost) stores exactly this."""
        failure = self._write_final(end)
        if failure is not None:
            with shielded():  # the pending bundle is the run's last copy: write it whole
                self.pending = self._save_pending(end, failure)
        return self.pending

    def _write_final(self, end: RunEnd) -> BaseException | None:
        """The final write, retried through an outage; None once stored, else why not.
        Ctrl-C or SIGTERM while it retries stops the retries (the run is then kept as a
        pending bundle at once)."""
        deadline = time.monotonic() + store_retry_s()
        delay, told = 0.5, False
        with stop_signals(sigint=True):
            while True:
                try:
                    self._store.complete_run(
                        self._run_id,
                        final=end.final,
                        stage_stats=end.stage_stats,
                        windows=end.windows,
                        samples=end.samples,
                        run_errors=end.errors,
                    )
                    return None
                except KeyboardInterrupt as exc:
                    self._progress.note(f"{self._name}: interrupted while storing the run")
                    return exc
                except Exception as exc:
                    if not retryable(exc) or time.monotonic() + delay > deadline:
                        return exc
                    if not told:
                        told = True
                        self._progress.note(
                            f"{self._name}: the database refused the run's final write "
                            f"({first_line(exc)}); retrying for up to "
                            f"{max(deadline - time.monotonic(), 0):.0f} s (Ctrl-C keeps the "
                            "run on disk at once)"
                        )
                try:
                    time.sleep(delay)
                except KeyboardInterrupt as interrupt:
                    return interrupt
                delay = min(delay * 2, 5.0)

    def _save_pending(self, end: RunEnd, failure: BaseException) -> Path | None:
        assert self._snapshot is not None, "store() outside recording()"
        bundle = self._snapshot.completed(
            final=end.final,
            stage_stats=end.stage_stats,
            windows=end.windows,
            samples=end.samples,
            errors=end.errors,
        )
        try:
            path = save_pending(bundle, self._store.url)
        except OptlabError as exc:
            # Nowhere to keep it: say so, and let the summary (printed next) be what is left.
            self.unstored = (
                f"run {self._run_id} was measured but neither the database "
                f"({first_line(failure)}) nor any folder would keep it: {exc.message}"
            )
            self._progress.note(f"{self._name}: {self.unstored}")
            return None
        here = path.parent == Path.cwd() / PENDING_DIR
        self._progress.note(
            f"{self._name}: run {self._run_id} was measured but the database refused it "
            f"({first_line(failure)}); saved whole in {path}. The next optlab command that "
            f"opens {self._store.url}{' from this folder' if here else ''} stores it (or run "
            f"`optlab import {path}`)"
        )
        return path


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
    return isinstance(exc, StoreUnavailable | OperationalError)


def first_line(exc: BaseException) -> str:
    text = str(getattr(exc, "message", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
