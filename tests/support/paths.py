"""Paths in the repository the tests read."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
FIXTURES = TESTS / "fixtures"
SERVICES = TESTS / "services"
SYNTHETIC = REPO / "experiments" / "examples" / "synthetic"
