"""`kind: builtin` with `name: synthetic`: a service with a configured service-time
distribution, the ground truth the tests and benchmarks measure against.

Its knob model lives with the service (`optlab.reference.synthetic.SyntheticKnobs`), imported
when the knobs are first checked. Its code identity is the reference workload's, as the
classifier's is (both are files of optlab itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from optlab.config.models import ResolvedConfig, Target
from optlab.targets.base import LoadedTarget, in_process_target
from optlab.targets.identity import reference_identity
from optlab.targets.kind import TargetKind
from optlab.targets.templates import Secrets

__all__ = ["KIND", "Synthetic"]


class Synthetic(TargetKind):
    name = "synthetic"
    in_process = True

    def knob_model(self, target: Target, paths: Sequence[Path]) -> type[BaseModel] | None:
        from optlab.reference.synthetic import SyntheticKnobs

        return SyntheticKnobs

    def identity(self, target: Mapping[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
        return reference_identity()

    def build(
        self, config: ResolvedConfig, paths: Sequence[Path], secrets: Secrets
    ) -> LoadedTarget:
        from optlab.reference import synthetic

        built = synthetic.build(config.knobs)
        return in_process_target(
            built, lambda: synthetic.inputs(config.workload), "builtin synthetic", "synthetic"
        )


KIND = Synthetic()
