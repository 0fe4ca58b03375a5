"""The HTTP target's pure parts: Server-Timing parsing, command-line templates, secrets and
their redaction, request bodies from files, JSON lines, templates and text (no service)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from optlab.config.models import Workload
from optlab.errors import ConfigError
from optlab.targets.http import http_bodies
from optlab.targets.server_timing import parse_server_timing
from optlab.targets.templates import Secrets, render


def test_server_timing_entries_become_stages_in_ns() -> None:
    stages = parse_server_timing(
        [
            'queue;dur=1.5, infer;desc="a, b";dur=2, cache;desc=miss',
            "total;dur=4.25, infer;dur=0.5, db;dur=1e-1",
        ]
    )
    # No dur: skipped; a repeated name adds up; a server's `total` is not the harness's total.
    assert stages == {
        "queue": 1_500_000,
        "infer": 2_500_000,
        "server_total": 4_250_000,
        "db": 100_000,
    }
    assert parse_server_timing(["garbage;;;, ;dur=3"]) == {}


def test_templates_render_knobs_and_groups() -> None:
    knobs = {"engine": "onnxruntime", "threads": 2, "batching": {"mode": "dynamic", "n": 8}}
    assert render("--engine={knobs.engine} -t {knobs.threads}", knobs, "f") == (
        "--engine=onnxruntime -t 2"
    )
    assert render("{knobs.batching}", knobs, "f") == '{"mode":"dynamic","n":8}'
    assert render("{knobs.batching.n} {python}", knobs, "f") == f"8 {sys.executable}"
    assert render("{not a template} {knobs}", knobs, "f") == "{not a template} {knobs}"
    with pytest.raises(ConfigError) as info:
        render("{knobs.batching.max_wait_ms}", knobs, "target.command[3]")
    assert "target.command[3]" in info.value.message and "max_wait_ms" in info.value.message


def test_secrets_resolve_from_the_environment_and_redact_everywhere() -> None:
    secrets = Secrets({"TOKEN": "s3cr3t-value", "HOST": "api.internal"})
    assert secrets.resolve("Bearer ${TOKEN}", "h") == "Bearer s3cr3t-value"
    assert secrets.resolve("http://${HOST}/x", "u") == "http://api.internal/x"
    assert secrets.redact("401 for s3cr3t-value at api.internal") == "401 for ${TOKEN} at ${HOST}"
    assert secrets.redact_any({"a": ["s3cr3t-value"]}) == {"a": ["${TOKEN}"]}
    with pytest.raises(ConfigError) as info:
        secrets.resolve("${MISSING_ONE}", "target.headers.Authorization")
    assert "MISSING_ONE is not set" in info.value.message
    assert "target.headers.Authorization" in info.value.message


def test_bodies_from_files_jsonl_template_text(tmp_path: Path) -> None:
    load = {"mode": "closed", "concurrency": 1}
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "a.json").write_bytes(b'{"a": 1}')
    (tmp_path / "p" / "b.bin").write_bytes(b"\x00\x01")
    (tmp_path / "r.jsonl").write_text('{"x": 1}\n\n{"x": 2}\n')

    def bodies(inputs: dict[str, object]) -> list[tuple[bytes, str | None]]:
        workload = Workload.model_validate({"load": load, "inputs": inputs})
        return [(b.data, b.content_type) for b in http_bodies(workload, tmp_path)]

    assert bodies({"files": "p/*"}) == [
        (b'{"a": 1}', "application/json"),
        (b"\x00\x01", "application/octet-stream"),
    ]
    assert bodies({"jsonl": "r.jsonl"}) == [
        (b'{"x": 1}', "application/json"),
        (b'{"x": 2}', "application/json"),
    ]
    assert bodies({"template": {"id": "{i}", "q": "n{i}"}, "count": 2}) == [
        (b'{"id":0,"q":"n0"}', "application/json"),
        (b'{"id":1,"q":"n1"}', "application/json"),
    ]
    assert bodies({"text": "hi", "content_type": "text/x"}) == [(b"hi", "text/x")]
    assert bodies({}) == [(b"", None)]
