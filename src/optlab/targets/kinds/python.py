"""`kind: python`: the user's factory, `factory(knobs)` -> a callable(request) -> response, and
optionally `inputs(workload)` -> the requests and `knobs_model`, the pydantic model of its knobs.

Its code identity is the source of the modules those references name (a package: all of it),
or the `code_version` the user declares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from optlab.config.models import PythonTarget, ResolvedConfig, Target, Workload
from optlab.config.source import SourceFile
from optlab.errors import ConfigError, TargetError
from optlab.targets.base import LoadedTarget, attach_hooks, check_callable
from optlab.targets.identity import source_hash
from optlab.targets.kind import TargetKind
from optlab.targets.references import (
    check_reference_callable,
    import_knob_model,
    import_reference,
    module_origin,
    search_path,
)
from optlab.targets.templates import Secrets

__all__ = ["KIND", "Python"]

# The fields that name user code, in the order their modules enter the identity.
CODE_FIELDS = ("factory", "inputs", "knobs_model")


class Python(TargetKind):
    name = "python"
    in_process = True

    def knob_model(self, target: Target, paths: Sequence[Path]) -> type[BaseModel] | None:
        assert isinstance(target, PythonTarget)
        # Only here, at load, is user code run, and only when the user asked for it.
        return import_knob_model(target.knobs_model, paths) if target.knobs_model else None

    def check_code(self, target: Target, paths: Sequence[Path], source: SourceFile) -> None:
        # `optlab diff` resolves what `optlab run` will call: a misspelt factory is refused
        # with the closest name before any config or FAILED run is stored.
        assert isinstance(target, PythonTarget)
        for field in ("factory", "inputs"):
            reference = getattr(target, field)
            if reference is None:
                continue
            try:
                found = import_reference(reference, paths, f"target.{field}")
                check_reference_callable(found, f"target.{field} {reference!r}")
            except ConfigError as exc:
                where = source.where(("target", field))
                raise ConfigError(f"{where}: {exc.message}", exc.hint) from None

    def identity(self, target: Mapping[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
        modules: dict[str, str | None] = {}
        for field in CODE_FIELDS:
            reference = target.get(field)
            if reference:
                module = reference.split(":")[0]
                origin = module_origin(module, paths)
                modules[module] = source_hash(origin) if origin is not None else None
        return {"kind": "python", "declared": target.get("code_version"), "modules": modules}

    def build(
        self, config: ResolvedConfig, paths: Sequence[Path], secrets: Secrets
    ) -> LoadedTarget:
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
            check_callable(built, f"target.factory {target.factory!r}")
            requests = _inputs(target.inputs, config.workload, paths)
        loaded = LoadedTarget(built, requests, f"python {target.factory}")
        attach_hooks(built, loaded, target.factory)
        return loaded


def _inputs(reference: str | None, workload: Workload, paths: Sequence[Path]) -> Sequence[Any]:
    if reference is None:
        return [None]  # a target that needs no input gets None as its request
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


KIND = Python()
