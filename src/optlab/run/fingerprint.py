"""The target's part of a run's fingerprint: optlab's version, the target's code identity, and
the environment of a service optlab starts (its interpreter and packages)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from optlab._version import __version__
from optlab.chain.catalog import Catalog, file_chain
from optlab.config.loading import ExperimentFile, load_experiment, search_paths
from optlab.config.models import BaselineFile, Workload
from optlab.errors import OptlabError
from optlab.targets.identity import code_identity
from optlab.targets.service_env import service_environment


def baseline_file(experiment: Path) -> ExperimentFile | None:
    """The file that names the target: the experiment itself when it is a baseline, else its
    chain's baseline found through the files beside it; None when a parent has no file (it is
    known only to the database) or the chain cannot be walked."""
    loaded = load_experiment(experiment)
    if isinstance(loaded.spec, BaselineFile):
        return loaded
    try:
        chain = file_chain(loaded, Catalog.scan(loaded.path.resolve().parent))
    except OptlabError:
        return None
    root = chain[-1]
    if isinstance(root, ExperimentFile) and isinstance(root.spec, BaselineFile):
        return root
    return None


def code_section(experiment: Path | None) -> dict[str, Any]:
    """optlab's version, and the target's code identity when an experiment file is named.

    Only a baseline names its target; for a step it is its chain's baseline's.
    """
    section: dict[str, Any] = {"optlab": __version__}
    if experiment is None:
        return section

    loaded = baseline_file(experiment)
    if loaded is not None:
        assert isinstance(loaded.spec, BaselineFile)
        target = loaded.spec.target.model_dump(mode="json")
        section["target"] = code_identity(target, search_paths(loaded.source))
    return section


def service_section(experiment: Path | None) -> tuple[dict[str, Any] | None, str | None]:
    """The fingerprint's `service` section for the experiment's target (None unless optlab
    starts the service: a command target), and the target's kind (None without a file)."""
    if experiment is None:
        return None, None

    loaded = baseline_file(experiment)
    if loaded is None:
        return None, None
    assert isinstance(loaded.spec, BaselineFile)
    target = loaded.spec.target.model_dump(mode="json")
    return service_environment(target, search_paths(loaded.source)[0]), target.get("kind")


def hosts_section(workload: dict[str, Any] | Workload | None) -> dict[str, Any] | None:
    """The fingerprint's `hosts` section for a load sent from a Ray cluster's nodes (None for
    a load sent from this machine): the node set and each node's environment. Joining the
    cluster and probing each node refuses, before any run row, an unreachable address, too
    few nodes or CPUs, and a node without optlab or at another version."""
    if workload is None:
        return None
    if not isinstance(workload, Workload):
        workload = Workload.model_validate(workload)
    if workload.load.hosts is None:
        return None
    from optlab.load.hosts import connect

    return connect(workload.load.hosts).fingerprint()


def baseline_hosts(experiment: Path | None) -> dict[str, Any] | None:
    """`hosts_section` of the experiment's chain's load (its baseline's workload)."""
    if experiment is None:
        return None
    loaded = baseline_file(experiment)
    if loaded is None:
        return None
    assert isinstance(loaded.spec, BaselineFile)
    return hosts_section(loaded.spec.workload)
