"""What the two kinds measured over the network (http, command) share: their knobs reach the
service through templates, their inputs are request bodies, and they are driven by a client
built from a picklable recipe, with the service's own metrics and accuracy as hooks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from optlab.config.knobs import ImageInputs
from optlab.config.models import (
    CommandTarget,
    HttpInputs,
    HttpTarget,
    OpenAITarget,
    ResolvedConfig,
    Workload,
)
from optlab.config.source import SourceFile
from optlab.config.validation import config_error
from optlab.errors import ConfigError
from optlab.targets.base import LoadedTarget
from optlab.targets.command import Service
from optlab.targets.http import HttpRecipe, check_input_files, fetch_json, http_bodies, http_spec
from optlab.targets.listener import local_listener
from optlab.targets.references import import_knob_model
from optlab.targets.templates import (
    NetworkTarget,
    Secrets,
    check_knob_references,
    target_templates,
)

__all__ = [
    "adopt_listener",
    "not_in_process",
    "start_service",
    "network_inputs",
    "network_knob_model",
    "network_target",
    "check_templates",
    "service_hooks",
]


def network_knob_model(target: NetworkTarget, paths: Sequence[Path]) -> type[BaseModel] | None:
    return import_knob_model(target.knobs_model, paths) if target.knobs_model else None


def check_templates(target: NetworkTarget, knobs: dict[str, Any]) -> None:
    """Every `{knobs.…}` the target's templated fields name is a knob the config holds."""
    check_knob_references(target_templates(target), knobs)


def network_inputs(workload: Workload, source: SourceFile) -> Workload:
    """`workload.inputs` as HttpInputs (an `images` source as ImageInputs), the files it names
    present; defaults left out, as stored configs always had them."""
    try:
        inputs = HttpInputs.model_validate(workload.inputs).model_dump(
            mode="json", exclude_defaults=True
        )
    except ValidationError as exc:
        raise config_error(exc, HttpInputs, source, ("workload", "inputs")) from exc
    if "images" in inputs:
        try:
            ImageInputs.model_validate(inputs["images"])
        except ValidationError as exc:
            raise config_error(exc, ImageInputs, source, ("workload", "inputs", "images")) from exc
    try:
        check_input_files(inputs, source.path.resolve().parent)
    except ConfigError as exc:
        raise ConfigError(
            f"{source.where(('workload', 'inputs'))}: {exc.message}", exc.hint
        ) from None
    return workload.model_copy(update={"inputs": inputs})


def not_in_process(request: Any) -> Any:
    raise RuntimeError("a network target is driven through its client, not called in-process")


def network_target(config: ResolvedConfig, paths: Sequence[Path], secrets: Secrets) -> LoadedTarget:
    """The target as its client drives it: the bodies, the resolved request spec, the service's
    hooks. Its description is the method and the URL (secrets redacted); the kind names itself
    in front."""
    target = config.target
    assert isinstance(target, HttpTarget | CommandTarget)
    bodies = http_bodies(config.workload, folder_of(paths))
    spec = http_spec(target, config.workload, secrets, config.knobs)
    loaded = LoadedTarget(
        not_in_process,
        bodies,
        f"{target.method} {secrets.redact(spec.url)}",
        client=HttpRecipe(spec, tuple(bodies)),
    )
    service_hooks(loaded, target, config.knobs, secrets)
    return loaded


def start_service(
    loaded: LoadedTarget,
    target: CommandTarget | OpenAITarget,
    knobs: dict[str, Any],
    secrets: Secrets,
    folder: Path,
) -> Service:
    """Start the target's `command` and make it the loaded target's service: stopped with it,
    checked every tick, its process tree sampled, its info stored with the run."""
    service = Service(target, knobs, secrets, folder)
    service.start()
    loaded.closers.append(service.stop)
    loaded.check = service.check
    loaded.service_pid = service.pid
    loaded.service_info = service.info
    return service


def adopt_listener(loaded: LoadedTarget, url: str) -> None:
    """A service optlab did not start but which listens on this host at `url`'s port: its
    process is the target's service (sampled as such, never a neighbour)."""
    listener = local_listener(url)
    if listener is not None:
        loaded.service_pid = listener.pid
        loaded.service_info = listener.info


def folder_of(paths: Sequence[Path]) -> Path:
    """The experiment's folder: input files and a service's working directory are under it."""
    return paths[0] if paths else Path.cwd()


def service_hooks(
    loaded: LoadedTarget,
    target: NetworkTarget,
    knobs: dict[str, Any],
    secrets: Secrets,
) -> None:
    """`metrics_url`, `metrics_reset_url`, `accuracy_url` as the target's metrics(),
    reset_metrics() and accuracy() hooks, as a python target's object would have them."""

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
