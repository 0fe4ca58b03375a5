"""`kind: command`: a service optlab starts (`optlab.targets.command.Service`), measures over
HTTP at `url`, and stops.

Its code identity is the program and the files its arguments name beside the experiment
(`optlab serve`: the reference workload optlab serves); the interpreter it runs and what is
installed there are the fingerprint's `service` section (`optlab.targets.service_env`).
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from optlab.config.models import CommandTarget, ResolvedConfig, Target, Workload
from optlab.config.source import SourceFile
from optlab.targets.base import LoadedTarget
from optlab.targets.identity import hash_files, reference_identity
from optlab.targets.kind import TargetKind
from optlab.targets.kinds.builtin import classifier_engine_busy
from optlab.targets.network import (
    check_templates,
    folder_of,
    network_inputs,
    network_knob_model,
    network_target,
    start_service,
)
from optlab.targets.service_env import inspect_service
from optlab.targets.templates import Secrets

__all__ = ["KIND", "Command", "command_identity"]

# Files a service writes (its pid file, its log): named in its arguments, yet not its code.
WRITTEN_BY_SERVICES = (".pid", ".log", ".lock", ".sock", ".out", ".err", ".tmp")


class Command(TargetKind):
    name = "command"
    in_process = False
    starts_service = True
    service_note = "not recorded (measured before optlab recorded a service's environment)"

    def engine_busy(self, figures: Mapping[str, Any] | None) -> tuple[float, int] | None:
        # A service of the reference classifier (`optlab serve`, its /metrics as the
        # metrics_url) reports its engine's busy time as the classifier does in process.
        return classifier_engine_busy(figures)

    def knob_model(self, target: Target, paths: Sequence[Path]) -> type[BaseModel] | None:
        assert isinstance(target, CommandTarget)
        return network_knob_model(target, paths)

    def check_knobs(self, target: Target, knobs: dict[str, Any]) -> None:
        assert isinstance(target, CommandTarget)
        check_templates(target, knobs)
        super().check_knobs(target, knobs)

    def resolve_inputs(self, workload: Workload, source: SourceFile) -> Workload:
        return network_inputs(workload, source)

    def identity(self, target: Mapping[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
        return command_identity(target, paths)

    def service_environment(
        self, target: Mapping[str, Any], folder: Path, environ: Mapping[str, str] | None
    ) -> dict[str, Any] | None:
        return inspect_service(target, folder, environ)

    def build(
        self, config: ResolvedConfig, paths: Sequence[Path], secrets: Secrets
    ) -> LoadedTarget:
        target = config.target
        assert isinstance(target, CommandTarget)
        loaded = network_target(config, paths, secrets)
        service = start_service(loaded, target, config.knobs, secrets, folder_of(paths))
        loaded.description = (
            f"command {' '.join(service.info()['command'])} -> {loaded.description}"
        )
        return loaded


def command_identity(target: Mapping[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
    files: dict[str, str] = {}
    command = list(target.get("command", []))
    if command:
        program = sys.executable if command[0] == "{python}" else command[0]
        executable = shutil.which(program)
        if executable:
            files[command[0]] = hash_files([Path(executable)])
    declared = target.get("code_version")
    if _runs_optlab(command):
        # `optlab serve`: the service's code is this optlab's reference workload.
        return {
            "kind": "command",
            "declared": declared,
            "files": files,
            "optlab": reference_identity(),
        }
    for arg in command[1:]:
        # Arguments that name files next to the experiment (a server script, a model) are code;
        # files the service writes (its pid file, its log) are not, and come and go.
        if Path(arg).suffix.lower() in WRITTEN_BY_SERVICES:
            continue
        for base in paths:
            candidate = base / arg
            if candidate.is_file():
                files[arg] = hash_files([candidate])
                break
    return {"kind": "command", "declared": declared, "files": files}


def _runs_optlab(command: list[str]) -> bool:
    if not command:
        return False
    if Path(command[0]).name == "optlab":
        return True
    return any(a == "-m" and b == "optlab" for a, b in zip(command, command[1:], strict=False))


KIND = Command()
