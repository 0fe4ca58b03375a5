"""Writing the small files a test needs (experiments, targets) into its folder."""

from __future__ import annotations

from pathlib import Path


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path
