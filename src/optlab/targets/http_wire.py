"""What crosses the wire to a service: the request spec, each body's request bytes (built once
for the run), and the names a failed exchange is counted under.

Errors keep the names aiohttp gave them, so runs before and after optlab's own client read
alike: `ClientConnectorError` (cannot connect), `ServerDisconnectedError` (the connection
closed before a complete response), `ClientOSError` (a socket error on an open connection),
`ClientResponseError` (not a valid HTTP/1.1 response), `HTTP <status>` and `timeout`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from optlab.errors import ConfigError

__all__ = [
    "MESSAGE_CHARS",
    "Body",
    "ClientConnectorError",
    "ClientOSError",
    "ClientResponseError",
    "HttpError",
    "HttpSpec",
    "ServerDisconnectedError",
    "request_bytes",
]

MESSAGE_CHARS = 200
USER_AGENT = "optlab"
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")


@dataclass(frozen=True)
class Body:
    data: bytes
    content_type: str | None


@dataclass(frozen=True)
class HttpSpec:
    """Everything a client needs, secrets resolved: kept in memory, never stored."""

    url: str
    method: str
    headers: tuple[tuple[str, str], ...]
    ok_status: tuple[int, ...] | None
    connect_timeout_s: float
    timeout_s: float
    connections: int


# -- errors -------------------------------------------------------------------------------------


class HttpError(Exception):
    """A response whose status is not a success: counted under `HTTP <status>`."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.kind = f"HTTP {status}"


class ClientConnectorError(Exception):
    """No connection could be opened (refused, unreachable, a name that does not resolve)."""


class ServerDisconnectedError(Exception):
    """The connection closed before a complete response came back."""


class ClientOSError(Exception):
    """A socket error on an open connection (reset, broken pipe)."""


class ClientResponseError(Exception):
    """What came back is not a valid HTTP/1.1 response."""


# -- requests -----------------------------------------------------------------------------------


def request_bytes(spec: HttpSpec, bodies: Sequence[Body]) -> list[bytes]:
    """Each body's whole request (request line, headers, body), built once for the run.

    The headers are the target's, then the body's Content-Type (it wins over a configured
    one, as it did with aiohttp), the Content-Length, and aiohttp's former defaults (Accept,
    Accept-Encoding, User-Agent) where the target does not set them, so a service sees the
    requests it saw before. A header name or value that would break the request is refused.
    """
    parts = urlsplit(spec.url)
    if parts.scheme not in ("http", "https"):
        raise ConfigError(
            f"target.url: {parts.scheme!r} is not http or https", hint="give an http(s) URL"
        )
    host = parts.hostname or "localhost"
    default_port = 443 if parts.scheme == "https" else 80
    authority = f"[{host}]" if ":" in host else host
    if parts.port is not None and parts.port != default_port:
        authority += f":{parts.port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c in target for c in " \r\n"):
        raise ConfigError(f"target.url: the path {target!r} holds a space or a line break",
                          hint="percent-encode it (%20)")  # fmt: skip
    given: dict[str, str] = {}
    for name, value in spec.headers:
        if not _TOKEN.match(name) or "\r" in value or "\n" in value:
            raise ConfigError(
                f"target.headers.{name}: not a valid header (a line break, or a name that is "
                "not an HTTP token)",
                hint="one header per entry, its value on one line",
            )
        given[name.lower()] = f"{name}: {value}\r\n"
    requests = []
    for body in bodies:
        headers = dict(given)
        headers.setdefault("host", f"Host: {authority}\r\n")
        headers.setdefault("accept", "Accept: */*\r\n")
        headers.setdefault("accept-encoding", "Accept-Encoding: gzip, deflate\r\n")
        headers.setdefault("user-agent", f"User-Agent: {USER_AGENT}\r\n")
        headers.pop("content-length", None)
        headers.pop("transfer-encoding", None)
        if body.content_type:
            headers["content-type"] = f"Content-Type: {body.content_type}\r\n"
        if body.data or spec.method in ("POST", "PUT", "PATCH"):
            headers["content-length"] = f"Content-Length: {len(body.data)}\r\n"
        head = f"{spec.method} {target} HTTP/1.1\r\n" + "".join(headers.values()) + "\r\n"
        requests.append(head.encode("latin-1") + body.data)
    return requests
