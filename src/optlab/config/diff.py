"""The one tree diff: experiment configs (the one-variable rule) and fingerprints (comparability)
are both compared leaf by leaf here, with one marker for a key only one side has."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from optlab.config.source import KeyPath


class _Absent(enum.StrEnum):
    """A key only one side has (None is a legitimate value). An enum member stays one object
    through copy and pickle, so `is ABSENT` works; a str, so json.dumps works."""

    ABSENT = "<absent>"

    def __repr__(self) -> str:
        return "<absent>"


ABSENT = _Absent.ABSENT

# A key printed bare in a path; any other key (a dot, a space, a slash) is printed quoted, so
# the knob "lr.decay" never reads like the field decay of a knob lr.
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def describe_key(key: str | int) -> str:
    if isinstance(key, int):
        return f"[{key}]"
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def describe_path(keys: KeyPath) -> str:
    """For humans only: `knobs.batching.max_batch_size`, `knobs."lr.decay"`, `hosts[0]`.
    Code compares and groups the tuple itself, never this text."""
    out = ""
    for key in keys:
        part = describe_key(key)
        out += part if isinstance(key, int) or not out else f".{part}"
    return out


@dataclass(frozen=True)
class PathChange:
    """One place that differs: ("knobs", "batching", "max_batch_size"), old -> new."""

    keys: KeyPath
    old: Any
    new: Any

    @property
    def path(self) -> str:
        return describe_path(self.keys)


def same(old: Any, new: Any) -> bool:
    """Equal and of one type: 1 == 1.0 == True in Python, but a changed type is a change."""
    return type(old) is type(new) and bool(old == new)


def diff_values(
    old: Any, new: Any, prefix: KeyPath = (), *, into_lists: bool = False
) -> list[PathChange]:
    """Every place where `old` and `new` differ. Mappings are compared key by key (old's order,
    then keys only `new` has); with `into_lists`, two non-empty lists index by index too (an
    empty list is a value of its own). Anything
    else, a mapping against a non-mapping included, is one change at its path."""
    if isinstance(old, dict) and isinstance(new, dict):
        changes: list[PathChange] = []
        for key in [*old, *(k for k in new if k not in old)]:
            changes += diff_values(
                old.get(key, ABSENT), new.get(key, ABSENT), (*prefix, key), into_lists=into_lists
            )
        return changes
    if into_lists and _indexable(old) and _indexable(new) and old and new:
        changes = []
        for i in range(max(len(old), len(new))):
            before = old[i] if i < len(old) else ABSENT
            after = new[i] if i < len(new) else ABSENT
            changes += diff_values(before, after, (*prefix, i), into_lists=True)
        return changes
    if same(old, new):
        return []
    return [PathChange(prefix, old, new)]


def leaves(value: Any, prefix: KeyPath = ()) -> Iterator[tuple[KeyPath, Any]]:
    """The facts a value states, one per leaf. An empty mapping states none; an empty list is
    a leaf (so "no GPUs" against a missing key still differs)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*prefix, key))
    elif _indexable(value) and value:
        for index, item in enumerate(value):
            yield from leaves(item, (*prefix, index))
    else:
        yield prefix, value


def leaf_changes(old: Any, new: Any) -> list[PathChange]:
    """`diff_values` into lists, with every change that involves a mapping or list spelled
    out leaf by leaf: a section only one side records is one change per fact in it."""
    out: list[PathChange] = []
    for change in diff_values(old, new, into_lists=True):
        before = dict(leaves(change.old, change.keys)) if change.old is not ABSENT else {}
        after = dict(leaves(change.new, change.keys)) if change.new is not ABSENT else {}
        for keys in [*before, *(k for k in after if k not in before)]:
            b, a = before.get(keys, ABSENT), after.get(keys, ABSENT)
            if not same(b, a):
                out.append(PathChange(keys, b, a))
    return out


def _indexable(value: Any) -> bool:
    return isinstance(value, list | tuple)
