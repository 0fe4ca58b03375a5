"""What `optlab sweep-knob` is asked: one knob (a top-level knob, or a field inside one), its
values, and the sibling step files that each change only that knob against the parent.

Everything here is checked before anything is measured: a knob the parent does not have, one
value, duplicate values, a KEY naming two variables, a value the target's knob model refuses
(each sibling goes through the same loading and one-variable rule as any step file). A refusal
exits 2 with the fix (docs/exit-codes.md); sibling files written by a refused request are
removed again.
"""

from __future__ import annotations

import contextlib
import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from optlab.chain.lineage import plan_file
from optlab.config.canonical import canonical_json
from optlab.config.loading import load_experiment
from optlab.config.models import NAME_PATTERN
from optlab.errors import ConfigError, OptlabError
from optlab.store import StoredConfig

__all__ = [
    "KNOB_FOLDER",
    "KnobRequest",
    "Sibling",
    "parse_key",
    "parse_values",
    "sibling_name",
    "value_key",
    "write_siblings",
]

# Sibling step files live here, beside the parent's file: out of the folder's own chain (a
# folder's experiments are its files, not its subfolders'), one folder per parent and knob.
KNOB_FOLDER = "knob-sweeps"
_SLUG = re.compile(r"[^A-Za-z0-9._-]+")
_NAME = re.compile(NAME_PATTERN)
_MAX_NAME = 100


@dataclass(frozen=True)
class KnobRequest:
    """The knob as a path in the knobs mapping, and the values asked for, in order."""

    key: str
    path: tuple[str, ...]
    values: tuple[Any, ...]


@dataclass(frozen=True)
class Sibling:
    """One value's step: its experiment name and file."""

    value: Any
    name: str
    path: Path


def parse_key(key: str, knobs: dict[str, Any], where: str) -> tuple[str, ...]:
    """KEY as a path into the parent's knobs (`batching.max_batch_size`; a leading `knobs.`
    is allowed): one variable, which the parent has."""
    text = key.strip()
    if text.startswith("knobs."):
        text = text[len("knobs.") :]
    if not text or any(sep in text for sep in (",", "+", " ", ";")):
        raise OptlabError(
            f"--knob {key!r} names {'no knob' if not text else 'more than one variable'}",
            hint="sweep one knob at a time: --knob NAME or --knob NAME.FIELD (e.g. "
            "batching.max_batch_size); `optlab tune EXP --knobs a,b` sweeps several in turn",
        )
    path = tuple(text.split("."))
    if any(not part for part in path):
        raise OptlabError(f"--knob {key!r} has an empty part", hint="e.g. batching.max_batch_size")
    if path[0] not in knobs:
        guess = difflib.get_close_matches(path[0], list(knobs), n=1)
        raise OptlabError(
            f"--knob {key!r}: {where} has no knob {path[0]!r}",
            hint=(f"did you mean {guess[0]!r}? " if guess else "")
            + f"its knobs: {', '.join(sorted(knobs)) or 'none'}",
        )
    node: Any = knobs
    for depth, part in enumerate(path[:-1]):
        node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            inside = ".".join(path[: depth + 1])
            raise OptlabError(
                f"--knob {key!r}: {inside} in {where} is not a mapping with fields",
                hint=f"sweep {inside} itself, or set it to a mapping in the parent first",
            )
    return path


def current_value(knobs: dict[str, Any], path: Sequence[str]) -> Any:
    """The parent's value at `path`; None where the field is not set."""
    node: Any = knobs
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def value_key(value: Any) -> str:
    """A value's identity among the values of one knob: 2 and 2.0 are one value."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return canonical_json(float(value))
    return canonical_json(value)


def _typed(text: str, like: Any) -> Any:
    """One value as YAML reads it, but kept a string where the parent's value is a string
    (YAML 1.1 reads `off` and `no` as false: a mode named "off" must stay "off")."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise OptlabError(
            f"--values: {text!r} is not a value: {exc}", hint="e.g. --values 1,2,4,8"
        ) from exc
    if isinstance(like, str) and not isinstance(value, str):
        return text
    return value


def parse_values(text: str, like: Any) -> tuple[Any, ...]:
    """Comma-separated values, typed as YAML reads them (`like` is the parent's value)."""
    parts = [p.strip() for p in text.split(",")]
    if any(not p for p in parts):
        raise OptlabError(
            f"--values {text!r} has an empty value",
            hint="separate the values with commas, e.g. --values 1,2,4,8",
        )
    values = tuple(_typed(p, like) for p in parts)
    seen: dict[str, str] = {}
    for raw, value in zip(parts, values, strict=True):
        key = value_key(value)
        if key in seen:
            raise OptlabError(
                f"--values lists {raw!r} twice"
                + (f" (as {seen[key]!r} too)" if seen[key] != raw else ""),
                hint="list each value once; the parent's own value is measured as the control "
                "in every block whether it is listed or not",
            )
        seen[key] = raw
    if len(values) < 2:
        raise OptlabError(
            f"--values {text!r} is one value: there is nothing to choose between",
            hint="give two or more values (to measure one change, write a step and "
            "`optlab run` it)",
        )
    return values


