"""Which load generator drives a target: threads for in-process callables, an event loop for a
network client, worker processes when `load.processes` asks for more than one."""

from __future__ import annotations

from pathlib import Path

from optlab.config.models import Workload
from optlab.errors import ConfigError
from optlab.load.aio import AsyncLoadGenerator
from optlab.load.base import LoadGenerator
from optlab.load.generator import ThreadLoadGenerator
from optlab.load.processes import ProcessLoadGenerator
from optlab.targets.base import LoadedTarget
from optlab.targets.command import parent_death_signal
from optlab.targets.http import classify

__all__ = ["generator_for"]


def generator_for(
    target: LoadedTarget, workload: Workload, trace_dir: Path | None
) -> LoadGenerator:
    load = workload.load
    timeout_s = workload.timeout_ms / 1000
    if target.client is None:
        if load.generators > 1:
            raise ConfigError(
                f"workload.load.processes: {load.processes} generator processes need a target "
                "measured over the network (kind http or command); this target runs inside "
                "optlab's own process",
                hint="remove `processes`, or serve the model and measure it over HTTP",
            )
        return ThreadLoadGenerator(
            target.call,
            target.requests,
            load,
            timeout_s=timeout_s,
            seed=workload.seed,
            trace_dir=trace_dir,
        )
    if load.hosts is not None:
        from optlab.load.hosts import RayLoadGenerator, connect

        return RayLoadGenerator(
            target.client,
            load,
            connect(load.hosts),
            classify=classify,
            timeout_s=timeout_s,
            seed=workload.seed,
            trace_dir=trace_dir,
            parent_death=parent_death_signal,
        )
    if load.processes > 1:
        return ProcessLoadGenerator(
            target.client,
            load,
            processes=load.processes,
            classify=classify,
            timeout_s=timeout_s,
            seed=workload.seed,
            trace_dir=trace_dir,
            parent_death=parent_death_signal,
        )
    return AsyncLoadGenerator(
        target.client.build(),
        len(target.client.bodies),
        load,
        classify=classify,
        timeout_s=timeout_s,
        seed=workload.seed,
        trace_dir=trace_dir,
    )
