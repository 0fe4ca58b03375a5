"""`kind: builtin` (`name: image-classifier`, the default): the reference image classifier.

Its knobs (`BuiltinKnobs`) and inputs (`ImageInputs`) are checked when the file loads; its code
is the reference workload's files. The classifier itself is imported only when it is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from optlab.config.knobs import BuiltinKnobs, ImageInputs
from optlab.config.models import ResolvedConfig, Target, Workload
from optlab.config.source import SourceFile
from optlab.config.validation import config_error
from optlab.targets.base import LoadedTarget, in_process_target
from optlab.targets.identity import reference_identity
from optlab.targets.kind import TargetKind
from optlab.targets.templates import Secrets

__all__ = ["KIND", "Builtin"]


class Builtin(TargetKind):
    name = "builtin"
    in_process = True

    def knob_model(self, target: Target, paths: Sequence[Path]) -> type[BaseModel] | None:
        return BuiltinKnobs

    def resolve_inputs(self, workload: Workload, source: SourceFile) -> Workload:
        # Checked here, at load, so a typo in the payload spec names its line before any run.
        try:
            inputs = ImageInputs.model_validate(workload.inputs).model_dump(mode="json")
        except ValidationError as exc:
            raise config_error(exc, ImageInputs, source, ("workload", "inputs")) from exc
        return workload.model_copy(update={"inputs": inputs})

    def identity(self, target: Mapping[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
        return reference_identity()

    def build(
        self, config: ResolvedConfig, paths: Sequence[Path], secrets: Secrets
    ) -> LoadedTarget:
        from optlab.reference import pipeline

        # build(knobs) and inputs(workload), like a python target's factory and inputs.
        built = pipeline.build(config.knobs)
        return in_process_target(
            built,
            lambda: pipeline.inputs(config.workload),
            "builtin image-classifier",
            "image-classifier",
        )

    def image_payloads(self, workload: Workload) -> list[bytes]:
        """The JPEGs an ImageInputs workload renders: an http or command target's `images`."""
        from optlab.reference import pipeline

        return [sample.jpeg for sample in pipeline.inputs(workload)]


KIND = Builtin()
