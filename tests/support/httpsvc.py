"""HTTP targets for tests: the toy service (tests/services/toy_service.py) on a free port, and
experiment files for an http target (a service already up) or a command target (optlab starts
the toy service itself, with the run's knobs on its command line)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from click.testing import Result

from tests.support.files import write
from tests.support.proc import free_port, service

TOY = Path(__file__).resolve().parents[1] / "services" / "toy_service.py"


@contextmanager
def toy_service(*args: str) -> Iterator[int]:
    """The toy service on a free port, yielded once it listens, killed on the way out (a
    graceful stop would wait for requests still asleep in it)."""
    port = free_port()
    with service([sys.executable, TOY, "--port", str(port), *args], port):
        yield port


def http_experiment(folder: Path, name: str, url: str, load: str, extra: str = "") -> Path:
    """An http target at `url` (POSTed a small JSON template), `load` as the workload's."""
    return write(
        folder,
        f"{name}.yaml",
        f"name: {name}\n"
        f"target: {{kind: http, url: '{url}', method: POST, code_version: toy-1{extra}}}\n"
        "knobs: {}\n"
        f"workload:\n  load: {load}\n  inputs: {{template: {{id: '{{i}}'}}, count: 5}}\n",
    )


def command_experiment(
    folder: Path,
    name: str,
    port: int,
    *,
    args: str = "'--delay-ms', '{knobs.delay_ms}'",
    extra: str = "",
    load: str = "{mode: closed, concurrency: 4}",
    url_path: str = "/",
    stop_grace_s: float = 5,
) -> Path:
    """A command target: the toy service started by optlab on `port` (its pid written to
    `<folder>/<name>.pid`), `args` appended to its command line, knob `delay_ms: 2`."""
    return write(
        folder,
        f"{name}.yaml",
        f"name: {name}\n"
        "target:\n"
        "  kind: command\n"
        f"  command: ['{{python}}', '{TOY}', '--port', '{port}', '--pid-file', "
        f"'{folder / (name + '.pid')}', {args}]\n"
        f"  url: 'http://127.0.0.1:{port}{url_path}'\n"
        f"  health_url: 'http://127.0.0.1:{port}/health'\n"
        f"  stop_grace_s: {stop_grace_s:g}\n"
        f"{extra}"
        "knobs: {delay_ms: 2}\n"
        f"workload:\n  load: {load}\n  inputs: {{text: hello}}\n",
    )


def summary_of(result: Result) -> dict[str, object]:
    """The `run --json` summary: the last line a CLI run printed."""
    data: dict[str, object] = json.loads(result.stdout.strip().splitlines()[-1])
    return data
