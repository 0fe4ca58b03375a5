"""The environment of a service optlab starts itself: its interpreter and what is installed there.

optlab's own fingerprint describes the Python running optlab. A `command` target's service may
run in another interpreter altogether (its own venv, its own framework version), and upgrading
that framework moves latency as surely as upgrading torch does. So the service's interpreter is
asked, with the same executable and environment the service will get, for its version and its
installed distributions; a program that is not a Python interpreter is identified by its
resolved path, size and sha256. The result is the fingerprint's `service` section: material,
so runs whose service packages differ are not comparable, and explained like any other
environment difference ("service.packages.fastapi: '0.115.0' -> '0.116.1'").

An `http` target's service is out of sight: its declared `code_version` is all optlab knows,
and reports say that its environment was not checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from optlab.errors import ConfigError
from optlab.targets.registry import find_kind
from optlab.targets.templates import KNOB_REFERENCE, Secrets

__all__ = [
    "QUERY_TIMEOUT_S",
    "describe_service",
    "inspect_service",
    "service_environment",
    "service_rows",
]

# Generous: a cold interpreter on a network filesystem with a large site-packages is slow to
# list its distributions, yet a hung one must not hold `optlab run` hostage.
QUERY_TIMEOUT_S = 20.0
_SHEBANG_BYTES = 512
_HASH_CHUNK = 1 << 20
_PYTHON_NAME = re.compile(r"(python|pypy)(\d+(\.\d+)*)?[a-z]?(\.exe)?", re.IGNORECASE)

# Run by the service's interpreter: what `import` would find there, first on sys.path winning
# (as it does for imports). Names are normalised (PEP 503) so "Zope.Interface" and
# "zope_interface" are one package, and a dotted name does not split a fingerprint path.
_QUERY = r"""
import json, platform, re, sys
from importlib import metadata
packages = {}
for dist in metadata.distributions():
    name = dist.metadata["Name"]
    if name:
        packages.setdefault(re.sub(r"[-_.]+", "-", name).lower(), dist.version)
