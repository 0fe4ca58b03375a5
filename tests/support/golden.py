"""Golden files under tests/golden/: outputs that must not change byte for byte."""

from __future__ import annotations

import os
from pathlib import Path

GOLDEN = Path(__file__).resolve().parents[1] / "golden"


def check_golden(name: str, text: str) -> None:
    """`text` is the golden file `name`; with OPTLAB_UPDATE_GOLDEN=1 it becomes it."""
    path = GOLDEN / name
    if os.environ.get("OPTLAB_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.exists(), f"no golden file {path}: run with OPTLAB_UPDATE_GOLDEN=1"
    assert text == path.read_text(encoding="utf-8"), f"{name} changed: OPTLAB_UPDATE_GOLDEN=1"
