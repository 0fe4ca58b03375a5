"""The environment of a service optlab starts: its interpreter's packages are part of the
fingerprint, so a step measured after the service's venv changed is refused, naming the change.

Venvs are made with `python -m venv --without-pip` (tens of milliseconds); a package is a
`*.dist-info` folder with a METADATA file, which is a distribution as importlib.metadata sees
it. The service is a stdlib HTTP server, so a bare venv's interpreter can run it.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from click.testing import Result

from optlab.env.collect import collect_fingerprint
from optlab.env.compare import compare_fingerprints, material_hash
from optlab.targets.service_env import service_environment
from tests.support.files import write
from tests.support.proc import free_port
from tests.support.protocol import COMPARED

Invoke = Callable[..., Result]

SERVER = """\
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    do_GET = do_POST = answer

    def log_message(self, *args):
        pass


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


def make_venv(folder: Path) -> Path:
    """A bare venv; returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    return folder / "bin" / "python"


def site_packages(venv: Path) -> Path:
    return (
        venv
        / "lib"
        / f"python{sys.version_info.major}.{sys.version_info.minor}"
        / ("site-packages")
    )


def install_fake(venv: Path, name: str, version: str) -> None:
    info = site_packages(venv) / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
    )


def command_target(program: str, *args: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "command", "command": [program, *args], "url": "http://127.0.0.1:1/", **extra}


# -- collection ----------------------------------------------------------------------------------


def test_a_venv_interpreter_is_asked_for_its_own_packages(tmp_path: Path) -> None:
    python = make_venv(tmp_path / "venv")
    install_fake(tmp_path / "venv", "Fast_API.Thing", "0.115.0")
    service = service_environment(command_target(str(python), "server.py"), tmp_path)
    assert service is not None
    assert service["kind"] == "python" and service["interpreter"] == str(python)
    assert service["version"] == ".".join(map(str, sys.version_info[:3]))
    # Only what that venv holds (not optlab's packages), under PEP 503 names.
    assert service["packages"] == {"fast-api-thing": "0.115.0"}
    assert service["error"] is None


def test_a_console_script_is_followed_to_its_interpreter(tmp_path: Path) -> None:
    # A venv's `uvicorn`/`gunicorn` is a `#!` script: the interpreter it names is the service's.
    python = make_venv(tmp_path / "venv")
    install_fake(tmp_path / "venv", "uvicorn", "0.30.1")
    script = tmp_path / "venv" / "bin" / "serve-it"
    script.write_text(f"#!{python}\nprint('hi')\n", encoding="utf-8")
    script.chmod(0o755)
    # Relative to the service's working directory, as the kernel resolves it.
    service = service_environment(command_target("venv/bin/serve-it"), tmp_path)
    assert service is not None and service["kind"] == "python"
    assert service["interpreter"] == str(python) and service["script"] == str(script)
    assert service["packages"] == {"uvicorn": "0.30.1"}


def test_python_placeholder_is_optlabs_interpreter() -> None:
    service = service_environment(command_target("{python}", "-m", "x"), Path.cwd())
    assert service is not None and service["interpreter"] == sys.executable
    assert service["packages"]["optlab"]


def test_what_cannot_be_inspected_says_why_and_leaks_no_secret(tmp_path: Path) -> None:
    by_knob = service_environment(command_target("{knobs.server}"), tmp_path)
    assert by_knob is not None and by_knob["kind"] == "unknown"
    assert "chosen by a knob" in by_knob["error"]
    missing = service_environment(command_target("nope-not-a-program-xyz"), tmp_path)
    assert missing is not None and "not an executable" in missing["error"]
    unset = service_environment(command_target("${OPTLAB_TEST_UNSET_BIN}"), tmp_path, {})
    assert unset is not None and "OPTLAB_TEST_UNSET_BIN" in unset["error"]
    # A program path given as a secret is stored as its reference, never its value.
    python = make_venv(tmp_path / "venv")
    secret = service_environment(
        command_target("${PYBIN}"), tmp_path, {"PYBIN": str(python), "PATH": "/usr/bin"}
    )
    assert secret is not None and secret["kind"] == "python"
    assert str(python) not in json.dumps(secret) and secret["interpreter"] == "${PYBIN}"
    assert service_environment({"kind": "http", "url": "http://x/"}, tmp_path) is None


def test_service_packages_are_material_and_explained_by_name(tmp_path: Path) -> None:
    python = make_venv(tmp_path / "venv")
    install_fake(tmp_path / "venv", "fastapi", "0.115.0")
    fp = collect_fingerprint()
    fp["service"] = service_environment(command_target(str(python)), tmp_path)
    moved = copy.deepcopy(fp)
    moved["service"]["interpreter"] = "/elsewhere/venv/bin/python"  # same packages: comparable
    assert compare_fingerprints(fp, moved).comparable
    assert material_hash(fp) == material_hash(moved)
    upgraded = copy.deepcopy(fp)
    upgraded["service"]["packages"]["fastapi"] = "0.116.1"
    result = compare_fingerprints(fp, upgraded)
    assert result.explain() == "service.packages.fastapi: '0.115.0' -> '0.116.1'"
    assert material_hash(fp) != material_hash(upgraded)
    # A run from before service environments were recorded: one line, not one per package.
    older = copy.deepcopy(fp)
    del older["service"]
    explained = compare_fingerprints(older, fp).explain()
    assert explained.startswith("service: <absent> -> recorded (") and "\n" not in explained


# -- end to end ----------------------------------------------------------------------------------


def test_a_command_targets_venv_gaining_a_package_is_refused_naming_it(
    tmp_path: Path, invoke: Invoke
) -> None:
    python = make_venv(tmp_path / "venv")
    write(tmp_path, "server.py", SERVER)
    port = free_port()
    base = write(
        tmp_path,
        "base.yaml",
        "name: venv-svc\n"
        f"target: {{kind: command, command: ['{python}', server.py, '{port}'], "
        f"url: 'http://127.0.0.1:{port}/', method: POST}}\n"
        "knobs: {workers: 1}\n"
        "workload:\n  load: {mode: closed, concurrency: 1}\n"
        "  inputs: {template: {id: '{i}'}, count: 3}\n",
    )
    step = write(
        tmp_path, "step.yaml", "name: venv-svc-2\nparent: venv-svc\nchange: {workers: 2}\n"
    )

    shown = invoke("env", "--json", str(step))
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["service"]["packages"] == {}

    # The step needs a VALID parent: COMPARED gives the P99 its queries on a busy machine.
    first = invoke("run", str(base), *COMPARED, "--json")
    assert first.exit_code == 0, first.output
    summary = json.loads(first.stdout.strip().splitlines()[-1])
    assert summary["status"] == "FINISHED", summary
    # The process tree as it ran: the venv's interpreter running the server script.
    processes = summary["service"]["processes"]
    assert processes[0]["cmdline"] == [str(python), "server.py", str(port)]

    install_fake(tmp_path / "venv", "fastapi", "0.116.1")
    refused = invoke("run", str(step), *COMPARED)  # the parent's protocol
    assert refused.exit_code == 2, refused.output
    assert "the environment differs from parent run" in refused.stderr
    assert "service.packages.fastapi: <absent> -> '0.116.1'" in refused.stderr

    text = invoke("env", str(step))
    assert "fastapi 0.116.1" in text.stdout and "service interpreter" in text.stdout
    table = invoke("table", "venv-svc", "--format", "markdown")
    assert "**Service environment:** CPython" in table.stdout, table.stdout


def test_the_table_says_an_http_services_environment_was_not_checked(
    tmp_path: Path, invoke: Invoke
) -> None:
    base = write(
        tmp_path,
        "http.yaml",
        "name: far-svc\n"
        "target: {kind: http, url: 'http://127.0.0.1:9/', code_version: v7}\n"
        "knobs: {}\nworkload:\n  load: {mode: closed, concurrency: 1}\n",
    )
    assert invoke("diff", str(base)).exit_code == 0
    for fmt, where in (
        ("rich", "service environment: not checked"),
        ("markdown", "**Service environment:** not checked"),
        ("json", '"service": "not checked'),
    ):
        result = invoke("table", "far-svc", "--format", fmt)
        assert result.exit_code == 0, result.output
        assert where in result.stdout, (fmt, result.stdout)
    shown = invoke("env", str(base))
    assert "not checked" in shown.stdout
