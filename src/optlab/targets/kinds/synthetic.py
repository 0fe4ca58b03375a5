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

import numpy as np
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

        built = synthetic.build(_seeded(config))
        return in_process_target(
            built, lambda: synthetic.inputs(config.workload), "builtin synthetic", "synthetic"
        )


def _seeded(config: ResolvedConfig) -> dict[str, Any]:
    """The knobs the service is built with: its `seed` knob mixed with the workload's seed
    when that is set, so runs with their own workload seed (a sweep's levels) get their own
    service draws as well as their own arrivals. Workload seed 0 (the default) leaves the
    knob's draws as they were."""
    workload_seed = config.workload.seed
    if not workload_seed:
        return dict(config.knobs)
    knob_seed = config.knobs.get("seed", 0)
    if not isinstance(knob_seed, int) or isinstance(knob_seed, bool):
        return dict(config.knobs)  # refused with its field named when the knobs are checked
    mixed = int(np.random.SeedSequence([knob_seed % 2**63, workload_seed]).generate_state(1)[0])
    return {**config.knobs, "seed": mixed}


KIND = Synthetic()
