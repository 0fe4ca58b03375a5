"""What every benchmark prints about the code it measured: a short hash of each source file.

The figures depend on the code as much as on the machine, so each benchmark's header names
the files it measures; a figure can then be traced to the commit that produced it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "optlab"


def source_hashes(*relative: str) -> str:
    """"generator.py 1a2b3c4d, log.py ..." for paths relative to src/optlab ("?" if absent)."""
    parts = []
    for rel in relative:
        path = SRC / rel
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:8] if path.exists() else "?"
        parts.append(f"{Path(rel).name} {digest}")
    return ", ".join(parts)
