"""A remedy: the one knob a finding of `optlab diagnose` changes, and to what (docs/diagnose.md
"From a finding to the next step"). Each target kind answers with its own (`TargetKind.remedy`);
python, http and command targets answer with what their experiment file declares
(`target.remedies`, `optlab.config.remedies.DeclaredRemedy`), applied here."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from optlab.config.remedies import DeclaredRemedy
from optlab.errors import ConfigError

__all__ = ["Remedy", "check_declared", "declared_remedy"]


@dataclass(frozen=True)
class Remedy:
    knob: str
    value: Any
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"knob": self.knob, "value": self.value, "why": self.why}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _applied(declared: DeclaredRemedy, current: Any) -> Any:
    """The knob's value after `declared`; None where it cannot apply (a numeric op on a value
    that is not a number, a result that is not finite), changes nothing (at its bound already,
    or an integer knob the op moves by less than one), or where the bound would move the knob
    against the op (a knob already past `max`)."""
    if "set" in declared.model_fields_set:
        return None if current == declared.set else declared.set
    number = _number(current)
    if number is None:
        return None
    if declared.increment is not None:
        raw = number + declared.increment
    else:
        assert declared.multiply is not None
        raw = number * declared.multiply
    new = raw if declared.max is None else min(raw, declared.max)
    if isinstance(current, int) and math.isfinite(new):
        new = float(round(new))  # an integer knob stays an integer (a count of workers)
    if not math.isfinite(new) or new == number or (new - number) * (raw - number) < 0:
        return None
    return int(new) if isinstance(current, int) else new


def declared_remedy(
    declared: Sequence[DeclaredRemedy], rule: str, stage: str | None, knobs: Mapping[str, Any]
) -> Remedy | None:
    """The first declared remedy for `rule` (on `stage`, where it names one) that changes its
    knob; None when none does."""
    for remedy in declared:
        if remedy.rule != rule or (remedy.stage is not None and remedy.stage != stage):
            continue
        value = _applied(remedy, knobs.get(remedy.knob))
        if value is not None:
            return Remedy(remedy.knob, value, remedy.why)
    return None


def check_declared(declared: Sequence[DeclaredRemedy], knobs: Mapping[str, Any]) -> None:
    """Refuse, at load, a declared remedy whose knob the config does not have, or whose numeric
    op meets a knob that is not a number (ConfigError without a location: the loader adds it)."""
    for i, remedy in enumerate(declared):
        where = f"target.remedies[{i}].knob"
        at = ("target", "remedies", i, "knob")
        if remedy.knob not in knobs:
            raise ConfigError(
                f"{where}: {remedy.knob!r} is not a knob of this config",
                hint=f"the knobs are: {', '.join(knobs) or 'none'}; a remedy changes one of them",
                at=at,
            )
        if "set" not in remedy.model_fields_set and _number(knobs[remedy.knob]) is None:
            raise ConfigError(
                f"{where}: {remedy.knob!r} is {knobs[remedy.knob]!r}, not a number to "
                "increment or multiply",
                hint="use set: VALUE for a knob that is not a number",
                at=at,
            )
