"""The load modes (`workload.load.mode`, docs/experiment-files.md): the registry.

One module per mode holds its model and its `LoadMode` (what a generator, the run's summary,
the machine limits and a sweep ask of a load). Adding a mode is that one module and its two
entries here, side by side: its model in the `Load` union (the file's schema) and its class in
`MODES`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from optlab.config.modes.base import (
    MAX_CONCURRENCY,
    MAX_PROCESSES,
    MAX_RATE,
    IndexedTrace,
    LoadCommon,
    LoadMode,
    Schedule,
)
from optlab.config.modes.closed import Closed, ClosedLoad
from optlab.config.modes.open import Open, OpenLoad
from optlab.config.modes.ramp import Ramp, RampLoad
from optlab.config.modes.replay import REPLAY_MAX_IN_FLIGHT, Replay, ReplayLoad

__all__ = [
    "MAX_CONCURRENCY",
    "MAX_PROCESSES",
    "MAX_RATE",
    "MODES",
    "REPLAY_MAX_IN_FLIGHT",
    "ClosedLoad",
    "IndexedTrace",
    "Load",
    "LoadCommon",
    "LoadMode",
    "OpenLoad",
    "RampLoad",
    "ReplayLoad",
    "Schedule",
    "mode_named",
    "mode_of",
    "step",
]

Load = Annotated[ClosedLoad | OpenLoad | ReplayLoad | RampLoad, Field(discriminator="mode")]

_MODES: tuple[LoadMode[Any], ...] = (Closed(), Open(), Replay(), Ramp())
MODES: dict[str, LoadMode[Any]] = {mode.name: mode for mode in _MODES}

_BY_MODEL = {mode.model: mode for mode in MODES.values()}


def mode_named(name: str) -> LoadMode[Any]:
    """The mode a `mode:` value names (a stored run's `load`, say)."""
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"no load mode {name!r}; the modes are {', '.join(MODES)}") from None


def mode_of(load: LoadCommon) -> LoadMode[Any]:
    """The mode of a validated load model."""
    try:
        return _BY_MODEL[type(load)]
    except KeyError:
        raise TypeError(f"{type(load).__name__} is not a load mode's model") from None


def step(load: LoadCommon, axis: Literal["open", "closed"], level: float) -> LoadCommon:
    """The experiment's `load` at a sweep's level: `level` clients on the closed axis, or
    `level` requests/s on the open one, kept in the experiment's own mode where it can be."""
    return mode_of(load).step(load, MODES[axis], level)
