"""`--promote`: a knob sweep's value becomes the next numbered step file beside its parent
(docs/sweep-knob-json.md), so the stacked-gains table grows by one row; one file per
experiment name, however often the sweep or a tune is asked."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import yaml

from optlab.errors import OptlabError
from optlab.knobs.decision import promotable
from optlab.knobs.spec import value_key

__all__ = ["promote"]


class PromotableArm(Protocol):
    """A sweep's arm as promotion reads it: its value, experiment name and sibling file."""

    @property
    def value(self) -> Any: ...

    @property
    def experiment(self) -> str: ...

    @property
    def path(self) -> Path: ...


_NUMBERED = re.compile(r"^(\d+)-")


def promote(
    path: Path, document: dict[str, Any], arms: Sequence[PromotableArm]
) -> tuple[Path | None, str]:
    """Move the promoted value's sibling file beside the parent's, numbered after the folder's
    highest, its hypothesis the sweep's sentence: the stacked-gains table grows by one row (its
    runs are the sweep's, compared with the parent block by block)."""
    pick = promotable(document)
    if pick is None:
        return None, f"nothing promoted: {document['sentence']}"
    arm = next(a for a in arms if value_key(a.value) == value_key(pick))
    folder = path.resolve().parent
    there = _defining(folder, arm.experiment)
    if there is not None:
        # Promoted before (a sweep or tune asked again): one step file per experiment name,
        # and the sibling written again for this sweep goes, as a promotion moves it.
        arm.path.unlink(missing_ok=True)
        return there, f"{document['knob']} = {pick} is a step beside the parent already: {there}"
    found = [m for p in folder.iterdir() if (m := _NUMBERED.match(p.name))]
    numbers = [int(m.group(1)) for m in found]
    width = max((len(m.group(1)) for m in found), default=2)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{document['knob']}-{pick}").strip("_")
    name = f"{(max(numbers) + 1 if numbers else 1):0{width}d}-{slug}.yaml"
    target = folder / name
    if target.exists():
        raise OptlabError(
            f"--promote: {target} exists already", hint="rename or remove it, then run again"
        )
    data = yaml.safe_load(arm.path.read_text(encoding="utf-8"))
    data["hypothesis"] = f"sweep-knob {document['knob_sweep_id']}: {document['sentence']}"
    target.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), encoding="utf-8")
    arm.path.unlink()
    return target, f"promoted {document['knob']} = {pick} to {target}"


def _defining(folder: Path, experiment: str) -> Path | None:
    """The YAML file in `folder` whose `name` is `experiment`, if any."""
    for candidate in sorted(folder.glob("*.y*ml")):
        try:
            data = yaml.safe_load(candidate.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue  # not a step file optlab wrote; the folder's loader reports it
        if isinstance(data, dict) and data.get("name") == experiment:
            return candidate.resolve()
    return None
