"""Resolving `package.module:attribute` references to user code, with errors that name them."""

from __future__ import annotations

import difflib
import importlib
import importlib.machinery
import pkgutil
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


def _fresh_spec(top: str, paths: Sequence[Path]) -> importlib.machinery.ModuleSpec | None:
    """Where `top` would be imported from now, `paths` first, whatever sys.modules holds."""
    try:
        return importlib.machinery.PathFinder.find_spec(top, [str(p) for p in paths] + sys.path)
    except (ImportError, ValueError):
        return None


def _forget_stale(module_name: str, paths: Sequence[Path]) -> None:
    """Drop a module imported earlier in this process from another file than the one
    `paths` now lead to (two experiments' folders each with a `target.py`, a notebook
    measuring one then the other): importing would hand back the first folder's code."""
    top = module_name.split(".")[0]
    loaded = sys.modules.get(top)
    if loaded is None or getattr(loaded, "__file__", None) is None:
        return
    spec = _fresh_spec(top, paths)
    if spec is None or spec.origin is None or spec.origin == loaded.__file__:
        return
    for name in [n for n in sys.modules if n == top or n.startswith(top + ".")]:
        del sys.modules[name]


def import_reference(reference: str, paths: Sequence[Path], what: str) -> Any:
    """Import `module:attr` with `paths` searched first. `what` names the field for errors."""
    module_name, _, attribute = reference.partition(":")
    with search_path(paths):
        _forget_stale(module_name, paths)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            where = ", ".join(str(p) for p in paths) or "sys.path"
            close = _close_modules(module_name, exc.name, paths)
            raise ConfigError(
                f"{what}: cannot import module {module_name!r} ({exc})",
                hint=(f"did you mean {close!r}? " if close else "")
                + f"put {module_name.replace('.', '/')}.py in {where}, or install its package",
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
        nearest = difflib.get_close_matches(attribute, public, n=1)
        raise ConfigError(
            f"{what}: module {module_name!r} has no attribute {attribute!r}",
            hint=(f"did you mean {module_name}:{nearest[0]}? " if nearest else "")
            + "names it defines: "
            + ", ".join(public[:20]),
        ) from exc


def _close_modules(wanted: str, missing: str | None, paths: Sequence[Path]) -> str | None:
    """The module name closest to a misspelt one: among the modules beside the experiment
    (and in a package that did import), the part that failed replaced by its nearest sibling."""
    failed = missing or wanted
    package, _, leaf = failed.rpartition(".")
    try:
        if package:
            parent = sys.modules.get(package)
            where = list(getattr(parent, "__path__", []))
            names = [m.name for m in pkgutil.iter_modules(where)] if where else []
        else:
            names = [m.name for m in pkgutil.iter_modules([str(p) for p in paths])]
    except OSError:
        return None
    close = difflib.get_close_matches(leaf, names, n=1)
    if not close:
        return None
    fixed = f"{package}.{close[0]}" if package else close[0]
    return fixed + wanted[len(failed) :] if wanted.startswith(failed) else fixed


def check_reference_callable(found: Any, what: str) -> None:
    """A factory or inputs reference must name something to call (a function, a class)."""
    if not callable(found):
        raise ConfigError(
            f"{what} is a {type(found).__name__}, not a function",
            hint="point it at a function (or class) that takes one argument",
        )


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
    # Not importlib.util.find_spec: it answers from sys.modules, which may hold a module of
    # the same name imported earlier from another folder.
    spec = _fresh_spec(top, paths)
    if spec is None or spec.origin in (None, "built-in", "frozen"):
        return None
    origin = Path(spec.origin)
    # A package's code identity is the whole package, since the factory may import siblings.
    return origin.parent if origin.name == "__init__.py" else origin
