"""A streaming target's engine metrics read once a second over the measured phase, on a thread
of their own (`target.prometheus_url`; `optlab.metrics.server_metrics` parses and sums them).

A page that cannot be read is a missed sample, never a failed run: the first failure's reason
is kept for the run's notes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from optlab.metrics.server_metrics import ServerSample

__all__ = ["ServerPoller", "server_notes"]

INTERVAL_S = 1.0


class ServerPoller:
    def __init__(
        self, read: Callable[[], dict[str, float]], interval_s: float = INTERVAL_S
    ) -> None:
        self.read = read
        self.interval_s = interval_s
        self.samples: list[ServerSample] = []
        self.missed = 0
        self.first_error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="optlab-server-metrics", daemon=True)
        self._started = 0.0

    def start(self) -> None:
        self._started = time.monotonic()
        self._thread.start()

    def stop(self) -> None:
        """One last sample at the phase's end (a counter's increase covers all of it)."""
        self._stop.set()
        self._thread.join(timeout=self.interval_s * 5)
        self._sample()

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self.interval_s):
                return

    def _sample(self) -> None:
        at = time.monotonic() - self._started
        try:
            figures = self.read()
        except Exception as exc:  # a slow or failing page: a missed sample
            self.missed += 1
            if self.first_error is None:
                self.first_error = str(exc)[:300]
            return
        self.samples.append(ServerSample(at, figures))


def server_notes(poller: ServerPoller | None) -> list[str]:
    """What the run's notes say of the engine's metrics: pages missed, none with a figure."""
    if poller is None:
        return []
    notes = []
    if poller.missed:
        notes.append(
            f"target.prometheus_url: {poller.missed} of {poller.missed + len(poller.samples)} "
            f"reads failed (first: {poller.first_error})"
        )
    if poller.samples and not any(s.figures for s in poller.samples):
        notes.append(
            "target.prometheus_url: no known metric on the page (running and waiting "
            "requests, KV-cache usage, preemptions, prefix-cache hits: docs/experiment-files.md)"
        )
    return notes
