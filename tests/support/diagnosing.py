"""Real runs for the `optlab diagnose` integration tests: a python target made GIL-bound,
serialised on a lock, failing or asleep by its knobs; measured under the quick protocol; and
diagnosed through the CLI, its `--json` checked against docs/schemas/diagnose.schema.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import Result

from tests.support.files import write
from tests.support.schemas import problems

__all__ = ["TARGET", "Invoke", "diagnosed", "experiment", "last_json", "run", "single_server"]

Invoke = Callable[..., Result]

TARGET = """\
import threading
import time

from optlab.metrics.stages import stage

LOCK = threading.Lock()


class Target:
    def __init__(self, knobs):
        self.k = knobs

    def __call__(self, request):
        k = self.k
        with stage("prepare"):
            time.sleep(0.0002)
        with stage("work"):
            if k["mode"] == "gil":  # pure Python: holds the GIL
                total = 0
                for i in range(k["loops"]):
                    total += i
            elif k["mode"] == "lock":  # one request at a time, the CPU idle
                with LOCK:
                    time.sleep(k["hold_ms"] / 1000)
            elif k["mode"] == "fail" and request % 2:
                raise ValueError("every other request fails")
            else:
                time.sleep(k["sleep_ms"] / 1000)
        return request


def build(knobs):
    return Target(knobs)


def inputs(workload):
    return list(range(64))
"""


def experiment(
    folder: Path, name: str, knobs: str, load: str = "{mode: closed, concurrency: 8}"
) -> Path:
    """The file of a python target (TARGET, written beside it) with these knobs and load."""
    write(folder, "faulty.py", TARGET)
    return write(
        folder,
        f"{name}.yaml",
        f"name: {name}\n"
        "target: {kind: python, factory: 'faulty:build', inputs: 'faulty:inputs'}\n"
        f"knobs: {knobs}\nworkload: {{load: {load}}}\nprotocol: {{name: quick}}\n",
    )


def single_server(folder: Path, name: str, ms: float) -> Path:
    """A synthetic single server with a fixed `ms` service time, offered 50/s."""
    return write(
        folder,
        f"{name}.yaml",
        f"name: {name}\n"
        "target: {kind: builtin, name: synthetic}\n"
        f"knobs: {{distribution: fixed, service_ms: {ms}, single_server: true}}\n"
        "workload: {load: {mode: open, rate: 50, arrival: constant}}\n"
        "protocol: {name: quick}\n",
    )


def run(invoke: Invoke, path: Path, *extra: str) -> None:
    """`optlab run PATH --quick --duration 3 --warmup 0.5 --allow-invalid EXTRA`."""
    quick = ("--quick", "--duration", "3", "--warmup", "0.5", "--allow-invalid")
    result = invoke("run", str(path), *quick, *extra)
    assert result.exit_code == 0, result.output


def last_json(result: Result) -> dict[str, Any]:
    """The JSON object a `--json` command printed on its last stdout line."""
    document: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return document


def diagnosed(invoke: Invoke, *args: str) -> dict[str, Any]:
    """`optlab diagnose ARGS --json`: exit 0 and a document its schema accepts."""
    result = invoke("diagnose", *args, "--json")
    assert result.exit_code == 0, result.output
    document = last_json(result)
    assert not problems("diagnose", document), problems("diagnose", document)
    return document
