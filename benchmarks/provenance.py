"""What every benchmark prints about the code it measured: a short hash of each source file.

The figures depend on the code as much as on the machine, so each benchmark's header names
the files it measures; a figure can then be traced to the commit that produced it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "optlab"


def source_hashes(*relative: str) -> str:
    """ "generator.py 1a2b3c4d, log.py ..." for paths relative to src/optlab. A path that is not
    there is an error, not a "?": a moved module would otherwise drop out of the header unseen."""
    parts = []
    for rel in relative:
        path = SRC / rel
        if not path.is_file():
            raise FileNotFoundError(f"benchmarks name src/optlab/{rel}, which does not exist")
        parts.append(f"{Path(rel).name} {hashlib.sha256(path.read_bytes()).hexdigest()[:8]}")
    return ", ".join(parts)
