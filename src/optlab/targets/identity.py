"""The code identity of a target: what changes when the code under test changes.

It is scoped to the target itself (its module sources, its command's files, the
built-in pipeline's files), so that committing unrelated work or adding an
experiment file never makes earlier runs incomparable, while editing the code
under test does. Each kind says what its code is (`TargetKind.identity`); the
hashing is here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from optlab._version import __version__
from optlab.targets.registry import find_kind

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


def reference_identity() -> dict[str, Any]:
    """The code of the reference workload, which the builtin and synthetic targets run and
    `optlab serve` serves."""
    # The built-in targets' code is the pipeline (with its weights and data rendering), the
    # synthetic service, and the inference engines the pipeline runs.
    package = Path(__file__).resolve().parents[1]  # src/optlab
    parts = [
        package / "reference" / "classifier",
        package / "reference" / "pipeline.py",
        package / "reference" / "synthetic.py",
        package / "reference" / "engines",
    ]
    files = [p for part in parts if part.is_dir() for p in _tree(part, None)]
    files += [part for part in parts if part.is_file()]
    return {
        "kind": "builtin",
        "optlab": __version__,
        "files_sha256": hash_files(files, package) if files else None,
    }


def code_identity(target: dict[str, Any], paths: Sequence[Path]) -> dict[str, Any]:
    """A JSON-able identity of the target's code; equal identities mean the same code."""
    kind = find_kind(target)
    if kind is None:
        # A kind this optlab does not know: only what the user declares can identify it.
        return {"kind": target.get("kind"), "declared": target.get("code_version")}
    return kind.identity(target, paths)
