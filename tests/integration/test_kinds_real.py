"""The target kinds' registry in a fresh process: the reference workload is imported only when
a kind that builds it is asked for (the unit lane's tests/unit/test_kinds.py shares one
process, where another test may have imported it already)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_the_reference_workload_loads_only_with_a_kind_that_builds_it() -> None:
    script = """
import json, sys
from optlab.targets.registry import kind_named
from optlab.targets.resolve import resolve_baseline
for name in ("python", "http", "command"):
    kind_named(name)
before = sorted(m for m in sys.modules if m.startswith("optlab.reference"))
model = kind_named("synthetic").knob_model(None, [])
after = sorted(m for m in sys.modules if m.startswith("optlab.reference"))
print(json.dumps([before, after, model.__name__]))
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    before, after, model = json.loads(done.stdout.strip().splitlines()[-1])
    assert before == []
    assert "optlab.reference.synthetic" in after and model == "SyntheticKnobs"
