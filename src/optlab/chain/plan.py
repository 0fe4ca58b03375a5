"""The one-variable rule: a step's resolved config against its parent's, as a Plan or a refusal."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from optlab.config.diff import ABSENT, PathChange, describe_key, diff_values
from optlab.config.models import BASELINE_ONLY_KEYS
from optlab.config.source import SourceFile
from optlab.errors import RefusedError


@dataclass(frozen=True)
class VariableChange:
    """One variable (a top-level knob) and every field of it that changed."""

    name: str
    old: Any
    new: Any
    fields: tuple[PathChange, ...]

    def describe(self) -> str:
        return f"{describe_key(self.name)}: {render_value(self.old)} -> {render_value(self.new)}"


@dataclass(frozen=True)
class Plan:
    """What a run of this experiment will measure, and the one thing it changes."""

    experiment: str
    parent: str | None
    config: dict[str, Any]
    config_hash: str
    variable: VariableChange | None  # None for a baseline, or a declared repeat
    repeat: bool = False


def render_value(value: Any) -> str:
    """Compact, YAML-like: what the user wrote, not Python's repr."""
    if value is ABSENT:
        return "(absent)"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {render_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(render_value(v) for v in value) + "]"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def group_by_variable(old_knobs: dict[str, Any], new_knobs: dict[str, Any]) -> list[VariableChange]:
    """Knob diffs grouped by top-level knob: fields of one group change together as one.
    The group is the first key of the path tuple: a knob named "lr.decay" is its own
    variable, not a field of a knob "lr"."""
    groups: dict[str, list[PathChange]] = {}
    for change in diff_values(old_knobs, new_knobs):
        groups.setdefault(str(change.keys[0]), []).append(change)
    return [
        VariableChange(
            name, old_knobs.get(name, ABSENT), new_knobs.get(name, ABSENT), tuple(fields)
        )
        for name, fields in groups.items()
    ]


def check_change_keys(change: dict[str, Any], source: SourceFile) -> None:
    """Refuse a step that touches what defines a baseline (target, workload, protocol, SLO)."""
    touched = [k for k in change if k in BASELINE_ONLY_KEYS]
    if touched:
        names = ", ".join(touched)
        raise RefusedError(
            f"{source.where(('change', touched[0]))}: refused: the change sets {names}. "
            f"{names} define what is measured and how, so a step may not change them: "
            "results measured under a different target, workload, protocol or SLO are not "
            "comparable with the parent's",
            hint="start a new baseline: copy the parent's config into a file without `parent`, "
            f"with a new `name`, and set {names} there; then build the steps on it",
        )


def plan_step(
    *,
    name: str,
    parent: str,
    parent_config: dict[str, Any],
    config: dict[str, Any],
    config_hash: str,
    change: dict[str, Any],
    repeat: bool,
    source: SourceFile,
    new_knob: bool = False,
) -> Plan:
    """Allow exactly one changed variable; refuse with everything the user needs to fix it."""
    hidden = [
        c
        for section in BASELINE_ONLY_KEYS
        for c in diff_values(parent_config.get(section), config.get(section), (section,))
    ]
    if hidden:
        raise RefusedError(
            f"{source.path}: refused: {name!r} differs from {parent!r} outside the knobs: "
            + "; ".join(
                f"{c.path}: {render_value(c.old)} -> {render_value(c.new)}" for c in hidden
            ),
            hint="these define a baseline; start a new baseline with a new name",
        )
    variables = group_by_variable(parent_config["knobs"], config["knobs"])
    check_new_knobs(variables, parent, parent_config["knobs"], source, new_knob)
    if not variables:
        if repeat:
            return Plan(name, parent, config, config_hash, None, repeat=True)
        same = ", ".join(change) if change else "nothing"
        raise RefusedError(
            f"{source.path}: refused: {name!r} changes no variable against {parent!r} "
            f"(its change sets {same}, which the parent already has)",
            hint="change one knob, or add `repeat: true` to the file to measure the parent's "
            "config again on purpose",
        )
    if len(variables) > 1:
        listing = "\n".join("  " + v.describe() for v in variables)
        proposal = "\n".join(
            f"  {f.filename}: name {f.name}, parent {f.parent}, change {render_value(f.change)}"
            for f in propose_split(name, parent, source, variables, change)
        )
        raise RefusedError(
            f"{source.path}: refused: {name!r} changes {len(variables)} variables against "
            f"{parent!r}; optlab measures one at a time:\n{listing}",
            hint=f"split it into a chain of one-variable steps; `optlab split {source.path}` "
            f"writes these files:\n{proposal}",
        )
    if repeat:
        raise RefusedError(
            f"{source.path}: refused: `repeat: true` but the change sets {variables[0].describe()}",
            hint="remove `repeat: true` (it is only for measuring the parent's config again)",
        )
    return Plan(name, parent, config, config_hash, variables[0])


def check_new_knobs(
    variables: list[VariableChange],
    parent: str,
    parent_knobs: dict[str, Any],
    source: SourceFile,
    declared: bool,
) -> None:
    """A key the parent's knobs lack is a new variable only when the step says so: a
    misspelt knob (`batchsize` for `batch_size`) would otherwise pass as one, and measure
    the parent's config again under a new name. `new_knob: true` on a step that adds no
    knob is refused too, so the marker never waves a later misspelling through."""
    new = [v for v in variables if v.old is ABSENT]
    if declared:
        if variables and not new:
            raise RefusedError(
                f"{source.path}: refused: `new_knob: true` but the change only sets knobs "
                f"{parent!r} already has ({', '.join(describe_key(v.name) for v in variables)})",
                hint="remove `new_knob: true` (it is only for a step that adds a knob)",
            )
        return
    if not new:
        return
    variable = new[0]
    close = difflib.get_close_matches(str(variable.name), [str(k) for k in parent_knobs], n=1)
    names = [str(k) for k in parent_knobs]
    known = ", ".join(names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
    raise RefusedError(
        f"{source.where(('change', variable.name))}: refused: {describe_key(variable.name)} is "
        f"not a knob of {parent!r} (its knobs: {known or 'none'})",
        hint=(f"did you mean {close[0]!r}? " if close else "")
        + "fix the key, or add `new_knob: true` to the file if the step adds this knob on "
        "purpose",
    )


MAX_NAME_CHARS = 100  # models.NAME_PATTERN
SLUG_CHARS = 40
STEM_BYTES = 120  # with the slug and suffix, well under the 255 bytes a file name may hold
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class SplitFile:
    filename: str
    name: str
    parent: str
    change: dict[str, Any]


def propose_split(
    name: str,
    parent: str,
    source: SourceFile,
    variables: Iterable[VariableChange],
    change: dict[str, Any],
) -> list[SplitFile]:
    """One file per variable, in the order the change lists them. The last keeps the
    original name, so steps that already name this experiment as parent still resolve.

    File and experiment names are derived from knob names, which may hold anything (a
    slash, a dot, 300 characters): they are reduced to safe characters, bounded, and made
    unique, so every proposed file can be written and loads as a valid experiment."""
    ordered = sorted(variables, key=lambda v: list(change).index(v.name) if v.name in change else 0)
    stem = _bounded(source.path.stem, STEM_BYTES)
    used_names = {name, parent}
    used_files = {source.path.name, f"{source.path.name}.orig"}
    files: list[SplitFile] = []
    previous = parent
    for index, variable in enumerate(ordered):
        if index == len(ordered) - 1:
            step_name, filename = name, source.path.name
        else:
            slug = knob_slug(variable.name)
            # 4 characters spare for "-" and a counter: the name stays within NAME_PATTERN.
            step_name = _unique(f"{name[: MAX_NAME_CHARS - len(slug) - 4]}-{slug}", "", used_names)
            filename = _unique(f"{stem}-{slug}", source.path.suffix, used_files)
        files.append(
            SplitFile(filename, step_name, previous, {variable.name: change[variable.name]})
        )
        previous = step_name
    return files


def knob_slug(knob: str) -> str:
    """A knob name as a safe part of file and experiment names: letters, digits, '-' and '_'
    (no '/', no dots, so never `..` or a hidden file), at most SLUG_CHARS."""
    return _UNSAFE.sub("-", knob).strip("-_")[:SLUG_CHARS].strip("-_") or "knob"


def _bounded(text: str, limit: int) -> str:
    while len(text.encode()) > limit:
        text = text[:-1]
    return text


def _unique(base: str, tail: str, used: set[str]) -> str:
    """base+tail, or base-2+tail, base-3+tail...: the first not used yet (two knobs may share
    a slug: "a/b" and "a.b" are both "a-b")."""
    counter = 1
    while True:
        candidate = f"{base}{'' if counter == 1 else f'-{counter}'}{tail}"
        if candidate not in used:
            used.add(candidate)
            return candidate
        counter += 1
