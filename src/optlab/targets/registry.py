"""The target kinds optlab knows, by name, each in a module of its own under `targets/kinds/`.

Kind modules are imported by name when first asked for: the builtin and synthetic kinds build
the reference workload (`optlab.reference`), which the tracker itself never imports, and a run
of an http target never loads the classifier's code. Adding a kind is one module there, one
line in KIND_MODULES, and its model in the experiment file's `target` union
(`optlab.config.models.Target`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from optlab.config.models import ResolvedConfig, Target, Workload
from optlab.errors import ConfigError
from optlab.targets.base import LoadedTarget
from optlab.targets.kind import TargetKind
from optlab.targets.templates import Secrets

__all__ = [
    "KIND_MODULES",
    "find_kind",
    "kind_named",
    "kind_of",
    "load_target",
    "reference_images",
]

KIND_MODULES = {
    "builtin": "optlab.targets.kinds.builtin",
    "synthetic": "optlab.targets.kinds.synthetic",
    "python": "optlab.targets.kinds.python",
    "http": "optlab.targets.kinds.http",
    "command": "optlab.targets.kinds.command",
    "openai": "optlab.targets.kinds.openai",
}
# An experiment file's `kind: builtin` is two kinds, told apart by the target's `name`.
BUILTIN_NAMES = {"image-classifier": "builtin", "synthetic": "synthetic"}


@runtime_checkable
class _RendersImages(Protocol):
    def image_payloads(self, workload: Workload) -> list[bytes]: ...


@cache
def kind_named(name: str) -> TargetKind:
    """The kind registered as `name` (a key of KIND_MODULES)."""
    dotted = KIND_MODULES.get(name)
    if dotted is None:
        raise ConfigError(
            f"target.kind: {name!r} is not a kind of target this optlab knows",
            hint=f"registered kinds: {', '.join(KIND_MODULES)}",
        )
    kind = importlib.import_module(dotted).KIND
    if not isinstance(kind, TargetKind):
        raise TypeError(f"{dotted}.KIND is not a TargetKind")
    return kind


def _registered(kind: object, builtin_name: object) -> str | None:
    if kind == "builtin":
        return BUILTIN_NAMES.get(str(builtin_name or "image-classifier"))
    if isinstance(kind, str) and kind in KIND_MODULES and kind not in BUILTIN_NAMES.values():
        return kind
    return None


def kind_of(target: Target) -> TargetKind:
    """The kind of a validated target."""
    name = _registered(target.kind, getattr(target, "name", None))
    if name is None:
        raise ConfigError(
            f"target.kind: {target.kind!r} has no module in optlab.targets.kinds",
            hint="register it in optlab.targets.registry.KIND_MODULES",
        )
    return kind_named(name)


def find_kind(target: Mapping[str, Any]) -> TargetKind | None:
    """The kind of a target as stored (a dict); None for a kind this optlab does not know."""
    name = _registered(target.get("kind"), target.get("name"))
    return kind_named(name) if name is not None else None


def load_target(
    config: ResolvedConfig, paths: Sequence[Path], secrets: Secrets | None = None
) -> LoadedTarget:
    """Build the target a resolved config names. Errors say which field to fix.

    `${ENV_VAR}` references are resolved into `secrets`, which the caller uses to redact
    everything it writes about the run.
    """
    chosen = secrets if secrets is not None else Secrets()
    return kind_of(config.target).build(config, paths, chosen)


def reference_images(workload: Workload) -> list[bytes]:
    """The reference classifier's rendered JPEGs for `workload` (its `inputs` an ImageInputs),
    as an http or command target's `images` bodies: the builtin kind renders them."""
    kind = kind_named("builtin")
    assert isinstance(kind, _RendersImages)
    return kind.image_payloads(workload)