print(json.dumps({
    "version": platform.python_version(),
    "implementation": platform.python_implementation(),
    "prefix": sys.prefix,
    "packages": dict(sorted(packages.items())),
}))
"""


def _resolve_program(program: str, cwd: Path, environ: Mapping[str, str]) -> Path | None:
    # As the kernel will: a name without a slash is looked up on PATH, a relative path is
    # relative to the service's working directory.
    if "/" in program or os.sep in program:
        path = Path(program).expanduser()
        path = path if path.is_absolute() else cwd / path
        return path if path.is_file() and os.access(path, os.X_OK) else None
    found = shutil.which(program, path=environ.get("PATH", os.defpath))
    return Path(found) if found else None


def _is_python(path: Path) -> bool:
    return bool(_PYTHON_NAME.fullmatch(path.name))


def _shebang(path: Path, cwd: Path, environ: Mapping[str, str]) -> Path | None:
    """The interpreter a `#!` script (a venv's `uvicorn`, `gunicorn`) runs under, if Python."""
    try:
        with path.open("rb") as handle:
            head = handle.read(_SHEBANG_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", "replace").split()
    if words and Path(words[0]).name == "env":
        # `#!/usr/bin/env python3`, `#!/usr/bin/env -S python3 -u`
        words = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
    if not words:
        return None
    interpreter = _resolve_program(words[0], cwd, environ)
    return interpreter if interpreter is not None and _is_python(interpreter) else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _ask_python(interpreter: Path, cwd: Path, environ: Mapping[str, str]) -> dict[str, Any]:
    try:
        done = subprocess.run(
            [str(interpreter), "-c", _QUERY],
            cwd=cwd if cwd.is_dir() else None,
            env=dict(environ),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=QUERY_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"packages": None, "error": f"it did not answer within {QUERY_TIMEOUT_S:g} s"}
    except OSError as exc:
        return {"packages": None, "error": f"it could not be started: {exc.strerror or exc}"}
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict) or not isinstance(answer.get("packages"), dict):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return {"packages": None, "error": f"exit {done.returncode}: {last}"}
    return {
        "version": answer.get("version"),
        "implementation": answer.get("implementation"),
        "prefix": answer.get("prefix"),
        "packages": {str(k): str(v) for k, v in answer["packages"].items()},
        "error": None,
    }


def _service_environ(
    target: Mapping[str, Any], base: Mapping[str, str], secrets: Secrets
) -> dict[str, str]:
    # What the service gets: optlab's environment plus target.env. A value that depends on a
    # knob cannot be known before a step is chosen; PYTHONPATH and PATH rarely do.
    environ = dict(base)
    for name, value in (target.get("env") or {}).items():
        try:
            environ[name] = secrets.fill(str(value), {}, f"target.env.{name}")
        except ConfigError:
            continue
    return environ


def service_environment(
    target: Mapping[str, Any], folder: Path, environ: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """The fingerprint's `service` section for a target as stored: a command target's service
    (`inspect_service`); None for a kind whose service optlab does not start.

    `folder` is the experiment's folder (the service's working directory unless `target.cwd`
    says otherwise). Never raises: what cannot be inspected is recorded as such.
    """
    kind = find_kind(target)
    return kind.service_environment(target, folder, environ) if kind is not None else None


def inspect_service(
    target: Mapping[str, Any], folder: Path, environ: Mapping[str, str] | None = None
) -> dict[str, Any] | None:
    """The interpreter and packages (or the executable) of the service `target.command` starts."""
    if not target.get("command"):
        return None
    base = os.environ if environ is None else environ
    secrets = Secrets(base)
    program = str(target["command"][0])
    cwd = Path(target.get("cwd") or folder)
    cwd = cwd if cwd.is_absolute() else folder / cwd
    section: dict[str, Any] = {"program": program}
    if KNOB_REFERENCE.search(program.replace("{python}", "")):
        section.update(kind="unknown", error="the program is chosen by a knob: not inspected")
        return section
    try:
        filled = secrets.fill(program, {}, "target.command[0]")
    except ConfigError as exc:
        section.update(kind="unknown", error=exc.message)
        return section
    service_environ = _service_environ(target, base, secrets)
    path = _resolve_program(filled, cwd, service_environ)
    if path is None:
        section.update(kind="unknown", error=f"{filled!r} is not an executable file")
        return secrets.redact_any(section)  # type: ignore[no-any-return]
    interpreter = path if _is_python(path) else _shebang(path, cwd, service_environ)
    if interpreter is not None:
        section.update(kind="python", interpreter=str(interpreter))
        if interpreter != path:
            section["script"] = str(path)
        section.update(_ask_python(interpreter, cwd, service_environ))
    else:
        real = path.resolve()
        try:
            section.update(
                kind="executable",
                path=str(real),
                size_bytes=real.stat().st_size,
                sha256=_sha256(real),
            )
        except OSError as exc:
            section.update(kind="executable", path=str(real), error=f"unreadable: {exc}")
        section["declared"] = target.get("code_version")
    return secrets.redact_any(section)  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- describing


def describe_service(service: Mapping[str, Any] | None, target_kind: str | None) -> str | None:
    """One line about the service's environment for reports (`target_kind`: the experiment
    file's `kind`); None where optlab's own environment is the service's (built-in and python
    targets run inside optlab)."""
    if service:
        kind = service.get("kind")
        if kind == "python":
            packages = service.get("packages")
            counted = (
                f"{len(packages)} packages" if isinstance(packages, dict) else "packages unknown"
            )
            text = (
                f"{service.get('implementation') or 'Python'} {service.get('version') or '?'} "
                f"at {service.get('interpreter')}, {counted}"
            )
        elif kind == "executable":
            sha = str(service.get("sha256") or "?")[:12]
            text = f"executable {service.get('path')} (sha256 {sha})"
        else:
            text = f"{service.get('program')}: not inspected"
        error = service.get("error")
        return text + (f" ({error})" if error else "") + "; checked, part of the fingerprint"
    kind = find_kind({"kind": target_kind}) if target_kind else None
    return kind.service_note if kind is not None else None


def service_rows(service: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """`optlab env` rows for the `service` section."""
    if not service:
        return []
    rows = [("service program", str(service.get("program")))]
    kind = service.get("kind")
    if kind == "python":
        rows.append(("service interpreter", str(service.get("interpreter"))))
        if service.get("script"):
            rows.append(("service script", str(service["script"])))
        rows.append(
            (
                "service Python",
                f"{service.get('implementation') or '?'} {service.get('version') or '?'}",
            )
        )
        packages = service.get("packages")
        if isinstance(packages, dict):
            listed = ", ".join(f"{name} {version}" for name, version in packages.items())
            rows.append(("service packages", f"{len(packages)}: {listed}" if packages else "none"))
    elif kind == "executable":
        rows.append(("service executable", str(service.get("path"))))
        size = service.get("size_bytes")
        rows.append(("service size", f"{size:,} bytes" if isinstance(size, int) else "n/a"))
        rows.append(("service sha256", str(service.get("sha256"))))
        rows.append(("service code_version", str(service.get("declared") or "not declared")))
    if service.get("error"):
        rows.append(("service not inspected", str(service["error"])))
    return rows
