"""What the runner needs from any target, and how each kind of target is built."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from optlab.config.models import ResolvedConfig, Workload
from optlab.errors import TargetError
from optlab.targets.templates import Secrets


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
    service_info: Callable[[], dict[str, Any]] | None = None

    def close(self) -> None:
        for closer in self.closers:
            closer()


def _check_callable(obj: Any, where: str) -> None:
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


def _python_target(config: ResolvedConfig, paths: Sequence[Path]) -> LoadedTarget:
    from optlab.config.models import PythonTarget
    from optlab.targets.references import import_reference, search_path

    target = config.target
    assert isinstance(target, PythonTarget)
    factory = import_reference(target.factory, paths, "target.factory")
    with search_path(paths):
        try:
            built = factory(config.knobs)
        except Exception as exc:
            raise TargetError(
                f"target.factory {target.factory!r} raised {type(exc).__name__}: {exc}",
                hint="the factory receives the knobs as a dict; run it by hand to debug",
            ) from exc
        _check_callable(built, f"target.factory {target.factory!r}")
        requests = _inputs(target.inputs, config.workload, paths)
    loaded = LoadedTarget(built, requests, f"python {target.factory}")
    _hooks(built, loaded, target.factory)
    return loaded


def _inputs(reference: str | None, workload: Workload, paths: Sequence[Path]) -> Sequence[Any]:
    if reference is None:
        return [None]  # a target that needs no input gets None as its request
    from optlab.targets.references import import_reference

    make = import_reference(reference, paths, "target.inputs")
    try:
        requests = make(workload)
    except Exception as exc:
        raise TargetError(
            f"target.inputs {reference!r} raised {type(exc).__name__}: {exc}",
            hint="inputs(workload) receives the workload model and returns a list of requests",
        ) from exc
    try:
        requests = list(requests)
    except TypeError as exc:
        raise TargetError(
            f"target.inputs {reference!r} returned {type(requests).__name__}, not a sequence",
            hint="return a list of requests",
        ) from exc
    if not requests:
        raise TargetError(
            f"target.inputs {reference!r} returned no requests", hint="return one or more"
        )
    return requests


def _hooks(built: Any, loaded: LoadedTarget, name: str) -> None:
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


def _builtin_target(config: ResolvedConfig) -> LoadedTarget:
    from optlab.config.models import BuiltinTarget

    target = config.target
    assert isinstance(target, BuiltinTarget)
    # Both modules expose build(knobs) and inputs(workload), like a python target's factory.
    module: Any
    if target.name == "synthetic":
        from optlab.reference import synthetic as module
    else:
        from optlab.reference.classifier import pipeline as module
    built = module.build(config.knobs)
    try:
        loaded = LoadedTarget(built, module.inputs(config.workload), f"builtin {target.name}")
        _hooks(built, loaded, target.name)
    except BaseException:
        close = getattr(built, "close", None)
        if callable(close):
            close()  # threads and engines the target started must not outlive a failed set-up
        raise
    return loaded


def _not_in_process(request: Any) -> Any:
    raise RuntimeError("a network target is driven through its client, not called in-process")


def _network_target(
    config: ResolvedConfig, paths: Sequence[Path], secrets: Secrets
) -> LoadedTarget:
    from optlab.config.models import CommandTarget, HttpTarget
    from optlab.targets.http import HttpRecipe, http_bodies, http_spec

    target = config.target
    assert isinstance(target, HttpTarget | CommandTarget)
    folder = paths[0] if paths else Path.cwd()
    bodies = http_bodies(config.workload, folder)
    spec = http_spec(target, config.workload, secrets, config.knobs)
    where = secrets.redact(spec.url)
    if not isinstance(target, CommandTarget):
        loaded = LoadedTarget(
            _not_in_process,
            bodies,
            f"http {target.method} {where}",
            client=HttpRecipe(spec, tuple(bodies)),
        )
        service_hooks(loaded, target, config.knobs, secrets)
        return loaded
    from optlab.targets.command import Service

    service = Service(target, config.knobs, secrets, folder)
    service.start()
    loaded = LoadedTarget(
        _not_in_process,
        bodies,
        f"command {' '.join(service.info()['command'])} -> {target.method} {where}",
        closers=[service.stop],
        client=HttpRecipe(spec, tuple(bodies)),
        check=service.check,
        service_pid=service.pid,
        service_info=service.info,
    )
    service_hooks(loaded, target, config.knobs, secrets)
    return loaded


def service_hooks(
    loaded: LoadedTarget, target: Any, knobs: dict[str, Any], secrets: Secrets
) -> None:
    """`metrics_url`, `metrics_reset_url`, `accuracy_url` as the target's metrics(),
    reset_metrics() and accuracy() hooks, as a python target's object would have them."""
    from optlab.targets.http import fetch_json

    def hook(
        field: str, method: str, timeout_s: float = 30.0
    ) -> Callable[[], dict[str, Any]] | None:
        value = getattr(target, field)
        if not value:
            return None
        where = f"target.{field}"
        url = secrets.fill(value, knobs, where)
        return lambda: fetch_json(method, url, where, secrets, timeout_s=timeout_s)

    loaded.metrics = hook("metrics_url", "GET") or loaded.metrics
    loaded.accuracy = hook("accuracy_url", "GET", timeout_s=600) or loaded.accuracy
    reset = hook("metrics_reset_url", "POST")
    if reset is not None:

        def reset_metrics() -> None:
            reset()

        loaded.reset_metrics = reset_metrics


def load_target(
    config: ResolvedConfig, paths: Sequence[Path], secrets: Secrets | None = None
) -> LoadedTarget:
    """Build the target a resolved config names. Errors say which field to fix.

    `${ENV_VAR}` references are resolved into `secrets`, which the caller uses to redact
    everything it writes about the run.
    """
    kind = config.target.kind
    if kind == "builtin":
        return _builtin_target(config)
    if kind == "python":
        return _python_target(config, paths)
    return _network_target(config, paths, secrets if secrets is not None else Secrets())