def _slug(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # 2 and 2.0 are one value (`value_key`): one sibling, one name
    text = value if isinstance(value, str) else canonical_json(value)
    return _SLUG.sub("_", text).strip("_") or "value"


def sibling_name(parent: str, path: Sequence[str], value: Any) -> str:
    """`<parent>.<knob>-<value>`, an experiment name (NAME_PATTERN); shortened with a hash of
    the whole where it is too long, so two parents' siblings never share a name."""
    name = f"{parent}.{'.'.join(path)}-{_slug(value)}"
    if len(name) <= _MAX_NAME and _NAME.match(name):
        return name
    import hashlib

    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    short = f"{_slug('.'.join(path))}-{_slug(value)}"[: _MAX_NAME - 12]
    return f"{short}.{digest}"


def _change(path: Sequence[str], value: Any) -> dict[str, Any]:
    change: Any = value
    for part in reversed(path):
        change = {part: change}
    assert isinstance(change, dict)
    return change


def write_siblings(
    parent_path: Path,
    parent: StoredConfig,
    parent_name: str,
    request: KnobRequest,
    hypothesis: str,
) -> list[Sibling]:
    """One step file per value other than the parent's (`hypothesis` with `{}` for the
    value), each changing only the knob; each
    loaded and planned like any step file (the target's knob model and the one-variable rule),
    so a refused value stops everything before a run. Files this call wrote are removed again
    when it refuses."""
    knobs = parent.config.get("knobs", {})
    folder = parent_path.resolve().parent / KNOB_FOLDER / f"{parent_name}.{request.key}"
    made = [d for d in (folder, folder.parent) if not d.exists()]  # removed again on refusal
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OptlabError(
            f"cannot write the sibling steps to {folder}: {exc.strerror or exc}",
            hint=f"make {folder.parent.parent} writable, or copy the experiments somewhere "
            "that is and sweep from there",
        ) from exc
    current = current_value(knobs, request.path)
    written: list[Path] = []
    siblings: list[Sibling] = []
    try:
        for value in request.values:
            if value_key(value) == value_key(current):
                continue  # the parent's own value: the control arm
            name = sibling_name(parent_name, request.path, value)
            path = folder / f"{name}.yaml"
            text = yaml.safe_dump(
                {
                    "name": name,
                    "parent": parent_name,
                    "hypothesis": hypothesis.replace("{}", _slug(value)),
                    "change": _change(request.path, value),
                },
                sort_keys=False,
                allow_unicode=True,
            )
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                if not path.exists():
                    written.append(path)
                try:
                    path.write_text(text, encoding="utf-8")
                except OSError as exc:
                    raise OptlabError(
                        f"cannot write {path}: {exc.strerror or exc}",
                        hint=f"free space or permissions in {folder}",
                    ) from exc
            try:
                plan = plan_file(load_experiment(path), parent)
            except ConfigError as exc:
                # The knob model's reason names the file, line and bound; a suggestion of its
                # own ("did you mean ...") is kept, the generic file-layout hint is not.
                hint = exc.hint if exc.hint and "did you mean" in exc.hint else None
                raise ConfigError(
                    f"--values {_slug(value)}: {exc.message}",
                    hint=hint
                    or f"give --values that {request.key} accepts (the reason above is the "
                    "knob model's); nothing was measured",
                ) from exc
            variable = plan.variable
            if variable is None or variable.name != request.path[0]:
                raise OptlabError(
                    f"--knob {request.key} = {value!r} changes "
                    f"{variable.name if variable is not None else 'nothing'}, not one knob",
                    hint="sweep one knob at a time",
                )
            siblings.append(Sibling(value, name, path))
    except BaseException:
        for path in written:
            path.unlink(missing_ok=True)
        for made_dir in made:  # innermost first; only if this call left them empty
            with contextlib.suppress(OSError):
                made_dir.rmdir()
        raise
    return siblings


def derive_step(
    parent_path: Path, parent: StoredConfig, parent_name: str, path: Sequence[str], value: Any
) -> Path:
    """The step file that changes only `path` to `value` against the parent (`optlab tune`'s
    configs between sweeps): a sibling like a knob sweep's, written where they are."""
    key = ".".join(path)
    request = KnobRequest(key, tuple(path), (value,))
    siblings = write_siblings(parent_path, parent, parent_name, request, f"tune: {key} = {{}}")
    if not siblings:
        return parent_path  # the parent has that value already
    return siblings[0].path
