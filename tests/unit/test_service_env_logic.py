"""A service's environment without asking an interpreter: a native program identified by its
bytes, and in-process targets having no service note (no process is started)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from optlab.targets.service_env import describe_service, service_environment


def command_target(program: str, *args: str, **extra: Any) -> dict[str, Any]:
    return {"kind": "command", "command": [program, *args], "url": "http://127.0.0.1:1/", **extra}


def test_a_native_program_is_identified_by_its_bytes(tmp_path: Path) -> None:
    program = tmp_path / "server"
    program.write_bytes(b"\x7fELF pretend binary")
    program.chmod(0o755)
    service = service_environment(command_target("./server", code_version="v1.4.2"), tmp_path)
    assert service == {
        "program": "./server",
        "kind": "executable",
        "path": str(program),
        "size_bytes": len(b"\x7fELF pretend binary"),
        "sha256": hashlib.sha256(b"\x7fELF pretend binary").hexdigest(),
        "declared": "v1.4.2",
    }
    assert describe_service(service, "command") is not None


@pytest.mark.parametrize("kind", ["builtin", "python"])
def test_in_process_targets_have_no_service_note(kind: str) -> None:
    assert describe_service(None, kind) is None
