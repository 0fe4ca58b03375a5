"""Importing optlab's light modules stays light: each check runs in a fresh interpreter (what a
module imports is a clean process's view) and lists which heavy modules it found loaded.

One helper for every such check; add a case here rather than a subprocess in a unit module."""

from __future__ import annotations

import json

from tests.support.proc import run_python

HEAVY = ("torch", "PIL", "sklearn")


def loaded_after(code: str, heavy: tuple[str, ...] = HEAVY) -> list[str]:
    """Run `code` in a fresh interpreter; which of `heavy` it left in sys.modules."""
    probe = (
        f"{code}\nimport json, sys\n"
        f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))\n"
    )
    done = run_python(probe)
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_importing_the_classifier_package_and_its_data_stays_light() -> None:
    code = (
        "import optlab.reference.classifier, optlab.reference.classifier.data\n"
        "import optlab.reference.classifier.accuracy\n"
    )
    assert loaded_after(code) == []


def test_cpu_preprocess_variants_do_not_import_torch() -> None:
    code = (
        "from optlab.reference.classifier.preprocess import make_preprocessor\n"
        "from optlab.reference.classifier.data import render\n"
        "payload = render(0, size=128).jpeg\n"
        "for variant in ('python', 'numpy', 'numpy-pooled'):\n"
        "    make_preprocessor(variant)(payload)\n"
    )
    assert loaded_after(code, ("torch",)) == []
