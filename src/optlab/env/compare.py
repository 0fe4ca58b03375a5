"""Comparing two environment fingerprints: which differences are material.

Two runs compare only when nothing that can move performance changed in between: the
material/immaterial rule lives in one place, `_IMMATERIAL_PREFIXES`. Collecting a fingerprint
is `optlab.env.collect`'s job.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from optlab.config.canonical import canonical_json
from optlab.config.diff import ABSENT, leaf_changes
from optlab.config.source import KeyPath

# Dotted path prefixes that never make two runs incomparable. `*` matches any one path segment.
# Everything else is material: when in doubt, a field refuses the comparison rather than hiding a
# change that could move latency.
_IMMATERIAL_PREFIXES: frozenset[str] = frozenset(
    {
        "runtime",
        "provenance",
        "warnings",
        "hardware.disk.free_bytes",
        # The path depends on where the user happened to run from; the volume's size and
        # filesystem type are what matter, and those stay material.
        "hardware.disk.path",
        # Why NVML failed is a diagnostic; whether GPUs were seen is captured by hardware.gpus.
        "hardware.gpu_error",
        # A different physical card of the same model is the same hardware, just as a different
        # hostname is the same machine type.
        "hardware.gpus.*.uuid",
        "software.python.executable",
        # A load node's address may change with each start (a pod's IP); its host name, its
        # hardware and software stay material: the node set is part of the environment.
        "hosts.nodes.*.ip",
        # A command target's service (optlab.targets.service_env): where its interpreter or
        # program lives, and why it could not be asked, are diagnostics; its version, packages,
        # size and sha256 are what run, and stay material. A declared code_version is compared
        # as part of the code identity already.
        "service.program",
        "service.interpreter",
        "service.script",
        "service.prefix",
        "service.path",
        "service.declared",
        "service.error",
    }
)


@dataclass(frozen=True)
class EnvDifference:
    path: str
    old: Any
    new: Any
    material: bool


@dataclass(frozen=True)
class EnvComparison:
    material: list[EnvDifference]
    immaterial: list[EnvDifference]
    # Top-level sections only one side records (a run from before optlab recorded a service's
    # environment): explained in one line each rather than one line per package.
    one_sided: tuple[str, ...] = ()

    @property
    def comparable(self) -> bool:
        return not self.material

    def explain(self) -> str:
        lines: list[str] = []
        for section in self.one_sided:
            inside = [d for d in self.material if d.path.split(".")[0] == section]
            if inside:
                recorded = f"recorded ({len(inside)} material fields)"
                old, new = (ABSENT, recorded) if inside[0].old is ABSENT else (recorded, ABSENT)
                lines.append(f"{section}: {old} -> {new}")
        lines += [
            f"{d.path}: {d.old!r} -> {d.new!r}"
            for d in self.material
            if d.path.split(".")[0] not in self.one_sided
        ]
        return "\n".join(lines)


def _is_immaterial(path: str) -> bool:
    segments = path.split(".")
    for prefix in _IMMATERIAL_PREFIXES:
        wanted = prefix.split(".")
        if len(wanted) <= len(segments) and all(
            w in ("*", s) for w, s in zip(wanted, segments, strict=False)
        ):
            return True
    return False


def compare_fingerprints(old: dict[str, Any], new: dict[str, Any]) -> EnvComparison:
    """Every leaf that differs, split by the one material/immaterial rule.

    Tolerates fingerprints from older schemas: a key only one side has is a difference whose
    other side is `ABSENT`, never an error.
    """
    material: list[EnvDifference] = []
    immaterial: list[EnvDifference] = []
    changes = leaf_changes(old, new)
    for change in sorted(changes, key=lambda c: _dotted(c.keys)):
        path = _dotted(change.keys)
        is_material = not _is_immaterial(path)
        diff = EnvDifference(path=path, old=change.old, new=change.new, material=is_material)
        (material if is_material else immaterial).append(diff)
    one_sided = tuple(
        sorted(
            key
            for key in old.keys() ^ new.keys()
            if isinstance(old.get(key, new.get(key)), dict) and old.get(key, new.get(key))
        )
    )
    return EnvComparison(material=material, immaterial=immaterial, one_sided=one_sided)


def _material_subtree(value: Any, prefix: str) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if not _is_immaterial(path):
                out[str(key)] = _material_subtree(item, path)
        return out
    if isinstance(value, list | tuple):
        return [
            _material_subtree(item, f"{prefix}.{i}" if prefix else str(i))
            for i, item in enumerate(value)
        ]
    return value


def material_view(fp: dict[str, Any]) -> dict[str, Any]:
    """The fingerprint with every immaterial field removed."""
    view: dict[str, Any] = _material_subtree(fp, "")
    return view


def material_hash(fp: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the material view: equal hashes mean comparable."""
    canonical = canonical_json(material_view(fp), ascii_only=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _dotted(keys: KeyPath) -> str:
    return ".".join(str(k) for k in keys)
