"""The code part of a run's fingerprint: optlab's version and the target's code identity."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optlab
from optlab.config.loading import load_experiment, search_paths
from optlab.config.models import BaselineFile


def code_section(experiment: Path | None) -> dict[str, Any]:
    """optlab's version, and the target's code identity when an experiment file is named.

    Only a baseline names its target; for a step the target is its chain's baseline's,
    so the caller passes whichever file holds it.
    """
    section: dict[str, Any] = {"optlab": optlab.__version__}
    if experiment is None:
        return section
    from optlab.targets.identity import code_identity

    loaded = load_experiment(experiment)
    if isinstance(loaded.spec, BaselineFile):
        target = loaded.spec.target.model_dump(mode="json")
        section["target"] = code_identity(target, search_paths(loaded.source))
    return section
