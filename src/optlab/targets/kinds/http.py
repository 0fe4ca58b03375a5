"""`kind: http`: a service already listening at `url`, measured over HTTP.

optlab cannot see its code or its environment: the `code_version` the user declares is its
whole identity, and reports say that its environment was not checked. When it listens on this
host, its process (found by the port, `optlab.targets.listener`) is the target's service: its
CPU is sampled as the service's, like a command target's, and it is never a neighbour.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from optlab.config.models import HttpTarget, ResolvedConfig, Target, Workload
from optlab.config.source import SourceFile
from optlab.targets.base import LoadedTarget
from optlab.targets.http import check_listening
from optlab.targets.kind import TargetKind
from optlab.targets.kinds.builtin import classifier_engine_busy
from optlab.targets.network import (
    adopt_listener,
    check_templates,
    network_inputs,
    network_knob_model,
    network_target,
)
from optlab.targets.templates import Secrets

__all__ = ["KIND", "Http"]


class Http(TargetKind):
    name = "http"
    in_process = False
    service_note = (
        "not checked: optlab does not start an http target's service and cannot see its "
        "interpreter or packages; its declared code_version is its only identity"
    )

    def engine_busy(self, figures: Mapping[str, Any] | None) -> tuple[float, int] | None:
        # A service of the reference classifier (`optlab serve`, its /metrics as the
        # metrics_url) reports its engine's busy time as the classifier does in process.
        return classifier_engine_busy(figures)

    def knob_model(self, target: Target, paths: Sequence[Path]) -> type[BaseModel] | None:
        assert isinstance(target, HttpTarget)
        return network_knob_model(target, paths)

    def check_knobs(self, target: Target, knobs: dict[str, Any]) -> None:
        assert isinstance(target, HttpTarget)
        check_templates(target, knobs)
        super().check_knobs(target, knobs)

    def resolve_inputs(self, workload: Workload, source: SourceFile) -> Workload:
        return network_inputs(workload, source)

    def identity(self, target: Mapping[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
        return {"kind": "http", "declared": target.get("code_version")}

    def preflight(self, config: ResolvedConfig, where: str) -> None:
        assert isinstance(config.target, HttpTarget)
        check_listening(config.target, config.knobs, where)

    def build(
        self, config: ResolvedConfig, paths: Sequence[Path], secrets: Secrets
    ) -> LoadedTarget:
        loaded = network_target(config, paths, secrets)
        loaded.description = f"http {loaded.description}"
        assert loaded.client is not None
        adopt_listener(loaded, loaded.client.spec.url)
        return loaded


KIND = Http()
