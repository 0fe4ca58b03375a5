"""Resolving `package.module:attribute` references to user code, with errors that name them."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from optlab.errors import ConfigError


@contextmanager
def search_path(paths: Sequence[Path]) -> Iterator[None]:
    """Put the experiment's folder (and friends) first on sys.path for the import only."""
    added = [str(p) for p in paths if str(p) not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for entry in added:
            if entry in sys.path:
                sys.path.remove(entry)


def import_reference(reference: str, paths: Sequence[Path], what: str) -> Any:
    """Import `module:attr` with `paths` searched first. `what` names the field for errors."""
    module_name, _, attribute = reference.partition(":")
    with search_path(paths):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            where = ", ".join(str(p) for p in paths) or "sys.path"
            raise ConfigError(
                f"{what}: cannot import module {module_name!r} ({exc})",
                hint=f"put {module_name.replace('.', '/')}.py in {where}, or install its package",
            ) from exc
        except Exception as exc:  # user code failed while importing: show what it raised
            raise ConfigError(
                f"{what}: importing {module_name!r} raised {type(exc).__name__}: {exc}",
                hint=f"fix the error in {module_name!r}; run `python -c 'import {module_name}'`",
            ) from exc
    try:
        return getattr(module, attribute)
    except AttributeError as exc:
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise ConfigError(
            f"{what}: module {module_name!r} has no attribute {attribute!r}",
            hint="names it defines: " + ", ".join(public[:20]),
        ) from exc


def import_knob_model(reference: str, paths: Sequence[Path]) -> type[BaseModel]:
    """A target's `knobs_model`: the user's pydantic model that validates its knobs."""
    found = import_reference(reference, paths, "target.knobs_model")
    if not (isinstance(found, type) and issubclass(found, BaseModel)):
        raise ConfigError(
            f"target.knobs_model: {reference!r} is not a pydantic model class",
            hint="point it at a class that subclasses pydantic.BaseModel, or remove the field "
            "to take free-form knobs",
        )
    return found


def module_origin(module_name: str, paths: Sequence[Path]) -> Path | None:
    """Where a module's source lives, without executing it (for hashing the code identity)."""
    top = module_name.split(".")[0]
    with search_path(paths):
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return None
    if spec is None or spec.origin in (None, "built-in", "frozen"):
        return None
    origin = Path(spec.origin)
    # A package's code identity is the whole package, since the factory may import siblings.
    return origin.parent if origin.name == "__init__.py" else origin
