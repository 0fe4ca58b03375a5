"""What the runner needs from any target, and the checks every target built in-process passes."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from optlab.errors import TargetError


@dataclass
class LoadedTarget:
    """A built target: a thread-safe callable(request) -> response, its requests, its hooks.

    Optional hooks, taken from the built object when it has them (as `setup` and `close` are):
    `metrics()` -> a JSON-able dict of the target's own counters (batch sizes, cache hits),
    stored with the run; `reset_metrics()`, called when the measured phase starts so those
    counters cover it alone; `accuracy()` -> a dict with `top1` and, against a reference,
    `drop_pts`, checked once before the load starts and stored with the run.

    A target measured over the network has a `client` instead (an `HttpRecipe`: the resolved
    request spec and bodies, which each load-generator process turns into its own pooled
    asynchronous client) and `call` is unused. A service optlab started has `check()`, called
    every tick (it raises when the service died), `service_pid` (its process tree is sampled)
    and `service_info()`, stored with the run.
    """

    call: Callable[[Any], Any]
    requests: Sequence[Any]
    description: str
    closers: list[Callable[[], None]] = field(default_factory=list)
    metrics: Callable[[], dict[str, Any]] | None = None
    reset_metrics: Callable[[], None] | None = None
    accuracy: Callable[[], dict[str, Any]] | None = None
    client: Any = None
    check: Callable[[], None] | None = None
    service_pid: int | None = None
    # A streaming LLM target's engine metrics: one Prometheus page's known figures
    # (`optlab.metrics.server_metrics`), read once a second over the measured phase.
    server_metrics: Callable[[], dict[str, float]] | None = None
    service_info: Callable[[], dict[str, Any]] | None = None

    def close(self) -> None:
        for closer in self.closers:
            closer()


def check_callable(obj: Any, where: str) -> None:
    if not callable(obj):
        raise TargetError(
            f"{where} returned {type(obj).__name__}, not a callable",
            hint="return a function or an object with __call__(self, request) -> response",
        )
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust them
    try:
        signature.bind(object())
    except TypeError as exc:
        raise TargetError(
            f"{where} returned a callable with signature {signature}, which cannot take "
            "one request",
            hint="the callable is called as fn(request) for every request",
        ) from exc


def attach_hooks(built: Any, loaded: LoadedTarget, name: str) -> None:
    setup = getattr(built, "setup", None)
    if callable(setup):
        try:
            setup()
        except Exception as exc:
            raise TargetError(
                f"{name}: setup() raised {type(exc).__name__}: {exc}", hint="fix the target's setup"
            ) from exc
    close = getattr(built, "close", None)
    if callable(close):
        loaded.closers.append(close)
    for hook in ("metrics", "reset_metrics", "accuracy"):
        found = getattr(built, hook, None)
        if callable(found):
            setattr(loaded, hook, found)


def in_process_target(
    built: Any, requests: Callable[[], Sequence[Any]], description: str, name: str
) -> LoadedTarget:
    """A target object built in optlab's process (its build(knobs) ran), its requests and its
    hooks; a failure here closes it, so threads and engines it started do not outlive it."""
    try:
        loaded = LoadedTarget(built, requests(), description)
        attach_hooks(built, loaded, name)
    except BaseException:
        close = getattr(built, "close", None)
        if callable(close):
            close()
        raise
    return loaded
