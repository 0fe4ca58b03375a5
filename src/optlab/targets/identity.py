"""The code identity of a target: what changes when the code under test changes.

It is scoped to the target itself (its module sources, its command's files, the
built-in pipeline's files), so that committing unrelated work or adding an
experiment file never makes earlier runs incomparable, while editing the code
under test does.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import optlab
from optlab.targets.references import module_origin

_SKIP_DIRS = {"__pycache__", ".git", ".ipynb_checkpoints"}
_CODE_SUFFIXES = {".py"}


def hash_files(paths: Iterable[Path], root: Path | None = None) -> str:
    """sha256 over (relative name, bytes) of each file, in a stable order."""
    digest = hashlib.sha256()
    for path in sorted(set(paths)):
        name = path.relative_to(root) if root is not None else Path(path.name)
        digest.update(str(name).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def _tree(folder: Path, suffixes: set[str] | None) -> list[Path]:
    return [
        p
        for p in folder.rglob("*")
        if p.is_file()
        and not (_SKIP_DIRS & set(p.relative_to(folder).parts))
        and (suffixes is None or p.suffix in suffixes)
    ]


def source_hash(origin: Path) -> str:
    if origin.is_dir():
        return hash_files(_tree(origin, _CODE_SUFFIXES), origin)
    return hash_files([origin])


def _builtin_identity() -> dict[str, Any]:
    # The built-in targets' code is the pipeline (with its weights and data rendering), the
    # synthetic service, and the inference engines the pipeline runs.
    package = Path(optlab.__file__).parent
    parts = [
        package / "reference" / "classifier",
        package / "reference" / "synthetic.py",
        package / "reference" / "engines",
    ]
    files = [p for part in parts if part.is_dir() for p in _tree(part, None)]
    files += [part for part in parts if part.is_file()]
    return {
        "kind": "builtin",
        "optlab": optlab.__version__,
        "files_sha256": hash_files(files, package) if files else None,
    }


def _python_identity(target: dict[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
    modules: dict[str, str | None] = {}
    for field in ("factory", "inputs", "knobs_model"):
        reference = target.get(field)
        if reference:
            module = reference.split(":")[0]
            origin = module_origin(module, paths)
            modules[module] = source_hash(origin) if origin is not None else None
    return {"kind": "python", "declared": target.get("code_version"), "modules": modules}


WRITTEN_BY_SERVICES = (".pid", ".log", ".lock", ".sock", ".out", ".err", ".tmp")


def _command_identity(target: dict[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
    files: dict[str, str] = {}
    command = list(target.get("command", []))
    if command:
        program = sys.executable if command[0] == "{python}" else command[0]
        executable = shutil.which(program)
        if executable:
            files[command[0]] = hash_files([Path(executable)])
    if _runs_optlab(command):
        # `optlab serve`: the service's code is this optlab's built-in pipeline.
        return {
            "kind": "command",
            "declared": target.get("code_version"),
            "files": files,
            "optlab": _builtin_identity(),
        }
    for arg in command[1:]:
        # Arguments that name files next to the experiment (a server script, a model) are code;
        # files the service writes (its pid file, its log) are not, and come and go.
        if Path(arg).suffix.lower() in WRITTEN_BY_SERVICES:
            continue
        for base in paths:
            candidate = base / arg
            if candidate.is_file():
                files[arg] = hash_files([candidate])
                break
    return {"kind": "command", "declared": target.get("code_version"), "files": files}


def _runs_optlab(command: list[str]) -> bool:
    if not command:
        return False
    if Path(command[0]).name == "optlab":
        return True
    return any(a == "-m" and b == "optlab" for a, b in zip(command, command[1:], strict=False))


def code_identity(target: dict[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
    """A JSON-able identity of the target's code; equal identities mean the same code."""
    kind = target.get("kind")
    if kind == "builtin":
        return _builtin_identity()
    if kind == "python":
        return _python_identity(target, paths)
    if kind == "command":
        return _command_identity(target, paths)
    # An HTTP service's code is out of sight; only what the user declares can identify it.
    return {"kind": kind, "declared": target.get("code_version")}
