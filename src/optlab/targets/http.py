"""Measuring a service over HTTP: request bodies, the client's picklable recipe, the side
requests (metrics, accuracy), how a failed request is named, and the check that something
listens before a run.

The client (`optlab.targets.http_client`) is asynchronous (one event loop keeps thousands of
requests in flight from one thread, where a thread per request would be bound by the GIL), and
is built from a plain, picklable `HttpSpec`, so each load-generator process can build its own.
"""

from __future__ import annotations

import asyncio
import glob
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from optlab.config.models import (
    HttpInputs,
    HttpTarget,
    OpenAITarget,
    Workload,
)
from optlab.config.modes import mode_of
from optlab.errors import ConfigError, TargetError
from optlab.targets.http_client import HttpClient, StreamSpec
from optlab.targets.http_wire import MESSAGE_CHARS, Body, HttpError, HttpSpec
from optlab.targets.registry import reference_images
from optlab.targets.sse import StreamError
from optlab.targets.templates import NetworkTarget, Secrets

__all__ = [
    "HttpRecipe",
    "check_input_files",
    "check_listening",
    "classify",
    "fetch_bytes",
    "fetch_json",
    "http_bodies",
    "http_spec",
]


def http_spec(
    target: NetworkTarget,
    workload: Workload,
    secrets: Secrets,
    knobs: dict[str, Any],
) -> HttpSpec:
    url = secrets.fill(target.url, knobs, "target.url")
    headers = tuple(
        (name, secrets.fill(value, knobs, f"target.headers.{name}"))
        for name, value in target.headers.items()
    )
    return HttpSpec(
        url=url,
        method=target.method,
        headers=headers,
        ok_status=tuple(target.ok_status) if target.ok_status is not None else None,
        connect_timeout_s=target.connect_timeout_ms / 1000,
        timeout_s=workload.timeout_ms / 1000,
        connections=mode_of(workload.load).in_flight_limit(workload.load),
    )


@dataclass(frozen=True)
class HttpRecipe:
    """What a load-generator process needs to build its own client: picklable."""

    spec: HttpSpec
    bodies: tuple[Body, ...]
    stream: StreamSpec | None = None  # a streaming LLM target's responses

    def build(self) -> HttpClient:
        return HttpClient(self.spec, self.bodies, self.stream)


# -- bodies -------------------------------------------------------------------------------------


def http_inputs(workload: Workload, where: str = "workload.inputs") -> HttpInputs:
    try:
        return HttpInputs.model_validate(workload.inputs or {})
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ConfigError(
            f"{where}.{'.'.join(map(str, first['loc']))}: {first['msg']}",
            hint="an http or command target takes one of files, jsonl, template, text or "
            "images (see HttpInputs)",
        ) from exc


def _fill(template: Any, i: int) -> Any:
    if isinstance(template, str):
        return i if template == "{i}" else template.replace("{i}", str(i))
    if isinstance(template, dict):
        return {k: _fill(v, i) for k, v in template.items()}
    if isinstance(template, list):
        return [_fill(v, i) for v in template]
    return template


def _glob_files(pattern: str, folder: Path) -> list[Path]:
    base = Path(pattern) if Path(pattern).is_absolute() else folder / pattern
    found = sorted(Path(p) for p in glob.glob(str(base), recursive=True))
    files = [p for p in found if p.is_file()]
    if not files:
        raise ConfigError(
            f"workload.inputs.files: {pattern!r} matches no file under {folder}",
            hint="the glob is relative to the experiment file's folder; each file is one body",
        )
    return files


def check_input_files(inputs: dict[str, Any], folder: Path) -> None:
    """At load: the payload files a workload names exist (read when the run starts)."""
    if inputs.get("files"):
        _glob_files(inputs["files"], folder)
    if inputs.get("jsonl"):
        path = Path(inputs["jsonl"])
        path = path if path.is_absolute() else folder / path
        if not path.is_file():
            raise ConfigError(
                f"workload.inputs.jsonl: {path} is not a file",
                hint="the path is relative to the experiment file's folder",
            )


def _content_type(path: Path) -> str:
    import mimetypes

    return mimetypes.guess_type(path.name)[0] or "application/octet-stream"


