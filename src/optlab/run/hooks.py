"""A target's own hooks around the load: its accuracy check before, and its metrics(), close()
and service info after.

Each hook after the load runs in a thread of its own for at most HOOK_TIMEOUT_S: whatever it
raises (even SystemExit or KeyboardInterrupt), a hang, or a Ctrl-C while it runs is noted and
stored with the run, which is stored all the same. What a hook returns is made JSON-safe first.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from optlab.errors import TargetError
from optlab.run.progress import Progress
from optlab.run.summary import json_safe
from optlab.targets.base import LoadedTarget
from optlab.targets.templates import Secrets

__all__ = ["HOOK_TIMEOUT_S", "MAX_TARGET_METRICS_BYTES", "TargetHooks"]

HOOK_TIMEOUT_S = 60.0  # a target's metrics()/close() after the load, at most
MAX_TARGET_METRICS_BYTES = 1 << 20  # what a target's metrics() may store with a run


class TargetHooks:
    """Calls one run's target hooks and keeps what they returned, and the notes about them."""

    def __init__(self, name: str, secrets: Secrets, progress: Progress) -> None:
        self._name, self._secrets, self._progress = name, secrets, progress
        self.notes: list[str] = []  # values a target returned that JSON cannot hold, failures
        self.accuracy: dict[str, Any] | None = None
        self.metrics: Any = None  # a JSON value, or None
        self.service: Any = None  # a JSON value, or None

    def check_accuracy(self, target: LoadedTarget) -> None:
        """Before the load, not during it: it would steal the engine's cores."""
        if target.accuracy is not None:
            self._progress.note(f"{self._name}: checking held-out accuracy")
            self.accuracy = checked_accuracy(json_safe(target.accuracy(), "accuracy", self.notes))

    def after_load(self, target: LoadedTarget) -> None:
        """metrics(), close() and service info, each bounded and never fatal."""
        if target.metrics is not None:
            metrics = self._call("metrics()", target.metrics)
            self.metrics = capped(json_safe(metrics, "target", self.notes), "target", self.notes)
        self._call("close()", target.close)
        if target.service_info is not None:
            self.service = json_safe(
                self._call("service info", target.service_info), "service", self.notes
            )

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        outcome: dict[str, Any] = {}

        def body() -> None:
            try:
                outcome["value"] = call()
            except BaseException as exc:  # noted below, never lost with the run
                outcome["error"] = exc

        thread = threading.Thread(target=body, name="optlab-target-hook", daemon=True)
        try:  # start() waits for the thread to begin: a Ctrl-C may land there too
            thread.start()
            thread.join(HOOK_TIMEOUT_S)
        except KeyboardInterrupt:
            return self._note(f"target {what} was interrupted; the run is stored without it")
        if thread.is_alive():
            return self._note(
                f"target {what} did not return within {HOOK_TIMEOUT_S:g} s; the run is stored "
                "without it"
            )
        exc = outcome.get("error")
        if exc is not None:
            return self._note(f"target {what} raised {type(exc).__name__}: {exc}")
        return outcome.get("value")

    def _note(self, text: str) -> None:
        text = self._secrets.redact(text)
        self.notes.append(text)  # stored with the run, not only printed
        self._progress.note(f"{self._name}: {text}")


def checked_accuracy(report: Any) -> dict[str, Any]:
    top1 = report.get("top1") if isinstance(report, dict) else None
    if not isinstance(top1, int | float) or isinstance(top1, bool):
        raise TargetError(
            f"the target's accuracy() returned {report!r}",
            hint="return a dict with `top1` (a fraction) and optionally `drop_pts` (points lost "
            "against a reference), `n` and `agreement`",
        )
    checked: dict[str, Any] = report
    return checked


def capped(value: Any, where: str, notes: list[str]) -> Any:
    """A JSON value no bigger than MAX_TARGET_METRICS_BYTES: a target that returns 50 MB from
    metrics() would make every later `optlab log` and table read it."""
    size = len(json.dumps(value, default=str))
    if size <= MAX_TARGET_METRICS_BYTES:
        return value
    notes.append(
        f"{where} was {size / 2**20:.1f} MiB of JSON, over the "
        f"{MAX_TARGET_METRICS_BYTES / 2**20:g} MiB limit: only its keys are stored"
    )
    return {"keys": sorted(map(str, value))[:100]} if isinstance(value, dict) else None