def http_bodies(workload: Workload, folder: Path) -> list[Body]:
    """The request bodies `workload.inputs` describes; files are read relative to `folder`."""
    spec = http_inputs(workload)
    kind = spec.content_type
    if spec.files:
        return [
            Body(p.read_bytes(), kind or _content_type(p)) for p in _glob_files(spec.files, folder)
        ]
    if spec.jsonl:
        path = Path(spec.jsonl) if Path(spec.jsonl).is_absolute() else folder / spec.jsonl
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(
                f"workload.inputs.jsonl: cannot read {path}: {exc.strerror or exc}",
                hint="the path is relative to the experiment file's folder",
            ) from None
        bodies = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(
                    f"{path}:{number}: not JSON ({exc.msg})",
                    hint="workload.inputs.jsonl holds one JSON body per line",
                ) from None
            bodies.append(Body(line.strip().encode(), kind or "application/json"))
        if not bodies:
            raise ConfigError(f"workload.inputs.jsonl: {path} holds no body", hint="one per line")
        return bodies
    if spec.template is not None:
        return [
            Body(
                json.dumps(_fill(spec.template, i), separators=(",", ":")).encode(),
                kind or "application/json",
            )
            for i in range(spec.count)
        ]
    if spec.text is not None:
        return [Body(spec.text.encode(), kind or "text/plain; charset=utf-8")]
    if spec.images is not None:
        images = Workload.model_validate(
            {"load": workload.load.model_dump(), "seed": workload.seed, "inputs": spec.images}
        )
        return [Body(jpeg, kind or "image/jpeg") for jpeg in reference_images(images)]
    return [Body(b"", None)]


def fetch_bytes(
    method: str,
    url: str,
    field: str,
    secrets: Secrets,
    *,
    timeout_s: float = 30.0,
    headers: dict[str, str] | None = None,
    limit: int | None = None,
) -> bytes:
    """One side request to the service (its metrics, accuracy): its body (at most `limit`
    bytes read), or a TargetError naming the field (the URL redacted)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, method=method, data=b"" if method == "POST" else None, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return bytes(response.read() if limit is None else response.read(limit))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise TargetError(
            secrets.redact(f"{field}: {method} {url} failed: {exc}"),
            hint=f"the service must answer {field} with 2xx",
        ) from None


def fetch_json(
    method: str,
    url: str,
    field: str,
    secrets: Secrets,
    *,
    timeout_s: float = 30.0,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One side request to the service (its metrics, accuracy): a JSON object, or a
    TargetError naming the field (the URL redacted)."""
    payload = fetch_bytes(method, url, field, secrets, timeout_s=timeout_s, headers=headers)
    if method == "POST" and not payload.strip():
        return {}  # a reset answers 204 No Content
    try:
        found = json.loads(payload)
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise TargetError(
            secrets.redact(f"{field}: {url} did not answer with a JSON object"),
            hint="answer with a JSON object (Content-Type application/json)",
        )
    return found


# -- errors -------------------------------------------------------------------------------------


def classify(exc: BaseException) -> tuple[str, str]:
    """(error type, example message) of a failed request, as the run's error table shows it."""
    if isinstance(exc, HttpError | StreamError):
        return exc.kind, str(exc)[:MESSAGE_CHARS]
    if isinstance(exc, asyncio.TimeoutError | TimeoutError):
        return "timeout", "no complete response within workload.timeout_ms"
    try:
        message = str(exc)[:MESSAGE_CHARS]
    except Exception:
        message = f"<{type(exc).__name__} with an unprintable message>"
    return type(exc).__name__, message


def check_listening(target: HttpTarget | OpenAITarget, knobs: dict[str, Any], where: str) -> None:
    """Before a run is created: something accepts connections at an `http` target's URL.

    Without it a service that is not up is measured for the whole protocol as a wall of
    connection errors. A `command` target starts its own service and waits for its health.
    """
    import socket
    from urllib.parse import urlsplit

    secrets = Secrets()
    url = secrets.fill(target.url, knobs, "target.url")
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((host, port), timeout=target.connect_timeout_ms / 1000):
            return
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"{where}: nothing is listening at {secrets.redact(url)} "
            f"(connecting to {host}:{port}: {reason})",
            hint="start the service first (or give it as `kind: command` so optlab starts "
            "it), and check target.url",
        ) from exc
